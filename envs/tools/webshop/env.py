"""Web shopping (RAGEN's ``webshop`` env over WebShop, Yao et al. 2022), offline.

RAGEN runs WebShop's simulated web store in-process: a Lucene index (a JDK) over 1.18M scraped
Amazon products and spaCy models for the reward, all downloaded at setup. None of that is available
here, so the store is rebuilt: the products and instructions come from a seeded generated catalogue
(:mod:`envs.tools.webshop.catalogue`; ``catalogue_path`` reads WebShop's own JSON files instead),
search is BM25 from the ``bm25s`` library (top 50, as WebShop's Lucene search), and the reward is
WebShop's formula computed without spaCy (:mod:`envs.tools.webshop.reward`, which lists its
departures).

Pages and actions follow WebShop's text mode and RAGEN's wrapper: the search page
(``search[<keywords>]``), results (10 per page; ``click[<asin>]`` opens a product, ``click[next >]``
/ ``click[< prev]`` turn pages, ``click[back to search]``), the product page (``click[<option
value>]`` chooses an option, ``click[description]``, ``click[features]``, ``click[reviews]`` open
sub-pages that ``click[< prev]`` leaves, ``click[buy now]`` buys and ends the episode). A page is
WebShop's visible text joined by ``" [SEP] "``; RAGEN's rendering appends its shopping tips and
``You must choose from these actions: ...`` (the available actions: ``search[<content>]`` where the
page has a search bar, ``click[x]`` for every clickable). A click is valid when its (lower-cased)
target is on the page, a search when the page has a search bar and the keywords are not empty.

## Departures besides the reward's

* An invalid action leaves the page as it was and says why on the first line (``Invalid action:
  ...``; WebShop shows the same page silently); ``action_is_effective`` is False for it.
* RAGEN joins the page and its tips with no separator (its ``render`` lacks a newline) and prints
  ``You must choose from these actions:`` after a space; here each has its own line. RAGEN drops
  ``click[next >]`` from a page whose only actions are back/prev/next; here the actions are exactly
  the page's clickables.
* A chosen option is shown on the product page (``Selected: color: black``), which WebShop's HTML
  shows as a checked radio button its text mode loses.
* ``max_steps`` (15) truncates an episode (RAGEN's trainer caps turns instead).
* Splits as RAGEN: goals are put in a fixed order (``random.Random(42).shuffle``); ``test`` takes
  goal ``seed % 500``, ``val`` ``500 + seed % 1000``, ``train`` ``1500 + seed % (N - 1500)`` (sizes:
  ``split_sizes``).
"""

from __future__ import annotations

import functools
import os
import random
import re
from typing import Any

from gymnasium import spaces

from envs.base import PromptSpec, TextEnv, ToolSpec, bounded_int, text_space
from envs.tools.search.retrieval import MAX_TOP_K, BM25Retriever
from envs.tools.webshop.catalogue import (
    PRICE_CLAUSE,
    Catalogue,
    Goal,
    Product,
    generate_catalogue,
    load_catalogue,
)
from envs.tools.webshop.reward import (
    OPTION_THRESHOLD,
    normalize_color,
    token_set_ratio,
    webshop_reward,
)

INSTRUCTION = (
    "You are shopping in a web store. Read the instruction and buy the product that matches it best: the product "
    "type, its features, the options asked for (colour, size, ...) and the price limit. On the search page search "
    "for keywords; on a results page click a product's ID, or click[next >] / click[< prev] to turn pages; on a "
    "product page click an option value to choose it and click[buy now] to buy; click[back to search] starts over. "
    "Example: the instruction 'i need a shampoo that is sulfate free with size: 12 fl oz' starts with "
    "<answer>search[shampoo sulfate free]</answer>. Inside <answer>, output exactly one action: search[<keywords>] or "
    "click[<button>]."
)
TOOL_INSTRUCTION = (
    "You are shopping in a web store. Read the instruction and buy the product that matches it best: the product "
    "type, its features, the options asked for (colour, size, ...) and the price limit. Call exactly one function "
    "per turn: search (on the search page) for keywords; click a product's ID on a results page, 'next >' / "
    "'< prev' to turn pages, an option value on a product page to choose it, 'buy now' to buy, 'back to search' "
    "to start over."
)
TOOLS = (
    ToolSpec(
        "search",
        "Search the store for products (only where the page has a search bar).",
        "keywords",
        "the search keywords, e.g. 'shampoo sulfate free'",
        "search[{}]",
    ),
    ToolSpec(
        "click",
        "Click a button or link of the current page.",
        "target",
        "exactly as listed among the page's actions, e.g. 'b000000042', 'buy now', 'next >'",
        "click[{}]",
    ),
)
TIPS = (
    "Buy within 10 actions.",
    "Search with the product type and features; sizes and colours are chosen on the product page, not searched.",
    "Search at most twice; look through the results before searching again.",
    "Open a result by clicking its ID, e.g. click[b000000042].",
    "On the product page click each option the instruction asks for, then click[buy now].",
    "Buying ends the episode; a product that misses the type, a feature, an option or the price scores less.",
    "Use click[next >] and click[< prev] to turn result pages.",
    "Use click[< prev] to go back one page and click[back to search] to search again.",
    "Only open the description, features or reviews when the title does not tell enough.",
)
SEP = " [SEP] "
NAV = ("back to search", "< prev", "next >")
SUB_PAGES = ("description", "features", "reviews")
BUY = "buy now"
MAX_ACTION_LENGTH = 4096
# a page's text is cut here (with "..."); a whole observation at twice this (the space's)
MAX_PAGE_CHARS = 32768
_ACTION = re.compile(r"(search|click)\[(.*)\]", re.DOTALL | re.IGNORECASE)
_REQUEST = re.compile(
    r"^(?:(?:can|could) you )?(?:please )?(?:i am |i'm |im |i )?(?:looking for|need|want|would like|"
    r"find me|search for|get me|buy)(?: an?\b)? ?",
    re.IGNORECASE,
)
_THAT_IS = re.compile(r"\b(?:that|which) (?:is|are)\b", re.IGNORECASE)
# " with color: ..., and ..."
_OPTION_CLAUSE = re.compile(r",?\s+with\s+[^,:]+:.*$", re.IGNORECASE | re.DOTALL)

# --------------------------------------------------------------------------------------------------
# Catalogue, index and splits
# --------------------------------------------------------------------------------------------------

_INDEXES: dict[int, tuple[Catalogue, BM25Retriever]] = {}


def _index(catalogue: Catalogue) -> BM25Retriever:
    """One BM25 index per catalogue, shared by every env of the process."""
    entry = _INDEXES.get(id(catalogue))
    if entry is None or entry[0] is not catalogue:
        entry = (catalogue, BM25Retriever(list(catalogue.documents())))
        _INDEXES[id(catalogue)] = entry
    return entry[1]


@functools.lru_cache(maxsize=8)
def _goal_order(num_goals: int) -> tuple[int, ...]:
    order = list(range(num_goals))
    random.Random(42).shuffle(order)  # RAGEN's fixed goal permutation
    return tuple(order)


def split_goal_index(seed: int, split: str, num_goals: int, split_sizes: tuple[int, int]) -> int:
    """The catalogue goal a seed names in a split (RAGEN's rule, module docstring)."""
    test, val = split_sizes
    if split == "test":
        position = seed % test
    elif split == "val":
        position = test + seed % val
    else:
        position = test + val + seed % (num_goals - test - val)
    return _goal_order(num_goals)[position]


def search_keywords(instruction: str) -> str:
    """The expert's search: the instruction without its request words (``i need a``, ``find me a``,
    ...), ``that is``, its option clause (`` with color: black, and size: large``) and its price
    clause. BM25 drops such words anyway; a short search is easier for a small model to copy."""
    text = _OPTION_CLAUSE.sub("", PRICE_CLAUSE.sub("", instruction))
    text = _THAT_IS.sub(" ", _REQUEST.sub("", " ".join(text.split())))
    return " ".join(text.split()) or " ".join(instruction.split())


class _WebShopActions(spaces.Text):
    """The action space: text. ``sample()`` draws well-formed actions (a search for a goal's
    keywords one time in four, else a click on a navigation button, a product or an option value),
    so a random agent, ``check_env`` and the env benchmark move through the pages instead of sending
    strings that never parse."""

    def __init__(self, queries: tuple[str, ...], targets: tuple[str, ...], **kwargs: Any):
        super().__init__(**kwargs)
        self.queries, self.targets = queries, targets

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        if self.np_random.random() < 0.25:
            return f"search[{self.queries[int(self.np_random.integers(len(self.queries)))]}]"
        return f"click[{self.targets[int(self.np_random.integers(len(self.targets)))]}]"


# --------------------------------------------------------------------------------------------------
# The env
# --------------------------------------------------------------------------------------------------


class WebShopEnv(TextEnv):
    """Find and buy the product an instruction describes, in a simulated web store.

    ## Description At reset the seed picks a goal of the split (module docstring): an instruction
    such as ``i need a shampoo that is sulfate free with size: 12 fl oz, and price lower than 30.00
    dollars``. The agent searches, browses result pages, opens products, chooses options and buys;
    the bought product is scored against the goal.

    ## Action Space ``Text`` (printable ASCII, up to 4096 characters): ``search[<keywords>]`` or
    ``click[<clickable>]``. ``action_names`` is empty.

    ## Observation Space ``Text`` over printable ASCII plus the catalogue's characters: the page in
    WebShop's text mode (``WebShop [SEP] Instruction: [SEP] <instruction> [SEP] Search``; results
    ``Instruction: [SEP] ... [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next >
    [SEP] B000000042 [SEP] <title> [SEP] $12.99 [SEP] ...``; product pages with option groups,
    title, ``Price: $..``, ``Rating: ..``, ``Description``, ``Features``, ``Reviews``, ``Buy Now``),
    then the tips and ``You must choose from these actions: search[<content>], click[...], ...``.

    ## Rewards 0 until ``click[buy now]``; then 1.0 when WebShop's reward of the purchase is 1 (else
    0.0), or that reward itself with ``binary_reward=False`` (:mod:`envs.tools.webshop.reward`).

    ## Episode End Terminated by ``click[buy now]``. Truncated after ``max_steps`` actions. Stepping
    after the end returns the last observation, reward 0.0, the same flags and
    ``action_is_valid=False``.

    ## Info ``success`` (raw reward 1), ``action_is_valid``, ``action_is_effective`` (the state
    changed), ``raw_reward`` (WebShop's reward of the purchase, 0 before), ``success_purchase``
    (bought), ``success_find`` (the goal's own product was opened this episode), ``end_of_page``
    (the last page of results is shown), ``page`` (``search``, ``results``, ``item``,
    ``description``, ``features``, ``reviews``, ``done``).

    ## Arguments
    - ``catalogue_seed`` (0), ``num_products`` (3000): the generated catalogue.
    - ``catalogue_path``: a directory of WebShop's JSON files (:mod:`envs.tools.webshop.catalogue`)
      used instead; ``catalogue_seed`` then draws what the files leave open (price bounds, synthetic
      goals' options).
    - ``split`` (``"train"``), ``split_sizes`` ((500, 1000): the test and val goal counts).
    - ``max_steps`` (15), ``results_per_page`` (10), ``max_results`` (50), ``show_tips`` (True:
      RAGEN's tips under every page), ``binary_reward`` (True).
    - ``render_mode``: ``None`` or ``"ansi"``.

    ## Options ``reset(options={"goal_index": i})`` takes goal ``i`` of the catalogue (in
    file/generation order, any split).
    """

    def __init__(
        self,
        catalogue_seed: int = 0,
        num_products: int = 3000,
        catalogue_path: str | os.PathLike | None = None,
        split: str = "train",
        split_sizes: tuple[int, int] | list[int] = (500, 1000),
        max_steps: int = 15,
        results_per_page: int = 10,
        max_results: int = 50,
        show_tips: bool = True,
        binary_reward: bool = True,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        if split not in ("train", "val", "test"):
            raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
        max_steps = bounded_int("WebShopEnv", "max_steps", max_steps, 1)
        results_per_page = bounded_int("WebShopEnv", "results_per_page", results_per_page, 1)
        max_results = bounded_int("WebShopEnv", "max_results", max_results, 1, MAX_TOP_K)
        sizes = tuple(split_sizes)
        if len(sizes) != 2:
            raise ValueError(f"split_sizes must be two ints >= 1 (test, val), got {list(sizes)}")
        sizes = tuple(bounded_int("WebShopEnv", "split_sizes entries", s, 1) for s in sizes)
        self.catalogue = (
            load_catalogue(catalogue_path, seed=int(catalogue_seed))
            if catalogue_path is not None
            else generate_catalogue(int(catalogue_seed), int(num_products))
        )
        if len(self.catalogue.goals) <= sum(sizes):
            raise ValueError(
                f"the catalogue has {len(self.catalogue.goals)} goals; split_sizes {list(sizes)} (test, "
                "val) leave none for training: pass smaller split_sizes"
            )
        self.split, self.split_sizes = split, (int(sizes[0]), int(sizes[1]))
        self.max_steps, self.results_per_page, self.max_results = (
            max_steps,
            results_per_page,
            max_results,
        )
        self.show_tips, self.binary_reward = bool(show_tips), bool(binary_reward)
        self.retriever = _index(self.catalogue)
        extra = self.catalogue.characters()
        self.observation_space = text_space(extra, max_length=2 * MAX_PAGE_CHARS)
        self._charset = frozenset(self.observation_space.character_set)
        products = self.catalogue.products
        targets = (
            NAV
            + SUB_PAGES
            + (BUY,)
            + tuple(p.asin.lower() for p in products[:200])
            + tuple(sorted({v for p in products[:200] for _, values in p.options for v in values}))
        )
        queries = tuple(search_keywords(g.instruction) for g in self.catalogue.goals[:64])
        self.action_space = _WebShopActions(
            queries,
            targets,
            min_length=0,
            max_length=MAX_ACTION_LENGTH,
            charset=text_space().character_set,
        )
        self.goal: Goal | None = None
        self._new_episode()

    # ------------------------------------------------------------------------------------------------ episode state

    def _new_episode(self) -> None:
        self.page = "search"
        self.query = ""
        self.results: list[str] = []  # asins, best first
        self.page_no = 1
        self.product: Product | None = None
        self.selected: dict[str, str] = {}  # option group -> chosen value
        self.step_count = 0
        self.found = False
        self.raw_reward = 0.0
        self.reward_parts: dict[str, Any] = {}
        self._note = ""
        self._terminated = self._truncated = False
        self._plan: tuple[str, str] | None = None  # the expert's (query, asin to buy)

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(instruction=INSTRUCTION, tools=TOOLS, tool_instruction=TOOL_INSTRUCTION)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = self._reset_options(options, ("goal_index",))
        goals = self.catalogue.goals
        index = options.get("goal_index")
        if index is None:
            key = int(seed) if seed is not None else int(self.np_random.integers(2**31))
            index = split_goal_index(key, self.split, len(goals), self.split_sizes)
        else:
            index = bounded_int("WebShopEnv", "options['goal_index']", index, 0, len(goals) - 1)
        self.goal = goals[index]
        self._new_episode()
        return self._observation(), self._info(valid=True, effective=False)

    # ------------------------------------------------------------------------------------------------ pages

    def available_actions(self) -> dict[str, Any]:
        """WebShop's ``get_available_actions``: ``{"has_search_bar": bool, "clickables": [lower-case
        strings]}``."""
        if self.page == "search":
            return {"has_search_bar": True, "clickables": ["search"]}
        if self.page == "done":
            return {"has_search_bar": False, "clickables": []}
        clickables = ["back to search"]
        if self.page == "results":
            if self.page_no > 1:
                clickables.append("< prev")
            if self.page_no < self._num_pages():
                clickables.append("next >")
            clickables += [asin.lower() for asin in self._page_results()]
        else:
            clickables.append("< prev")
            if self.page == "item":
                assert self.product is not None
                clickables += [v for _, values in self.product.options for v in values]
                clickables += [*SUB_PAGES, BUY]
        return {"has_search_bar": False, "clickables": list(dict.fromkeys(clickables))}

    def action_strings(self) -> list[str]:
        """RAGEN's list of available actions: ``search[<content>]`` where there is a search bar, and
        ``click[x]`` for every clickable but ``search``."""
        available = self.available_actions()
        actions = ["search[<content>]"] if available["has_search_bar"] else []
        return actions + [f"click[{c}]" for c in available["clickables"] if c != "search"]

    def _num_pages(self) -> int:
        return max(1, -(-len(self.results) // self.results_per_page))

    def _page_results(self) -> list[str]:
        start = (self.page_no - 1) * self.results_per_page
        return self.results[start : start + self.results_per_page]

    def _page_text(self) -> str:
        assert self.goal is not None
        head = ["Instruction:", self.goal.instruction]
        if self.page == "search":
            return SEP.join(["WebShop", *head, "Search"])
        if self.page == "done":
            assert self.product is not None
            chosen = ", ".join(f"{k}: {v}" for k, v in self.selected.items()) or "none"
            return SEP.join(
                [
                    "Thank you for shopping with us!",
                    "Purchased",
                    self.product.asin,
                    self.product.title,
                    f"Options: {chosen}",
                    "Your score (min 0.0, max 1.0)",
                    f"{self.raw_reward:.2f}",
                ]
            )
        parts = [*head, "Back to Search"]
        if self.page == "results":
            parts.append(f"Page {self.page_no} (Total results: {len(self.results)})")
            if self.page_no > 1:
                parts.append("< Prev")
            if self.page_no < self._num_pages():
                parts.append("Next >")
            for asin in self._page_results():
                product = self.catalogue.by_asin[asin.lower()]
                parts += [product.asin, product.title, f"${product.price:.2f}"]
            if not self.results:
                parts.append("No products match the search.")
            return SEP.join(parts)
        product = self.product
        assert product is not None
        parts.append("< Prev")
        if self.page == "item":
            for name, values in product.options:
                parts += [name, *values]
            if self.selected:
                parts.append(
                    "Selected: " + ", ".join(f"{k}: {v}" for k, v in self.selected.items())
                )
            parts += [
                product.title,
                f"Price: ${product.price:.2f}",
                f"Rating: {product.rating}",
                "Description",
                "Features",
                "Reviews",
                "Buy Now",
            ]
        elif self.page == "description":
            parts.append(product.description or "No description.")
        elif self.page == "features":
            parts += list(product.bullet_points) or ["No features listed."]
        else:
            parts += [f"Average rating: {product.rating}", "No reviews yet."]
        return SEP.join(parts)

    def _page(self) -> str:
        text = self._page_text()
        return text if len(text) <= MAX_PAGE_CHARS else text[:MAX_PAGE_CHARS] + "..."

    def _observation(self) -> str:
        lines = [self._page()]
        if self._note:
            lines.insert(0, self._note)
        if self.page != "done":
            if self.show_tips:
                lines += TIPS
            lines.append(
                "You must choose from these actions: " + ", ".join(self.action_strings()) + "."
            )
        text = "\n".join(lines)
        # the space's max_length (thousands of option values could pass it)
        limit = 2 * MAX_PAGE_CHARS
        return text if len(text) <= limit else text[: limit - 3] + "..."

    # ------------------------------------------------------------------------------------------------ step

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.goal is None:
            raise RuntimeError("WebShopEnv: call reset() before step()")
        if self._terminated or self._truncated:
            return (
                self._observation(),
                0.0,
                self._terminated,
                self._truncated,
                self._info(valid=False, effective=False),
            )
        self.step_count += 1
        before = self._page_text()
        text = action.strip() if isinstance(action, str) else ""
        match = _ACTION.fullmatch(text) if len(text) <= MAX_ACTION_LENGTH else None
        error = (
            self._apply(match.group(1).lower(), match.group(2).strip())
            if match
            else "use search[<keywords>] or click[<button>]"
        )
        self._note = f"Invalid action: {error}." if error else ""
        reward = 0.0
        if self.page == "done":
            self._terminated = True
            reward = float(self.raw_reward >= 1.0) if self.binary_reward else self.raw_reward
        self._truncated = not self._terminated and self.step_count >= self.max_steps
        info = self._info(valid=not error, effective=not error and self._page_text() != before)
        return self._observation(), reward, self._terminated, self._truncated, info

    def _apply(self, verb: str, arg: str) -> str:
        """Carry out one parsed action; the reason it is invalid, or "" when it was carried out."""
        if verb == "search":
            if self.page != "search":
                return "this page has no search bar (click[back to search] first)"
            if not arg:
                return "empty search"
            self.query = arg
            self.results = [d.id for d in self.retriever.search(arg, self.max_results)]
            self.page, self.page_no = "results", 1
            return ""
        target = arg.lower()
        if target not in self.available_actions()["clickables"] or target == "search":
            # model text, echoed safely
            shown = "".join(c if c in self._charset else "?" for c in repr(arg[:80]))
            return f"{shown} is not a button on this page"
        if target == "back to search":
            self.page, self.results, self.query, self.product, self.selected = (
                "search",
                [],
                "",
                None,
                {},
            )
        elif target == "next >":
            self.page_no += 1
        elif target == "< prev":
            if self.page == "results":
                self.page_no -= 1
            elif self.page == "item":
                self.page, self.product, self.selected = "results", None, {}
            else:
                self.page = "item"
        elif self.page == "results":
            self.product = self.catalogue.by_asin[target]
            self.page, self.selected = "item", {}
            self.found = self.found or self.product.asin == self.goal.asin  # type: ignore[union-attr]
        elif target in SUB_PAGES:
            self.page = target
        elif target == BUY:
            assert self.product is not None and self.goal is not None
            self.raw_reward, self.reward_parts = webshop_reward(
                self.product, self.goal, list(self.selected.values())
            )
            self.page = "done"
        else:  # an option value
            assert self.product is not None
            group = self.product.option_group(target)
            assert group is not None
            self.selected[group] = target
        return ""

    def _info(self, *, valid: bool, effective: bool) -> dict[str, Any]:
        end = self.page == "results" and self.page_no >= self._num_pages()
        return {
            "success": bool(self.page == "done" and self.raw_reward >= 1.0),
            "action_is_valid": bool(valid),
            "action_is_effective": bool(effective),
            "raw_reward": float(self.raw_reward),
            "success_purchase": self.page == "done",
            "success_find": bool(self.found),
            "end_of_page": bool(end),
            "page": self.page,
        }

    def _render_text(self) -> str:
        return self._observation()

    # ------------------------------------------------------------------------------------------------ expert

    def _expert_plan(self) -> tuple[str, str]:
        """The expert's search keywords and the result it buys: the one whose best possible purchase
        (the goal's options chosen where offered) scores highest, earliest ranked on ties."""
        assert self.goal is not None
        if self._plan is None or (
            self.page != "search" and self.query and self.query != self._plan[0]
        ):
            query = self.query or search_keywords(self.goal.instruction)
            results = (
                self.results
                if self.query
                else [d.id for d in self.retriever.search(query, self.max_results)]
            )
            best, best_score = "", -1.0
            for asin in results:
                product = self.catalogue.by_asin[asin.lower()]
                score = webshop_reward(product, self.goal, self._expert_options(product))[0]
                if score > best_score:
                    best, best_score = asin, score
            self._plan = (query, best)
        return self._plan

    def _expert_options(self, product: Product) -> list[str]:
        """For each goal option, the product's value that matches it (exact first, then fuzzy), if
        any."""
        assert self.goal is not None
        chosen = []
        for wanted in self.goal.options:
            values = [v for _, vs in product.options for v in vs]
            exact = [v for v in values if v == wanted]
            fuzzy = [
                v
                for v in values
                if token_set_ratio(normalize_color(v), normalize_color(wanted)) > OPTION_THRESHOLD
            ]
            if exact or fuzzy:
                chosen.append((exact or fuzzy)[0])
        return chosen

    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert: search the instruction's keywords, open the best matching result
        (turning pages to reach it), choose the goal's options, buy. Its sentences copy nothing long
        from the page (the action does the copying): a small model imitates short turns sooner."""
        if self.goal is None:
            raise RuntimeError("WebShopEnv: call reset() before expert_turn()")
        query, target = self._expert_plan()
        if self.page == "search":
            return "I search for the type and features", (f"search[{query}]",)
        if self.page == "results":
            if not target:
                return "Nothing matches, I search again", ("click[back to search]",)
            position = self.results.index(target) // self.results_per_page + 1
            if position > self.page_no:
                return "A better match is on a later page", ("click[next >]",)
            if position < self.page_no:
                return "A better match is on an earlier page", ("click[< prev]",)
            rank = self.results.index(target) % self.results_per_page + 1
            return f"Result {rank} on this page matches best", (f"click[{target.lower()}]",)
        if self.page != "item" or self.product is None or self.product.asin != target:
            return "I go back to the product", ("click[< prev]",)
        missing = [v for v in self._expert_options(self.product) if v not in self.selected.values()]
        actions = [f"click[{v}]" for v in missing][: max(1, max_actions)]
        if len(actions) < max_actions or not missing:
            actions.append(f"click[{BUY}]")
        if missing:
            return f"I choose {', '.join(missing[: len(actions)])}", tuple(
                actions[: max(1, max_actions)]
            )
        return "The options are chosen, I buy it", (f"click[{BUY}]",)


__all__ = ["WebShopEnv", "search_keywords", "split_goal_index"]
