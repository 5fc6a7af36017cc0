"""WebShop: the reward component by component on constructed products (values worked out by hand in
the comments), the page rules (search, pagination, options, sub-pages, buy ends the episode, invalid
actions), RAGEN's goal splits, the generated catalogue, WebShop's JSON files (the shipped fixture in
their schema), and the expert."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import gymnasium as gym
import pytest

import envs  # noqa: F401 - registers the ids
from envs.tools import webshop
from envs.tools.webshop.catalogue import (
    Goal,
    Product,
    generate_catalogue,
    load_catalogue,
    parse_price,
    price_upper_for,
)
from envs.tools.webshop.env import TIPS, WebShopEnv, search_keywords, split_goal_index
from envs.tools.webshop.reward import (
    attribute_matches,
    normalize_color,
    option_matches,
    title_words,
    token_set_ratio,
    type_reward,
    webshop_reward,
)

FIXTURE = Path(webshop.__file__).parent / "data" / "webshop_fixture"


@pytest.fixture(scope="module")
def env() -> WebShopEnv:
    return gym.make("ragen/WebShop-v0").unwrapped


@pytest.fixture(scope="module")
def fixture_env() -> WebShopEnv:
    return WebShopEnv(catalogue_path=FIXTURE, split_sizes=(1, 1))


def product(**kw) -> Product:
    base = {
        "asin": "B1",
        "title": "Acme Machine Washable Hoodie",
        "category": "fashion",
        "product_category": "Clothing › Sweatshirts › Hoodie",
        "query": "hoodie",
        "price": 30.0,
        "description": "a warm hoodie of 100% cotton",
        "bullet_points": ("SOFT: brushed inside",),
        "options": (("color", ("jet black", "grey")), ("size", ("small", "x-large"))),
        "attributes": ("machine washable",),
    }
    base.update(kw)
    return Product(**base)


def goal(**kw) -> Goal:
    base = {
        "asin": "B1",
        "instruction": "i need a hoodie",
        "name": "Acme Machine Washable Hoodie",
        "query": "hoodie",
        "product_category": "Clothing › Sweatshirts › Hoodie",
        "attributes": ("machine wash", "elastic waist", "cotton"),
        "options": ("black", "x-large"),
        "option_groups": ("color", "size"),
        "price_upper": 40.0,
    }
    base.update(kw)
    return Goal(**base)


# ------------------------------------------------------------------------------------------------ reward, by hand


def test_token_set_ratio_by_hand():
    assert token_set_ratio("natural looking", "Looking, natural!") == 100.0  # same token set
    # one side's tokens contain the other's
    assert token_set_ratio("easy to use", "easy use") == 100.0
    # "machine washable" / "machine wash": common "machine"; "machine washable" (16) vs "machine
    # wash" (12) share the 12 characters of the shorter: 200 * 12 / 28 = 85.714 (the other two pairs
    # give 60.9 and 73.7)
    assert token_set_ratio("machine washable", "machine wash") == pytest.approx(600 / 7)
    # "16 inch" / "18 inch": "inch 16" vs "inch 18", LCS 6 of 14 characters: 85.7 > 85, so WebShop's
    # option match takes one size for the other (kept: it is the original's rule)
    assert token_set_ratio("16 inch", "18 inch") == pytest.approx(600 / 7)
    # "free gluten" (11) vs "free sugar" (10): LCS "free " + one of g/u = 6 -> 200*6/21 = 57.14;
    # "free" vs "free sugar": 200*4/14 = 57.14; vs "free gluten": 200*4/15 = 53.3
    assert token_set_ratio("gluten free", "sugar free") == pytest.approx(1200 / 21)
    assert token_set_ratio("", "black") == 0.0 and token_set_ratio("!!", "black") == 0.0
    # only the first 256 characters count (bounded time): a 256-letter token vs "x": 200 * 1 / 257
    assert token_set_ratio("x" * 100_000, "x") == pytest.approx(200 / 257)


def test_colour_normalisation_and_title_words():
    assert (
        normalize_color("Jet Black") == "black"
        and normalize_color("dark brown | auburn") == "brown"
    )
    # words, not subs
    assert normalize_color("redwood") == "redwood" and normalize_color("12 fl oz") == "12 fl oz"
    assert title_words("Orchard Row Sulfate Free Shampoo with Argan Oil, 12 Fl Oz") == [
        "orchard",
        "row",
        "sulfate",
        "free",
        "shampoo",
        "argan",
        "oil",
        "fl",
        "oz",
    ]


def test_type_reward_cases():
    # 11 title words
    g = goal(name="Alpha Beta Gamma Delta Epsilon Zeta Eta Theta Iota Kappa Lambda")
    far = {"query": "other", "product_category": "Else › Other › Thing"}
    # the same product: query, category and title all match
    assert type_reward(product(title=g.name), g) == {
        "r_type": 1.0,
        "query_match": True,
        "category_match": True,
        "title_score": 1.0,
    }
    # 3 of 11 words (0.27 > 0.2): 1.0 without query or category match
    assert type_reward(product(title="Alpha Beta Gamma Widget", **far), g)["r_type"] == 1.0
    # 2 of 11 (0.18): no match flag -> 0.5; with the category sharing two levels -> 1.0
    assert type_reward(product(title="Alpha Beta Widget", **far), g)["r_type"] == 0.5
    shared = {"query": "other", "product_category": "Clothing › Sweatshirts › Something"}
    parts = type_reward(product(title="Alpha Beta Widget", **shared), g)
    assert parts["category_match"] and parts["r_type"] == 1.0
    # 1 of 11 (0.09 < 0.1) -> 0.1 even when the query matches; none -> 0.0
    assert type_reward(product(title="Alpha Widget"), g)["r_type"] == 0.1
    assert type_reward(product(title="Widget"), g)["r_type"] == 0.0
    # repeats count in the goal's word count: "Free Paraben Free Shampoo" has 4 words, 3 distinct,
    # all shared: 0.75
    assert (
        type_reward(product(title="Paraben Free Shampoo"), goal(name="Free Paraben Free Shampoo"))[
            "title_score"
        ]
        == 0.75
    )
    # a goal title without words scores 0.2: 0.5 unless a flag matches
    assert type_reward(product(title="Widget", **far), goal(name="12 of 3"))["r_type"] == 0.5
    assert type_reward(product(title="Widget"), goal(name="12 of 3"))["r_type"] == 1.0


def test_attribute_and_option_matches():
    # "machine wash" ~ "machine washable" (85.7 > 85); "elastic waist" nowhere; "cotton" in the
    # description
    assert attribute_matches(product(), goal()) == 2
    assert attribute_matches(product(description=""), goal()) == 1
    # "jet black" normalises to black = goal's "black"; "small" vs "x-large" scores 16.7
    assert option_matches(["jet black", "small"], ("black", "x-large")) == 1
    assert option_matches(["jet black", "x-large"], ("black", "x-large")) == 2
    assert option_matches([], ("black",)) == 0


def test_webshop_reward_combines_the_components():
    p, g = product(), goal()  # r_type 1, 2 of 3 attributes
    # options 1 of 2, price 30 <= 40: (2 + 1 + 1) / (3 + 2 + 1)
    raw, parts = webshop_reward(p, g, ["jet black", "small"])
    assert (
        raw == pytest.approx(4 / 6)
        and parts["r_price"] is True
        and parts["num_option_matches"] == 1
    )
    # over the price bound: (2 + 1 + 0) / 6
    assert webshop_reward(product(price=45.0), g, ["jet black", "small"])[0] == pytest.approx(3 / 6)
    # no price bound: the term and its +1 are dropped: (2 + 1) / 5
    assert webshop_reward(p, goal(price_upper=None), ["jet black", "small"])[0] == pytest.approx(
        3 / 5
    )
    # r_type multiplies: 2 of 11 title words, nothing else matches -> 0.5 * 4/6
    g11 = goal(name="Alpha Beta Gamma Delta Epsilon Zeta Eta Theta Iota Kappa Lambda")
    far = product(title="Alpha Beta Machine Washable", query="x", product_category="A › B")
    assert webshop_reward(far, g11, ["jet black", "small"])[0] == pytest.approx(0.5 * 4 / 6)
    # everything matches: exactly 1.0
    assert (
        webshop_reward(product(description="cotton, elastic waist"), g, ["jet black", "x-large"])[0]
        == 1.0
    )


# ------------------------------------------------------------------------------------------------ page rules


def test_reset_shows_the_search_page_and_ragens_action_list(env):
    obs, info = env.reset(seed=3)
    first = obs.splitlines()[0]
    assert first == f"WebShop [SEP] Instruction: [SEP] {env.goal.instruction} [SEP] Search"
    assert obs.splitlines()[1:10] == list(TIPS)
    assert obs.endswith("You must choose from these actions: search[<content>].")
    assert env.available_actions() == {"has_search_bar": True, "clickables": ["search"]}
    assert info["page"] == "search" and not info["success"] and info["raw_reward"] == 0.0
    no_tips = WebShopEnv(show_tips=False).reset(seed=3)[0]
    assert no_tips == f"{first}\nYou must choose from these actions: search[<content>]."


def test_search_and_pagination(env):
    env.reset(seed=3)
    obs, reward, term, trunc, info = env.step("search[hoodie machine washable]")
    assert (reward, term, trunc, info["action_is_valid"], info["action_is_effective"]) == (
        0.0,
        False,
        False,
        True,
        True,
    )
    assert len(env.results) == 50 and "Page 1 (Total results: 50) [SEP] Next > [SEP]" in obs
    page1 = env.available_actions()["clickables"]
    assert page1 == ["back to search", "next >"] + [a.lower() for a in env.results[:10]]
    assert f"click[{env.results[0].lower()}]" in obs and "< Prev" not in obs.splitlines()[0]
    env.step("click[next >]")
    assert env.page_no == 2 and env.available_actions()["clickables"][:3] == [
        "back to search",
        "< prev",
        "next >",
    ]
    assert env.results[10] in env._page_text() and env.results[9] not in env._page_text()
    for _ in range(3):
        *_, info = env.step("click[next >]")
    assert env.page_no == 5 and info["end_of_page"] and "Next >" not in env._page_text()
    obs, _, _, _, info = env.step("click[next >]")  # no next page: invalid, page unchanged
    assert (
        not info["action_is_valid"]
        and env.page_no == 5
        and obs.startswith("Invalid action: 'next >' is not")
    )
    env.step("click[< prev]")
    assert env.page_no == 4 and env.results[30] in env._page_text()
    _, _, _, _, info = env.step("search[another query]")  # no search bar on a results page
    assert not info["action_is_valid"] and env.page == "results"
    env.step("click[Back to Search]")  # case-insensitive, like RAGEN's check
    assert env.page == "search" and env.results == []
    *_, info = env.step("search[   ]")
    assert not info["action_is_valid"] and env.page == "search"


def test_product_page_options_subpages_and_buy(fixture_env):
    env = fixture_env
    # natural looking hair extension, jet black, 18 inch, under 30 dollars
    env.reset(options={"goal_index": 0})
    env.step("search[natural looking hair extension]")
    assert env.results[0] == "B0FIX00001"
    obs, *_ = env.step("click[b0fix00001]")
    page = obs.splitlines()[0]
    assert page.endswith(
        "Back to Search [SEP] < Prev [SEP] color [SEP] jet black [SEP] light brown [SEP] ash blonde "
        "[SEP] size [SEP] 16 inch [SEP] 18 inch [SEP] Meadowlark Clip-In Hair Extensions 18 Inch "
        "Natural Looking Straight Synthetic Hairpiece [SEP] Price: $24.99 [SEP] Rating: 4.3 [SEP] "
        "Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
    )
    assert env.available_actions()["clickables"] == [
        "back to search",
        "< prev",
        "jet black",
        "light brown",
        "ash blonde",
        "16 inch",
        "18 inch",
        "description",
        "features",
        "reviews",
        "buy now",
    ]
    env.step("click[light brown]")
    env.step("click[jet black]")  # the same group: replaces the choice
    env.step("click[16 inch]")
    assert env.selected == {"color": "jet black", "size": "16 inch"}
    assert "[SEP] Selected: color: jet black, size: 16 inch [SEP]" in env._page_text()
    *_, info = env.step("click[16 inch]")  # valid, but nothing changes
    assert info["action_is_valid"] and not info["action_is_effective"]
    obs, _, _, _, info = env.step("click[walnut]")  # not an option of this product
    assert not info["action_is_valid"] and obs.startswith(
        "Invalid action: 'walnut' is not a button on this page.\n"
    )
    # model text outside the observation's characters is masked
    obs, *_ = env.step("click[\u00e9t\u00e9]")
    assert obs.startswith("Invalid action: '?t?' is not") and env.observation_space.contains(obs)
    obs, *_ = env.step("click[features]")
    assert obs.splitlines()[0].endswith(
        "< Prev [SEP] NATURAL LOOKING: soft fibre that blends in [SEP] EASY TO USE: "
        "clip in within minutes [SEP] HEAT RESISTANT up to 180C"
    )
    env.step("click[< prev]")
    assert env.page == "item" and env.selected == {"color": "jet black", "size": "16 inch"}
    obs, reward, term, trunc, info = env.step("click[buy now]")
    # r_type 1, attribute 1/1, options: jet black yes, "16 inch" ~ "18 inch" (85.7 > 85) yes, price
    # 24.99 <= 30
    assert info["raw_reward"] == 1.0 and reward == 1.0 and term and not trunc and info["success"]
    assert info["success_purchase"] and info["success_find"] and info["page"] == "done"
    assert obs.startswith("Thank you for shopping with us! [SEP] Purchased [SEP] B0FIX00001")
    again = env.step("click[buy now]")  # after the end: same observation, nothing more
    assert again[:4] == (obs, 0.0, True, False) and not again[4]["action_is_valid"]


def test_buying_without_options_scores_less(fixture_env):
    env = fixture_env
    env.reset(options={"goal_index": 0})
    for action in ("search[natural looking hair extension]", "click[b0fix00001]"):
        env.step(action)
    _, reward, term, _, info = env.step("click[buy now]")
    # (1 attribute + 0 of 2 options + price) / (1 + 2 + 1) = 0.5; RAGEN's binary reward gives 0
    assert term and reward == 0.0 and info["raw_reward"] == 0.5 and not info["success"]
    raw_env = WebShopEnv(catalogue_path=FIXTURE, split_sizes=(1, 1), binary_reward=False)
    raw_env.reset(options={"goal_index": 0})
    for action in ("search[natural looking hair extension]", "click[b0fix00001]"):
        raw_env.step(action)
    assert raw_env.step("click[buy now]")[1] == 0.5


def test_prev_from_product_returns_to_the_same_results_page(env):
    env.reset(seed=5)
    env.step("search[office chair height adjustable]")
    env.step("click[next >]")
    env.step(f"click[{env.results[12]}]")
    assert env.page == "item" and env.product.asin == env.results[12]
    env.step("click[description]")
    assert env.page == "description"
    env.step("click[< prev]")
    env.step("click[< prev]")
    assert env.page == "results" and env.page_no == 2 and env.product is None


def test_malformed_actions_and_max_steps():
    env = WebShopEnv(max_steps=3)
    env.reset(seed=1)
    for text in ("buy it", "click[]", 42):
        obs, reward, term, trunc, info = env.step(text)
        assert not info["action_is_valid"] and reward == 0.0 and not term
    assert trunc and obs.startswith("Invalid action:")  # the third step hits max_steps
    with pytest.raises(ValueError, match="goal_index"):
        env.reset(options={"goal_index": 10**6})
    with pytest.raises(ValueError, match="unknown options"):
        env.reset(options={"asin": "B1"})


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="split must be"):
        WebShopEnv(split="dev")
    with pytest.raises(
        ValueError, match=r"WebShopEnv: max_results must be an integer in \[1, 50\]"
    ):
        WebShopEnv(max_results=60)
    with pytest.raises(ValueError, match=r"has 5 goals; split_sizes \[500, 1000\]"):
        WebShopEnv(catalogue_path=FIXTURE)
    with pytest.raises(FileNotFoundError, match="catalogue_path must be a directory"):
        WebShopEnv(catalogue_path=FIXTURE / "items_shuffle.json")


# ------------------------------------------------------------------------------------------------ splits, catalogue


def test_splits_follow_ragens_rule():
    n, sizes = 3000, (500, 1000)
    order = list(range(n))
    random.Random(42).shuffle(order)
    assert (
        split_goal_index(7, "test", n, sizes) == order[7] == split_goal_index(507, "test", n, sizes)
    )
    assert (
        split_goal_index(7, "val", n, sizes)
        == order[507]
        == split_goal_index(1007, "val", n, sizes)
    )
    assert (
        split_goal_index(7, "train", n, sizes)
        == order[1507]
        == split_goal_index(1507, "train", n, sizes)
    )
    test = {split_goal_index(s, "test", n, sizes) for s in range(2000)}
    val = {split_goal_index(s, "val", n, sizes) for s in range(2000)}
    train = {split_goal_index(s, "train", n, sizes) for s in range(2000)}
    assert (len(test), len(val), len(train)) == (500, 1000, 1500) and not (
        test & val or test & train or val & train
    )
    a, b = WebShopEnv(split="test"), WebShopEnv(split="train")
    assert a.reset(seed=7)[0] != b.reset(seed=7)[0]
    assert a.goal == a.catalogue.goals[order[7]]


def test_generated_catalogue():
    cat = generate_catalogue(0, 3000)
    assert generate_catalogue(0, 3000) is cat
    assert generate_catalogue(1, 50).products != generate_catalogue(0, 50).products
    assert (
        len(cat.products) == len(cat.goals) == 3000 and len({p.asin for p in cat.products}) == 3000
    )
    assert {p.category for p in cat.products} == {
        "beauty",
        "electronics",
        "fashion",
        "grocery",
        "furniture",
    }
    assert len({p.query for p in cat.products}) == 40
    for p, g in zip(cat.products[:300], cat.goals[:300]):
        assert g.asin == p.asin and g.name == p.title and set(g.attributes) <= set(p.attributes)
        assert all(
            v in dict(p.options)[grp] for grp, v in zip(g.option_groups, g.options, strict=True)
        )
        # the larger of two of the first four multiples of 10 above the price: never the first
        assert p.price + 10 < g.price_upper <= p.price + 40 and g.price_upper % 10 == 0
        assert g.instruction.endswith(f", and price lower than {g.price_upper:.2f} dollars")
        # the goal's product with its options is perfect
        assert webshop_reward(p, g, list(g.options))[0] == 1.0
    g = cat.goals[0]
    assert g.instruction == (
        "i need a shampoo that is long lasting with size: 8 fl oz, and price lower than 50.00 "
        "dollars"
    )


def test_the_experts_search_keywords():
    assert (
        search_keywords(
            "i need a shampoo that is long lasting with size: 8 fl oz, and price lower than 50.00 "
            "dollars"
        )
        == "shampoo long lasting"
    )
    assert (
        search_keywords(
            "can you find me a bed frame that is solid wood and heavy duty, and price lower than "
            "300.00 dollars"
        )
        == "bed frame solid wood and heavy duty"
    )
    assert search_keywords("I'm looking for an orange blender") == "orange blender"
    assert search_keywords("i need anchovies") == "anchovies"  # "an" only as a word
    assert search_keywords("i need") == "i need"  # nothing left: the instruction itself


# ------------------------------------------------------------------------------------------------ WebShop's files


def test_the_fixture_in_webshops_schema_loads():
    cat = load_catalogue(FIXTURE)
    assert [p.asin for p in cat.products] == [f"B0FIX0000{i}" for i in range(1, 7)]
    by = cat.by_asin
    # range: lower bound; none: 100
    assert by["b0fix00002"].price == 19.99 and by["b0fix00004"].price == 100.0
    assert by["b0fix00002"].options == (("color", ("jet black", "dark brown | auburn")),)
    assert by["b0fix00003"].bullet_points == (
        "Sulfate free and paraben free. Safe for colour treated hair.",
    )
    assert by["b0fix00001"].attributes == ("natural looking", "easy to use", "heat resistant")
    assert by["b0fix00004"].rating == "N.A." and by["b0fix00001"].rating == "4.3"
    # five human goals (one whose asin is not a product and one without attributes are skipped, as
    # WebShop does)
    assert [g.asin for g in cat.goals] == [
        "B0FIX00001",
        "B0FIX00003",
        "B0FIX00005",
        "B0FIX00005",
        "B0FIX00006",
    ]
    assert cat.goals[0].price_upper == 30.0 and cat.goals[0].options == ("jet black", "18 inch")
    assert cat.goals[0].option_groups == ("color", "size")
    # no price in the instruction: the larger of two of 20, 30, 40, 50 (the bounds above 11.49),
    # appended
    shampoo = cat.goals[1]
    assert shampoo.price_upper in (30.0, 40.0, 50.0)
    assert shampoo.instruction.endswith(f", and price lower than {shampoo.price_upper:.2f} dollars")


def test_synthetic_goals_without_the_human_file(tmp_path):
    for name in ("items_shuffle.json", "items_ins_v2.json"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    cat = load_catalogue(tmp_path, seed=3)
    assert len(cat.goals) == 6  # one per product with an instruction
    hair = cat.goals[0]
    assert hair.instruction.startswith(
        "i want a natural looking clip-in hair extension with color: "
    )
    assert ", and size: " in hair.instruction and hair.instruction.endswith(" dollars")
    assert (
        hair.attributes == ("natural looking",)
        and len(hair.options) == 2
        and hair.option_groups == ("color", "size")
    )
    assert webshop_reward(cat.products[0], hair, list(hair.options))[0] == 1.0


def test_bad_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="items_shuffle"):
        load_catalogue(tmp_path)
    (tmp_path / "items_shuffle.json").write_text("[{")
    with pytest.raises(ValueError, match="items_shuffle.json: invalid JSON"):
        load_catalogue(tmp_path)
    (tmp_path / "items_shuffle.json").write_text(json.dumps([{"asin": "B1"}]))
    with pytest.raises(ValueError, match=r"product 0 \(B1\): needs a non-empty string 'name'"):
        load_catalogue(tmp_path)
    (tmp_path / "items_shuffle.json").write_text(json.dumps([{"asin": "B1", "name": "x"}]))
    with pytest.raises(ValueError, match="no goals"):
        load_catalogue(tmp_path)
    (tmp_path / "items_shuffle_1000.json").write_text("[]")
    with pytest.raises(ValueError, match="several files match"):
        load_catalogue(tmp_path)


def test_a_huge_product_page_is_cut_and_stays_in_the_space(tmp_path):
    # 4000 options: a page of about 48,000 characters
    values = [{"value": f"shade {i:05d}"} for i in range(4000)]
    rows = [
        {
            "asin": "B1",
            "name": "Paint",
            "pricing": "$5.00",
            "customization_options": {"color": values},
            "small_description": [f"point {i}" for i in range(50)],
        }
    ]
    goals = {
        "B1": [{"instruction": f"paint {i}", "instruction_attributes": ["paint"]} for i in range(3)]
    }
    (tmp_path / "items_shuffle.json").write_text(json.dumps(rows))
    (tmp_path / "items_human_ins.json").write_text(json.dumps(goals))
    env = WebShopEnv(catalogue_path=tmp_path, split_sizes=(1, 1))
    assert len(env.catalogue.products[0].bullet_points) == 20  # bullet points kept per product
    env.reset(seed=0)
    env.step("search[paint]")
    obs, *_ = env.step("click[b1]")
    page = obs.split("\n")[0]
    assert len(page) == 32768 + 3 and page.endswith("...")
    # 4000 actions too
    assert len(obs) == 65536 and obs.endswith("...") and env.observation_space.contains(obs)


def test_price_bounds_like_webshop():
    rng = random.Random(0)
    assert {price_upper_for(11.49, rng)[0] for _ in range(200)} == {30.0, 40.0, 50.0}
    assert (
        price_upper_for(11.49, random.Random(1))[1]
        == f", and price lower than {price_upper_for(11.49, random.Random(1))[0]:.2f} dollars"
    )
    # one bound left (990): no limit, no clause
    assert price_upper_for(985.0, rng) == (1_000_000.0, "")


def test_prices_are_parsed_like_webshop():
    assert parse_price("$1,299.50") == 1299.5 and parse_price("$10.00 - $20.00") == 10.0
    assert (
        parse_price([12.5, 9.0]) == 9.0 and parse_price("") == 100.0 and parse_price(None) == 100.0
    )


# ------------------------------------------------------------------------------------------------ expert


def run_expert(env: WebShopEnv, max_actions: int = 1, **reset) -> tuple[list[str], dict, float]:
    env.reset(**reset)
    actions: list[str] = []
    while True:
        _, acts = env.expert_turn(max_actions)
        for action in acts:
            actions.append(action)
            _, reward, term, trunc, info = env.step(action)
            if term or trunc:
                return actions, info, reward


def test_the_expert_buys_a_matching_item_in_most_episodes(env):
    outcomes = [run_expert(env, seed=seed) for seed in range(50)]
    successes = sum(info["success"] for _, info, _ in outcomes)
    assert successes >= 45  # measured: 50 of 50 on the train split of the default catalogue
    assert all(
        actions[0].startswith("search[") and actions[-1] == "click[buy now]"
        for actions, _, _ in outcomes
    )
    assert max(len(a) for a, _, _ in outcomes) <= 9  # RAGEN's max_turn for WebShop


def test_the_expert_turns_pages_to_reach_its_choice():
    # with 2 results per page, seed 85's best result is ranked 5th (page 3): the expert turns two
    # pages first
    env = WebShopEnv(results_per_page=2)
    env.reset(seed=85)
    ranked = [d.id for d in env.retriever.search(search_keywords(env.goal.instruction), 50)]
    assert ranked.index(env._expert_plan()[1]) == 4
    actions, info, _ = run_expert(env, seed=85)
    assert (
        actions[1:4] == ["click[next >]", "click[next >]", f"click[{ranked[4].lower()}]"]
        and info["success"]
    )


def test_the_expert_several_actions_per_turn_and_on_the_fixture(fixture_env):
    env = fixture_env
    env.reset(options={"goal_index": 0})
    assert env.expert_turn(1) == (
        "I search for the type and features",
        ("search[natural looking hair extension in jet black, 18 inch]",),
    )
    env.step("search[natural looking hair extension]")
    assert env.expert_turn(1) == ("Result 1 on this page matches best", ("click[b0fix00001]",))
    env.step("click[b0fix00001]")
    thought, acts = env.expert_turn(3)
    assert (
        acts == ("click[jet black]", "click[18 inch]", "click[buy now]")
        and thought == "I choose jet black, 18 inch"
    )
    for i in range(len(env.catalogue.goals)):
        _, info, reward = run_expert(env, max_actions=2, options={"goal_index": i})
        assert reward == 1.0 and info["success_find"], i


def test_same_seed_same_expert_episode():
    a, b = WebShopEnv(), WebShopEnv()
    assert run_expert(a, seed=11) == run_expert(b, seed=11)
    assert a.render() is None and WebShopEnv(render_mode="ansi").reset(seed=2)[0].startswith(
        "WebShop [SEP]"
    )


def test_expert_demonstrations_through_the_runner_succeed(tiny_tokenizer):
    from ragen_lightning.rollout.settings import EpisodeSettings
    from ragen_lightning.sft.experts import collect_demonstrations

    episode = EpisodeSettings(
        max_turns=9,
        max_actions_per_turn=1,
        max_actions_per_episode=9,
        max_new_tokens=256,
        max_model_len=32768,
    )
    trajs = collect_demonstrations(
        "ragen/WebShop-v0", tiny_tokenizer, list(range(4)), episode=episode
    )
    assert all(t.success and t.env_return == 1.0 and t.num_format_errors == 0 for t in trajs)
