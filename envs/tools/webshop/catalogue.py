"""The WebShop env's products and goals: a seeded generated catalogue, and a loader for WebShop's
own JSON files.

WebShop (Yao et al., 2022) scraped 1.18M Amazon products and wrote instructions for them; RAGEN
reads that data (``items_shuffle*.json``, ``items_ins_v2*.json``, ``items_human_ins.json``)
downloaded from Google Drive. Nothing can be downloaded here, so :func:`generate_catalogue` builds a
seeded stand-in with the same structure: products in five WebShop-like categories (beauty,
electronics, fashion, grocery, furniture), each of a product type (the noun phrase the type reward
compares), with attributes (the phrases the attribute reward compares), option groups (colour, size,
flavour, ...: what the option reward compares) and a price; one goal per product, whose instruction
names the type, one or two of its attributes, one value of each of its option groups and a price
bound, in the form of WebShop's synthetic instructions (``"i need a shampoo that is sulfate free
with size: 12 fl oz, and price lower than 30.00 dollars"``). Many products share a type, attributes
and option values, so other products than the goal's can earn the full reward, as in WebShop. The
categories, product types, attributes, option values and the words of brands, titles and
instructions are the tables of :mod:`envs.tools.webshop.vocabulary`.

:func:`load_catalogue` reads a directory holding WebShop's files (the files RAGEN's ``setup_webshop.sh`` puts in
``data/``):

* ``items_shuffle*.json`` (required): a JSON list of products, each with ``asin``, ``name`` (the
  title), ``product_category`` (levels joined by ``›``), ``query`` (the search query the product was
  scraped for), ``pricing`` (``"$12.99"``, a range ``"$10.00 - $20.00"`` or a list of numbers),
  ``full_description``, ``small_description`` (the bullet points: a list of strings or one string),
  ``customization_options`` (``{"color": [{"value": "Black", "image": ...}, ...], ...}``), optional
  ``average_rating`` and ``category``.
* ``items_ins_v2*.json`` (optional): ``{asin: {"attributes": [...], "instruction": str,
  "instruction_attributes": [...]}}``: the products' attributes and synthetic instructions.
* ``items_human_ins*.json`` (optional): ``{asin: [{"instruction": str, "instruction_attributes":
  [...], "instruction_options": [...]}, ...]}``: human-written goals.

Goals are the human goals when that file exists (those without attributes skipped, as WebShop does),
else synthetic goals built like WebShop's from the products' ``instruction`` text and WebShop's
option clause (``" with color: black, and size: large"``). A goal whose instruction does not state
``price lower than X dollars`` gets a bound drawn as WebShop does (the larger of two of the first
four multiples of 10 above the product's price; no limit when fewer than two are left) and the
clause appended. Departures: WebShop makes one synthetic goal per combination of option values
(weighted when sampled); here each product gets one goal, with one value drawn per option group; a
price range is read as its lower bound (WebShop draws a price uniformly in the range at load). As in
WebShop, a product without a readable price costs 100.0 and option values are lower-cased with ``/``
read as `` | ``.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any

from envs.base import bounded_int

# the module, not its names: the warm-start code fingerprint follows imported modules and functions,
# not data, so importing only the tables would leave them out of it
from envs.tools.webshop import vocabulary

MAX_FIELD_CHARS = 1000  # a rendered text field (description, bullet point) is cut here
MAX_BULLETS = 20  # bullet points kept per product
DEFAULT_PRICE = 100.0  # WebShop's price of a product whose pricing cannot be read
_PRICE = re.compile(r"\$?\s*(\d+(?:,\d{3})*(?:\.\d+)?)")
PRICE_CLAUSE = re.compile(r",?\s*and price lower than\s+(\d+(?:\.\d+)?)\s+dollars", re.IGNORECASE)


@dataclass(frozen=True)
class Product:
    """One product, in the fields WebShop's pages and reward read.

    ``options`` maps an option group (``"color"``) to its values in display order (lower case);
    ``attributes`` are the attribute phrases of WebShop's ``items_ins_v2`` file; ``query`` and
    ``product_category`` feed the type reward's match flags."""

    asin: str
    title: str
    category: str
    product_category: str
    query: str
    price: float
    description: str
    bullet_points: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    attributes: tuple[str, ...]
    rating: str = "N.A."

    def option_group(self, value: str) -> str | None:
        """The option group that offers ``value`` (the first one when several do), None when none
        does."""
        for name, values in self.options:
            if value in values:
                return name
        return None

    def search_text(self) -> str:
        """The text BM25 indexes: title, bullet points, description and the scrape query (not the
        option values: a colour or size in a search matches nothing, which the rendered tips tell
        the agent)."""
        return " ".join((self.title, " ".join(self.bullet_points), self.description, self.query))


@dataclass(frozen=True)
class Goal:
    """One instruction and what the reward compares the bought product with (WebShop's goal dict).

    ``options`` are the wanted option values (WebShop's ``goal_options``); ``option_groups`` names
    the group of each on the goal's own product (the expert uses it; the reward does not);
    ``price_upper`` None means no price constraint."""

    asin: str
    instruction: str
    name: str
    query: str
    product_category: str
    attributes: tuple[str, ...]
    options: tuple[str, ...]
    option_groups: tuple[str | None, ...]
    price_upper: float | None


@dataclass(frozen=True)
class Catalogue:
    products: tuple[Product, ...]
    goals: tuple[Goal, ...]
    by_asin: dict[str, Product] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_asin", {p.asin.lower(): p for p in self.products})

    def documents(self) -> tuple[tuple[str, str], ...]:
        """``(asin, text)`` pairs for the BM25 index."""
        return tuple((p.asin, p.search_text()) for p in self.products)

    def characters(self) -> str:
        """Every character a page of this catalogue can show (for the observation space)."""
        chars: set[str] = set()
        for p in self.products:
            chars.update(p.asin, p.title, p.description, p.rating, *p.bullet_points)
            for name, values in p.options:
                chars.update(name, *values)
        for g in self.goals:
            chars.update(g.instruction)
        return "".join(sorted(chars))


# --------------------------------------------------------------------------------------------------
# The generated catalogue (its words: envs/tools/webshop/vocabulary.py)
# --------------------------------------------------------------------------------------------------

PRICE_RANGE = tuple(10.0 * k for k in range(1, 100))  # WebShop's price bounds: 10, 20, ..., 990
# WebShop's bound when fewer than two candidates remain (no clause in the text)
NO_PRICE_LIMIT = 1_000_000.0


def price_upper_for(price: float, rng: random.Random) -> tuple[float, str]:
    """WebShop's price bound and its clause: the larger of two of the first four bounds above
    ``price`` (``", and price lower than 40.00 dollars"``), or no limit and no clause when fewer
    than two are left."""
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) < 2:
        return NO_PRICE_LIMIT, ""
    upper = max(rng.sample(candidates, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def option_text(chosen: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> str:
    """WebShop's option clause: ``" with color: black, and size: large"`` (empty without
    options)."""
    return " with " + ", and ".join(f"{name}: {value}" for name, value in chosen) if chosen else ""


def _brand(rng: random.Random) -> str:
    syllables = vocabulary.BRAND_SYLLABLES
    parts = [syllables[rng.randrange(len(syllables))] for _ in range(rng.randrange(2, 4))]
    return "".join(parts).capitalize()


def _titled(words: str) -> str:
    return " ".join(w if w[:1].isdigit() else w[:1].upper() + w[1:] for w in words.split())


def _make_product(index: int, category: str, rng: random.Random) -> Product:
    top, attr_pool, types = vocabulary.CATEGORIES[category]
    kind, sub, groups, (low, high) = types[rng.randrange(len(types))]
    attributes = tuple(
        attr_pool[i] for i in sorted(rng.sample(range(len(attr_pool)), rng.randrange(2, 5)))
    )
    shown = [
        attributes[i] for i in sorted(rng.sample(range(len(attributes)), min(2, len(attributes))))
    ]
    brand = _brand(rng)
    tail = vocabulary.TITLE_TAILS[rng.randrange(len(vocabulary.TITLE_TAILS))]
    title = " ".join(x for x in (brand, _titled(" ".join(shown)), _titled(kind), tail) if x)
    options = []
    for name, values in groups.items():
        keep = sorted(rng.sample(range(len(values)), rng.randrange(2, len(values) + 1)))
        options.append((name, tuple(values[i] for i in keep)))
    price = round(rng.uniform(low, high)) - 0.01
    rating = f"{rng.randrange(30, 51) / 10:.1f}"
    bullets = tuple(f"{a.upper()}: this {kind} is {a}." for a in attributes)
    description = (
        f"The {brand} {kind} is {', '.join(attributes[:-1])} and {attributes[-1]}. "
        f"Available in {len(options[0][1])} {options[0][0]} choices."
    )
    return Product(
        asin=f"B{index:09d}",
        title=title,
        category=category,
        product_category=f"{top} › {sub} › {_titled(kind)}",
        query=kind,
        price=round(price, 2),
        description=description,
        bullet_points=bullets,
        options=tuple(options),
        attributes=attributes,
        rating=rating,
    )


def _make_goal(product: Product, rng: random.Random) -> Goal:
    k = min(len(product.attributes), rng.randrange(1, 3))
    wanted = tuple(
        product.attributes[i] for i in sorted(rng.sample(range(len(product.attributes)), k))
    )
    chosen = tuple(
        (name, values[rng.randrange(len(values))]) for name, values in sorted(product.options)
    )
    upper, price_text = price_upper_for(product.price, rng)
    lead = vocabulary.INSTRUCTION_LEADS[rng.randrange(len(vocabulary.INSTRUCTION_LEADS))]
    text = f"{lead} {product.query} that is {' and '.join(wanted)}{option_text(chosen)}{price_text}"
    return Goal(
        asin=product.asin,
        instruction=text,
        name=product.title,
        query=product.query,
        product_category=product.product_category,
        attributes=wanted,
        options=tuple(v for _, v in chosen),
        option_groups=tuple(n for n, _ in chosen),
        price_upper=upper,
    )


@functools.lru_cache(maxsize=4)
def generate_catalogue(seed: int = 0, num_products: int = 3000) -> Catalogue:
    """``num_products`` products spread evenly over the five categories, and one goal per product;
    the same seed always gives the same catalogue."""
    num_products = bounded_int("generate_catalogue", "num_products", num_products, 10)
    # a str seed: the same stream on every platform and Python 3
    rng = random.Random(f"webshop-{int(seed)}")
    names = sorted(vocabulary.CATEGORIES)
    products = tuple(_make_product(i, names[i % len(names)], rng) for i in range(num_products))
    goals = tuple(_make_goal(p, rng) for p in products)
    return Catalogue(products, goals)


# --------------------------------------------------------------------------------------------------
# WebShop's files
# --------------------------------------------------------------------------------------------------


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})") from None


def _one_file(directory: str, pattern: str, required: bool) -> str | None:
    found = sorted(glob.glob(os.path.join(directory, pattern)))
    if len(found) > 1:
        raise ValueError(
            f"{directory}: several files match {pattern} ({', '.join(map(os.path.basename, found))}); "
            "keep one"
        )
    if not found and required:
        raise FileNotFoundError(f"{directory}: no {pattern} (WebShop's product file) found")
    return found[0] if found else None


def parse_price(pricing: Any) -> float:
    """A product's price from WebShop's ``pricing`` field: the number, or a range's lower bound;
    100.0 when unreadable (WebShop's default)."""
    if isinstance(pricing, (int, float)) and not isinstance(pricing, bool):
        return float(pricing)
    if isinstance(pricing, list) and pricing and all(isinstance(x, (int, float)) for x in pricing):
        return float(min(pricing))
    if isinstance(pricing, str):
        match = _PRICE.search(pricing)
        if match:
            return float(match.group(1).replace(",", ""))
    return DEFAULT_PRICE


def _option_value(value: str) -> str:
    return value.strip().replace("/", " | ").lower()


def _strings(value: Any, where: str, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: '{name}' must be a list of strings")
    return tuple(value)


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_FIELD_CHARS else text[:MAX_FIELD_CHARS] + "..."


def _load_product(row: Any, where: str, attributes: dict[str, Any]) -> Product:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object, got {type(row).__name__}")  # noqa: TRY004 - names the row
    asin, title = row.get("asin"), row.get("name")
    if not isinstance(asin, str) or not asin.strip():
        raise ValueError(f"{where}: needs a non-empty string 'asin'")
    if not isinstance(title, str) or not title.strip():
        raise ValueError(f"{where} ({asin}): needs a non-empty string 'name'")
    options = []
    custom = row.get("customization_options") or {}
    if not isinstance(custom, dict):
        raise ValueError(f"{where} ({asin}): 'customization_options' must be an object")  # noqa: TRY004
    for name, entries in custom.items():
        if not isinstance(entries, list):
            raise ValueError(f"{where} ({asin}): customization_options[{name!r}] must be a list")  # noqa: TRY004
        values = tuple(
            dict.fromkeys(
                _option_value(e["value"] if isinstance(e, dict) else e)
                for e in entries
                if isinstance(e, (dict, str))
                and (not isinstance(e, dict) or isinstance(e.get("value"), str))
            )
        )
        if values:
            options.append((str(name).strip().lower(), values))
    extra = attributes.get(asin, {})
    rating = row.get("average_rating")
    return Product(
        asin=asin.strip(),
        title=_cut(title),
        category=str(row.get("category", "")),
        product_category=str(row.get("product_category", "")),
        query=str(row.get("query", "")),
        price=parse_price(row.get("pricing")),
        description=_cut(str(row.get("full_description") or "")),
        bullet_points=tuple(
            _cut(b)
            for b in _strings(row.get("small_description"), where, "small_description")[
                :MAX_BULLETS
            ]
        ),
        options=tuple(options),
        attributes=tuple(
            a.lower()
            for a in _strings(
                extra.get("attributes") if isinstance(extra, dict) else None, where, "attributes"
            )
        ),
        rating=f"{float(rating):.1f}"
        if isinstance(rating, (int, float)) and not isinstance(rating, bool)
        else "N.A.",
    )


def _goal_for(
    product: Product,
    instruction: str,
    attributes: tuple[str, ...],
    options: tuple[str, ...],
    prng: random.Random,
) -> Goal:
    instruction = " ".join(instruction.split())
    match = PRICE_CLAUSE.search(instruction)
    if match:
        upper = float(match.group(1))
    else:
        upper, price_text = price_upper_for(product.price, prng)
        instruction = instruction.rstrip(".") + price_text
    values = tuple(_option_value(o) for o in options)
    return Goal(
        asin=product.asin,
        instruction=instruction,
        name=product.title,
        query=product.query,
        product_category=product.product_category,
        attributes=tuple(a.lower() for a in attributes),
        options=values,
        option_groups=tuple(product.option_group(v) for v in values),
        price_upper=upper,
    )


def _human_goals(path: str, by_asin: dict[str, Product], prng: random.Random) -> list[Goal]:
    data = _read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object {{asin: [goal, ...]}}")  # noqa: TRY004
    goals = []
    for asin, rows in data.items():
        product = by_asin.get(asin.lower())
        if product is None:  # WebShop also skips goals whose product is not in the product file
            continue
        for i, row in enumerate(rows if isinstance(rows, list) else [rows]):
            where = f"{path}: {asin}[{i}]"
            if not isinstance(row, dict) or not isinstance(row.get("instruction"), str):
                raise ValueError(f"{where}: needs a string 'instruction'")  # noqa: TRY004
            wanted = _strings(row.get("instruction_attributes"), where, "instruction_attributes")
            if not wanted:  # WebShop skips human goals without attributes
                continue
            goals.append(
                _goal_for(
                    product,
                    row["instruction"],
                    wanted,
                    _strings(row.get("instruction_options"), where, "instruction_options"),
                    prng,
                )
            )
    return goals


def _synthetic_goals(
    products: tuple[Product, ...], attributes: dict[str, Any], prng: random.Random
) -> list[Goal]:
    goals = []
    for product in products:
        extra = attributes.get(product.asin)
        if not isinstance(extra, dict) or not isinstance(extra.get("instruction"), str):
            continue
        wanted = _strings(
            extra.get("instruction_attributes"), product.asin, "instruction_attributes"
        )
        if not wanted:
            continue
        chosen = [
            (name, values[prng.randrange(len(values))]) for name, values in sorted(product.options)
        ]
        text = extra["instruction"].strip().rstrip(".") + option_text(chosen)
        goals.append(_goal_for(product, text, wanted, tuple(v for _, v in chosen), prng))
    return goals


@functools.lru_cache(maxsize=4)
def _load_cached(directory: str, stamp: tuple[tuple[str, int, int], ...], seed: int) -> Catalogue:
    products_path = _one_file(directory, "items_shuffle*.json", required=True)
    attr_path = _one_file(directory, "items_ins_v2*.json", required=False)
    human_path = _one_file(directory, "items_human_ins*.json", required=False)
    assert products_path is not None
    attributes = _read_json(attr_path) if attr_path else {}
    if not isinstance(attributes, dict):
        raise ValueError(
            f"{attr_path}: expected an object {{asin: {{attributes, instruction, ...}}}}"
        )  # noqa: TRY004
    rows = _read_json(products_path)
    if not isinstance(rows, list):
        raise ValueError(f"{products_path}: expected a JSON list of products")  # noqa: TRY004
    products: list[Product] = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        product = _load_product(row, f"{products_path}: product {i}", attributes)
        if product.asin.lower() in seen:  # WebShop keeps the first of duplicated asins
            continue
        seen.add(product.asin.lower())
        products.append(product)
    if not products:
        raise ValueError(f"{products_path}: no products")
    prng = random.Random(seed)
    by_asin = {p.asin.lower(): p for p in products}
    goals = (
        _human_goals(human_path, by_asin, prng)
        if human_path
        else _synthetic_goals(tuple(products), attributes, prng)
    )
    if not goals:
        raise ValueError(
            f"{directory}: no goals (needs items_human_ins*.json, or items_ins_v2*.json with "
            "'instruction' for products of the product file)"
        )
    return Catalogue(tuple(products), tuple(goals))


def load_catalogue(path: str | os.PathLike, seed: int = 0) -> Catalogue:
    """The products and goals of a directory of WebShop files (module docstring); ``seed`` draws the
    price bounds and synthetic options the files do not state. Cached per directory and file
    times."""
    directory = os.fspath(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"catalogue_path must be a directory of WebShop JSON files, got {directory!r}"
        )
    files = sorted(glob.glob(os.path.join(directory, "items_*.json")))
    stamp = tuple((f, os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in files)
    return _load_cached(os.path.abspath(directory), stamp, int(seed))


__all__ = [
    "Catalogue",
    "Goal",
    "Product",
    "generate_catalogue",
    "load_catalogue",
    "parse_price",
    "price_upper_for",
]
