"""MetaMathQAEnv: shipped data = generator output, 1/2**k reward schedule, answer matching, file
loading errors."""

import json
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  (registers the ids)
from envs.text.metamathqa import (
    CORRECT_TEXT,
    DEFAULT_PATH,
    INCORRECT_TEXT,
    MetaMathQAEnv,
    answers_match,
    arithmetic_qa_jsonl,
    generate_arithmetic_qa,
    load_qa_items,
)


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_shipped_file_equals_generator_output():
    # Regenerate with `python -m envs.text.metamathqa` after changing the generator.
    assert DEFAULT_PATH.read_text(encoding="utf-8") == arithmetic_qa_jsonl()


def test_generator_is_deterministic_and_well_formed():
    items = generate_arithmetic_qa()
    assert items == generate_arithmetic_qa()
    assert len(items) == 300 and len({i["query"] for i in items}) == 300
    assert items[0] == {  # template 0 (addition): 58 + 59 = 117
        "query": "Priya has 58 apples. Then Priya gets 59 more apples. How many apples does Priya have now?",
        "response": "Priya starts with 58 apples and gets 59 more, so Priya has 58 + 59 = 117 apples.\n"
        "The answer is: 117",
    }
    for _, label in load_qa_items(DEFAULT_PATH):
        assert label.isdigit()  # every answer is a non-negative integer
    assert generate_arithmetic_qa(5, seed=1) != generate_arithmetic_qa(5, seed=0)


def test_check_env_default_dataset():
    check_env(gym.make("ragen/MetaMathQA-v0").unwrapped)


def test_reset_picks_by_seed_and_observation_is_the_question():
    env = MetaMathQAEnv()
    obs, info = env.reset(seed=5)
    assert obs == env.question == env.items[env.index][0]
    assert info == {
        "success": False,
        "action_is_valid": True,
        "action_is_effective": False,
        "attempts": 0,
    }
    assert MetaMathQAEnv().reset(seed=5)[0] == obs
    assert len({env.reset(seed=s)[0] for s in range(10)}) > 1
    assert env.prompt_spec().instruction == "You are solving Math problems. "


@pytest.mark.parametrize("correct_on, reward", [(0, 1.0), (1, 0.5), (2, 0.25)])
def test_reward_halves_with_each_attempt(correct_on, reward):
    env = MetaMathQAEnv(max_attempts=3)
    env.reset(options={"index": 0})  # label "117"
    for k in range(correct_on):
        obs, r, terminated, truncated, info = env.step("116")
        assert (obs, r, terminated, truncated) == (INCORRECT_TEXT, 0.0, False, False)
        assert info["action_is_valid"] and not info["success"] and info["attempts"] == k + 1
    obs, r, terminated, truncated, info = env.step(" 117 ")
    assert (obs, r, terminated, truncated) == (CORRECT_TEXT, reward, True, False)
    assert info["success"] and info["action_is_effective"]


def test_truncated_after_max_attempts_and_step_after_end():
    env = MetaMathQAEnv(max_attempts=2)
    env.reset(options={"index": 0})
    assert env.step("1")[2:4] == (False, False)
    obs, r, terminated, truncated, info = env.step("2")
    assert (obs, r, terminated, truncated) == (INCORRECT_TEXT, 0.0, False, True)
    # After the end: harmless, even with the right answer.
    obs, r, terminated, truncated, info = env.step("117")
    assert (obs, r, terminated, truncated) == (INCORRECT_TEXT, 0.0, False, True)
    assert info["action_is_valid"] is False


@pytest.mark.parametrize("bad", ["", "   \n", None, 117, ["117"]])
def test_invalid_answers_use_an_attempt(bad):
    env = MetaMathQAEnv()
    env.reset(options={"index": 0})
    obs, r, terminated, truncated, info = env.step(bad)
    assert (obs, r, terminated, truncated) == (INCORRECT_TEXT, 0.0, False, False)
    assert info["action_is_valid"] is False and info["attempts"] == 1
    assert env.step("117")[1] == 0.5  # the second attempt


@pytest.mark.parametrize(
    "answer, label",
    [
        (" 12 ", "12"),
        ("12.0", "12"),
        ("1/2", "0.5"),
        ("1,000", "1000"),
        ("ABC", "a b c"),
        ("-3", "-3.00"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),
        ("x = 5", "x=5"),
        ("2.50", "5/2"),
    ],
)
def test_answers_that_match(answer, label):
    assert answers_match(answer, label)


@pytest.mark.parametrize(
    "answer, label",
    [("13", "12"), ("12a", "12"), ("1,00", "100"), ("0.333", "1/3"), ("nan", "12"), ("", "12")],
)
def test_answers_that_do_not_match(answer, label):
    assert not answers_match(answer, label)


def test_load_both_schemas(tmp_path):
    path = _write_jsonl(
        tmp_path / "qa.jsonl",
        [
            {"query": "What is 2+2?", "response": "2+2=4.\nThe answer is: 4"},
            {"question": "Capital of France?", "answer": "Paris"},
            {"question": "How many legs has a spider?", "answer": 8},
        ],
    )
    assert load_qa_items(path) == (
        ("What is 2+2?", "4"),
        ("Capital of France?", "Paris"),
        ("How many legs has a spider?", "8"),
    )
    env = MetaMathQAEnv(path=path)
    env.reset(options={"index": 1})
    assert env.step("paris")[1] == 1.0


def test_non_ascii_questions_are_in_the_observation_space(tmp_path):
    path = _write_jsonl(
        tmp_path / "pi.jsonl", [{"question": "Round π to 2 decimals (≈).", "answer": "3.14"}]
    )
    env = gym.make("ragen/MetaMathQA-v0", path=path).unwrapped
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    check_env(env)


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"question": "q", "answer": "1"}\n{not json\n', r"bad\.jsonl:2: invalid JSON"),
        ('{"question": "q"}\n', r"bad\.jsonl:1: needs fields"),
        (
            '{"query": "q", "response": "no label here"}\n',
            r"bad\.jsonl:1: 'response' has no final line",
        ),
        (
            '{"query": "q", "response": "The answer is: 3\\nand more"}\n',
            r"bad\.jsonl:1: 'response' has no final",
        ),
        ('{"question": "q", "answer": ""}\n', r"bad\.jsonl:1: empty answer"),
        ('{"question": "  ", "answer": "1"}\n', r"bad\.jsonl:1: empty question"),
        ('{"question": "q", "answer": null}\n', r"bad\.jsonl:1: 'answer' must be"),
        ("[1, 2]\n", r"bad\.jsonl:1: expected a JSON object"),
        ("\n\n", r"bad\.jsonl: no questions"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        MetaMathQAEnv(path=path)


def test_missing_file_and_unsupported_extension(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        MetaMathQAEnv(path=tmp_path / "nope.jsonl")
    (tmp_path / "qa.csv").write_text("question,answer\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\.jsonl or \.parquet"):
        MetaMathQAEnv(path=tmp_path / "qa.csv")


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"query": ["What is 3*3?"], "response": ["3*3=9.\nThe answer is: 9"]}),
        tmp_path / "qa.parquet",
    )
    env = MetaMathQAEnv(path=tmp_path / "qa.parquet")
    assert env.reset(seed=0)[0] == "What is 3*3?"
    assert env.step("9")[1] == 1.0

    pq.write_table(pa.table({"query": ["q"], "response": ["nothing"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet: row 0"):
        MetaMathQAEnv(path=tmp_path / "bad.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="junk.parquet: not a readable parquet"):
        MetaMathQAEnv(path=tmp_path / "junk.parquet")


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path, monkeypatch):
    path = tmp_path / "other.parquet"
    path.write_bytes(b"x")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match="needs pyarrow"):
        MetaMathQAEnv(path=path)


def test_constructor_and_option_errors():
    with pytest.raises(ValueError, match="max_attempts"):
        MetaMathQAEnv(max_attempts=0)
    env = MetaMathQAEnv()
    with pytest.raises(ValueError, match="index"):
        env.reset(options={"index": 10_000})
    with pytest.raises(ValueError, match="unknown options"):
        env.reset(options={"question": 1})
    with pytest.raises(RuntimeError, match="reset"):
        MetaMathQAEnv().step("1")
