"""DeepCoder: generated problems and their references, the partial-credit reward, validity rules,
DeepCoder-style data files (jsonl and parquet, function and stdin tests), and the expert. Candidates
run in the real sandbox (bubblewrap), so these tests take tens of milliseconds each on an idle
machine."""

from __future__ import annotations

import json
import re

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.tools.code import env as deepcoder
from envs.tools.code.env import DeepCoderEnv, defines, extract_code
from envs.tools.code.problems import FAMILIES, generate_problem, load_problems
from envs.tools.code.sandbox import Sandbox

ADD = {
    "problem": "Add two numbers.",
    "fn_name": "add",
    "solution": "def add(a, b):\n    return a + b\n",
    "tests": [
        {"input": [1, 2], "output": 3, "testtype": "functional"},
        # LiveCodeBench's string form
        {"input": "5\n7", "output": "12", "testtype": "functional"},
        {"input": [[1], [2]], "output": [1, 2], "testtype": "functional"},
        {"input": [0, 1], "output": 1, "testtype": "functional"},
    ],
}
ECHO = {
    "problem": "Read n, print n doubled, then 'done'.",
    "starter_code": "",
    "tests": json.dumps(
        [{"input": "4\n", "output": "8\ndone\n"}, {"input": "10\n", "output": "20\ndone"}]
    ),
}
LEETCODE = {
    "problem": "Negate.",
    "metadata": json.dumps({"func_name": "negate"}),
    "tests": [{"input": [3], "output": -3}, {"input": [0], "output": 0}],
}


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture()
def data_env(tmp_path) -> DeepCoderEnv:
    return DeepCoderEnv(data_path=write_jsonl(tmp_path / "p.jsonl", [ADD, ECHO, LEETCODE]))


def answer(env: DeepCoderEnv, index: int, code: str):
    env.reset(seed=0, options={"index": index})
    return env.step(code)


def test_partial_credit_is_the_fraction_of_tests_passed(data_env):
    # a + b passes tests 1, 2 and 4; on lists it concatenates ([1] + [2] = [1, 2]): all 4 pass
    obs, reward, terminated, truncated, info = answer(data_env, 0, ADD["solution"])
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert obs == "Passed 4 of 4 tests."
    # max(a, b): 2 != 3, 7 != 12, max([1], [2]) = [2] != [1, 2], max(0, 1) = 1 == 1: 1 of 4
    obs, reward, terminated, _, info = answer(data_env, 0, "def add(a, b):\n    return max(a, b)\n")
    assert reward == 0.25 and terminated and not info["success"] and info["action_is_effective"]
    assert (info["passed"], info["total"]) == (1, 4)
    assert obs == "Passed 1 of 4 tests. First failure: test 1 returned a wrong value."
    # a crash on one test does not lose the others: int arithmetic fails only on the lists (test 3)
    code = "def add(a, b):\n    assert isinstance(a, int)\n    return a + b\n"
    obs, reward, *_ = answer(data_env, 0, code)
    assert (
        reward == 0.75
        and obs == "Passed 3 of 4 tests. First failure: test 3 raised AssertionError."
    )


def test_code_that_does_not_compile_or_define_the_function_scores_zero_without_a_run(
    data_env, monkeypatch
):
    def no_run(*args, **kwargs):
        raise AssertionError("the sandbox must not run")

    monkeypatch.setattr(Sandbox, "run", no_run)
    for code, note in [
        ("def add(a, b) return a", "the code does not compile"),
        ("", "the code does not compile"),
        ("x" * 9000, "the code does not compile"),
        ("def plus(a, b):\n    return a + b", "the code does not define add"),
    ]:
        obs, reward, terminated, _, info = answer(data_env, 0, code)
        assert (reward, terminated, info["action_is_valid"], info["success"]) == (
            0.0,
            True,
            False,
            False,
        )
        assert obs == f"Passed 0 of 4 tests. First failure: {note}."
    assert defines("class Solution:\n    def add(self, a, b): pass", "add")
    assert defines("add = lambda a, b: a + b", "add") and defines("from operator import add", "add")
    assert not defines("def outer():\n    def add(): pass", "add")


def test_stdin_problems_compare_stripped_lines(data_env):
    # trailing spaces and newline do not matter
    code = "n = int(input())\nprint(2 * n)\nprint('done')   \n"
    _, reward, _, _, info = answer(data_env, 1, code)
    assert reward == 1.0 and info["success"]
    _, reward, *_ = answer(data_env, 1, "print(int(input()) * 2)\n")  # 'done' missing
    assert reward == 0.0
    _, reward, *_ = answer(
        data_env,
        1,
        "import sys\nn = int(sys.stdin.read())\nprint(8 if n == 4 else 0)\nprint('done')",
    )
    assert reward == 0.5


def test_a_solution_class_is_called_like_deepcoder(data_env):
    code = "class Solution:\n    def negate(self, x):\n        return -x\n"
    _, reward, *_ = answer(data_env, 2, code)
    assert reward == 1.0
    # 3 -> 3 wrong, 0 -> 0 right
    _, reward, *_ = answer(data_env, 2, "def negate(x):\n    return x\n")
    assert reward == 0.5


def test_a_fenced_answer_is_taken_from_its_fence(data_env):
    text = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert extract_code(text) == "def add(a, b):\n    return a + b"
    assert answer(data_env, 0, text)[1] == 1.0
    assert extract_code("  def f(): pass  ") == "  def f(): pass"


def test_more_attempts_keep_the_episode_going():
    env = DeepCoderEnv(max_attempts=2)
    env.reset(seed=4)
    _, reward, terminated, truncated, _ = env.step("def nothing():\n    pass")
    assert (reward, terminated, truncated) == (0.0, False, False)
    _, reward, terminated, truncated, info = env.step(env.expert_turn(1)[1][0])
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    _obs, reward, terminated, _, info = env.step("anything")  # after the end
    assert (reward, terminated, info["action_is_valid"]) == (0.0, True, False)


def test_every_family_reference_passes_its_generated_tests():
    box = Sandbox()
    rng = np.random.default_rng(0)
    seen = set()
    while len(seen) < len(FAMILIES):
        problem = generate_problem(rng)
        if problem.fn_name in seen:
            continue
        seen.add(problem.fn_name)
        verdict = deepcoder.judge(problem, problem.solution, box)
        assert (verdict.passed, verdict.total) == (8, 8), (problem.fn_name, verdict)
        assert problem.statement.startswith(f"Write a Python function `{problem.fn_name}(")
        assert re.search(rf"\n\nStarter code:\ndef {problem.fn_name}\(\w+\):$", problem.statement)


def test_generated_statements_show_the_first_tests_as_examples():
    problem = generate_problem(np.random.default_rng(0))
    # seed 0 draws max_window with k = 3 (checked by hand from the statement)
    assert problem.fn_name == "max_window" and "3 consecutive numbers" in problem.statement
    assert "max_window([-4, -4, -9, -8, -9]) == -17" in problem.statement  # -4 - 4 - 9
    assert problem.inputs[0] == [[-4, -4, -9, -8, -9]] and problem.outputs[0] == "-17"
    assert len({json.dumps(i) for i in problem.inputs}) == 8  # distinct tests


def test_same_seed_same_problem_and_expert_solves_generated_problems():
    env = gym.make("ragen/DeepCoder-v0").unwrapped
    assert env.reset(seed=11)[0] == gym.make("ragen/DeepCoder-v0").unwrapped.reset(seed=11)[0]
    successes = 0
    for seed in range(8):
        env.reset(seed=seed)
        reasoning, actions = env.expert_turn(1)
        assert reasoning.startswith("I write the function ") and len(actions) == 1
        successes += env.step(actions[0])[4]["success"]
    assert successes == 8


def test_parquet_files_and_data_errors_name_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    rows = [
        {
            "problem": ADD["problem"],
            "fn_name": "add",
            "solution": ADD["solution"],
            "tests": json.dumps(ADD["tests"]),
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    env = DeepCoderEnv(data_path=str(path))
    env.reset(seed=0)
    assert env.step(env.expert_turn(1)[1][0])[1] == 1.0
    bad = [
        ({"problem": "x"}, "'tests' must be a non-empty list"),
        ({"problem": "x", "tests": [{"input": [1], "output": 1}]}, "stdin tests need string"),
        (
            {"problem": "x", "tests": [{"input": "1", "output": "1", "testtype": "functional"}]},
            "need 'fn_name'",
        ),
        ({"tests": [{"input": "", "output": ""}]}, "needs a non-empty string field 'problem'"),
        (
            {"problem": "x", "fn_name": "not valid", "tests": [{"input": [], "output": 1}]},
            "Python identifier",
        ),
    ]
    for k, (row, message) in enumerate(bad):
        file = write_jsonl(tmp_path / f"bad{k}.jsonl", [ADD, row])
        with pytest.raises(ValueError, match=f"bad{k}.jsonl:2: .*{message}"):
            load_problems(file)
    with pytest.raises(ValueError, match="must end in .jsonl or .parquet"):
        DeepCoderEnv(data_path=str(tmp_path / "p.csv"))
    env = DeepCoderEnv(data_path=write_jsonl(tmp_path / "nosol.jsonl", [ECHO]))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="no reference solution"):
        env.expert_turn(1)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_examples"):
        DeepCoderEnv(num_tests=2, num_examples=3)
    with pytest.raises(ValueError, match="max_attempts"):
        DeepCoderEnv(max_attempts=0)
    with pytest.raises(ValueError, match="needs a data_path"):
        DeepCoderEnv().reset(seed=0, options={"index": 0})


def test_expert_demonstrations_through_the_runner_succeed(tiny_tokenizer):
    from ragen_lightning.rollout.settings import EpisodeSettings
    from ragen_lightning.sft.experts import collect_demonstrations

    episode = EpisodeSettings(
        max_turns=1,
        max_actions_per_turn=1,
        max_actions_per_episode=1,
        max_new_tokens=1024,
        max_model_len=4096,
    )
    trajs = collect_demonstrations(
        "ragen/DeepCoder-v0", tiny_tokenizer, list(range(6)), episode=episode
    )
    # the code survives the <answer> parsing (no || splitting, whitespace kept) and passes every
    # test in the sandbox
    assert all(t.success and t.env_return == 1.0 and t.num_format_errors == 0 for t in trajs)
