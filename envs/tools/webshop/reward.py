"""WebShop's reward (``get_reward``, component by component) of a purchase in
:mod:`envs.tools.webshop.env`, computed without spaCy or a fuzzy-matching library.

``raw = r_type * (n_attr + n_opt + r_price) / (len(goal attributes) + len(goal options) + 1)``, and
RAGEN's reward is ``1.0`` when ``raw >= 1`` else 0 (``binary_reward=False`` returns ``raw`` itself).

* ``r_price``: 1 when the price is at most the goal's ``price_upper`` (WebShop's goals always have
  one: 1,000,000 when unbounded; a goal built with ``price_upper=None`` drops the term and the ``+
  1``, where WebShop would fail).
* ``n_attr``: goal attributes matched, each by a product attribute with ``token_set_ratio > 85``,
  else by the attribute occurring in the lower-cased title, bullet points or description (as
  WebShop).
* ``n_opt``: goal options matched by a chosen option with ``token_set_ratio > 85`` after colour
  normalisation (as WebShop). :func:`token_set_ratio` is written out from its definition in
  thefuzz/rapidfuzz (lower case, non alphanumerics to spaces, sorted token sets, indel similarity).
  Colour normalisation maps a string to the first colour word of :data:`COLOR_WORDS` among its
  words; WebShop tests substrings against a longer colour list (``"redwood"`` reads as red there,
  not here).
* ``r_type``: 1.0, or 0.5 when neither the scrape query is the same, nor two levels of
  ``product_category`` are shared, nor ``title_score > 0.2``; 0.1 when ``title_score < 0.1``; 0.0
  when ``title_score == 0``. ``title_score`` is the number of distinct goal-title words also in the
  bought product's title over the goal title's word count (repeats counted, as WebShop; 0.2 when the
  goal title has none). **Departure (no spaCy):** WebShop keeps only the words spaCy tags
  NOUN/PROPN; here the words are the lower-cased alphabetic tokens of two or more letters outside a
  short English stop-word list (:func:`title_words`), so adjectives and verbs count too. Buying the
  goal's own product scores ``title_score = 1`` unless its title repeats a word (as in WebShop); a
  different product of the same type usually shares enough words to pass 0.2.

The reward is its own module because it depends on the catalogue's records only
(:mod:`envs.tools.webshop.catalogue`), never on the pages: the env calls :func:`webshop_reward` when
the agent buys, its expert to rank products.
"""

from __future__ import annotations

import re
from typing import Any

from envs.tools.webshop.catalogue import Goal, Product

STOP_WORDS = frozenset(
    (
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "has",
        "have",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "that",
        "the",
        "this",
        "to",
        "was",
        "with",
        "you",
        "your",
        "i",
        "me",
        "my",
        "we",
        "our",
        "can",
        "will",
        "would",
        "need",
        "want",
        "looking",
        "find",
        "like",
        "am",
        "please",
        "under",
        "over",
        "than",
        "more",
        "less",
        "very",
    )
)
COLOR_WORDS = (
    "black",
    "white",
    "grey",
    "gray",
    "blue",
    "red",
    "green",
    "pink",
    "brown",
    "beige",
    "navy",
    "silver",
    "purple",
    "yellow",
    "orange",
    "gold",
    "ivory",
    "khaki",
    "tan",
    "cream",
    "teal",
    "burgundy",
    "coral",
    "multicolor",
    "clear",
)
ATTRIBUTE_THRESHOLD = OPTION_THRESHOLD = 85
# token_set_ratio compares at most this many characters of each side (bounded time)
_MAX_FUZZ_CHARS = 256


def _fuzz_tokens(text: str) -> set[str]:
    return set(re.sub(r"[^0-9a-z]+", " ", text[:_MAX_FUZZ_CHARS].lower()).split())


def _indel_ratio(a: str, b: str) -> float:
    """``100 * (1 - indel distance / (len(a) + len(b)))``, i.e. ``200 * LCS / (len(a) +
    len(b))``."""
    if not a and not b:
        return 100.0
    previous = [0] * (len(b) + 1)
    for ch in a:
        current = [0]
        for j, other in enumerate(b):
            current.append(previous[j] + 1 if ch == other else max(previous[j + 1], current[j]))
        previous = current
    return 200.0 * previous[-1] / (len(a) + len(b))


def token_set_ratio(a: str, b: str) -> float:
    """thefuzz/rapidfuzz's ``token_set_ratio``: 100 when one side's tokens contain the other's (and
    they share one), else the best indel ratio among (common, common + rest of a), (common, common +
    rest of b) and (common + rest of a, common + rest of b), token lists sorted; 0 when a side has
    no token."""
    ta, tb = _fuzz_tokens(a), _fuzz_tokens(b)
    if not ta or not tb:
        return 0.0
    common, only_a, only_b = sorted(ta & tb), sorted(ta - tb), sorted(tb - ta)
    if common and (not only_a or not only_b):
        return 100.0
    sect = " ".join(common)
    full_a, full_b = " ".join(common + only_a), " ".join(common + only_b)
    scores = [_indel_ratio(full_a, full_b)]
    if sect:
        scores += [_indel_ratio(sect, full_a), _indel_ratio(sect, full_b)]
    return max(scores)


def normalize_color(text: str) -> str:
    """The first colour word of :data:`COLOR_WORDS` among ``text``'s words, else ``text``."""
    words = set(re.findall(r"[a-z]+", text.lower()))
    return next((c for c in COLOR_WORDS if c in words), text)


def title_words(title: str) -> list[str]:
    """The words the type reward compares, in order, repeats kept (spaCy's nouns in WebShop; module
    docstring)."""
    words = re.findall(r"[a-z]+", title[: _MAX_FUZZ_CHARS * 4].lower())
    return [w for w in words if len(w) >= 2 and w not in STOP_WORDS]


def type_reward(product: Product, goal: Goal) -> dict[str, Any]:
    """``r_type`` and its inputs (``query_match``, ``category_match``, ``title_score``)."""
    query_match = bool(product.query) and product.query == goal.query
    bought = {x.strip() for x in product.product_category.split("›") if x.strip()}
    wanted = {x.strip() for x in goal.product_category.split("›") if x.strip()}
    category_match = len(bought & wanted) >= 2
    desired = title_words(goal.name)
    # WebShop divides the distinct shared words by the goal's word count with repeats
    title_score = (
        len(set(title_words(product.title)) & set(desired)) / len(desired) if desired else 0.2
    )
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def attribute_matches(product: Product, goal: Goal) -> int:
    """How many goal attributes the product has (fuzzy against its attributes, else a substring of
    its texts)."""
    texts = (
        product.title.lower(),
        " ".join(product.bullet_points).lower(),
        product.description.lower(),
    )
    count = 0
    for wanted in goal.attributes:
        if any(
            token_set_ratio(have, wanted) > ATTRIBUTE_THRESHOLD for have in product.attributes
        ) or any(wanted in text for text in texts):
            count += 1
    return count


def option_matches(chosen: list[str] | tuple[str, ...], goal_options: tuple[str, ...]) -> int:
    """How many goal options some chosen option matches (colour-normalised, ``token_set_ratio >
    85``)."""
    chosen_norm = [normalize_color(c) for c in chosen]
    return sum(
        any(token_set_ratio(c, normalize_color(g)) > OPTION_THRESHOLD for c in chosen_norm)
        for g in goal_options
    )


def webshop_reward(
    product: Product, goal: Goal, chosen: list[str] | tuple[str, ...]
) -> tuple[float, dict]:
    """WebShop's raw reward of buying ``product`` with the option values ``chosen`` for ``goal``,
    and its parts."""
    parts = type_reward(product, goal)
    n_attr, n_opt = attribute_matches(product, goal), option_matches(chosen, goal.options)
    r_price = None if goal.price_upper is None else product.price <= goal.price_upper
    numerator = n_attr + n_opt + (int(r_price) if r_price is not None else 0)
    denominator = len(goal.attributes) + len(goal.options) + (1 if r_price is not None else 0)
    raw = parts["r_type"] * (numerator / denominator if denominator else 1.0)
    parts.update(num_attr_matches=n_attr, num_option_matches=n_opt, r_price=r_price)
    return raw, parts


__all__ = [
    "COLOR_WORDS",
    "attribute_matches",
    "normalize_color",
    "option_matches",
    "title_words",
    "token_set_ratio",
    "type_reward",
    "webshop_reward",
]
