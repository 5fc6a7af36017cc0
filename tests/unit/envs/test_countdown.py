"""CountdownEnv: exact ast-based checking, generated instances are solvable, 0 / 0.1 / 1 rewards."""

from fractions import Fraction

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  (registers the ids)
from envs.text.countdown import CountdownEnv, evaluate_expression, solve_countdown


def _env(target=24, nums=(3, 3, 8, 8)) -> CountdownEnv:
    env = CountdownEnv()
    env.reset(seed=0, options={"target": target, "nums": list(nums)})
    return env


def test_check_env():
    # made through the registry so render modes are checked
    check_env(gym.make("ragen/Countdown-v0").unwrapped)


@pytest.mark.parametrize(
    "text, value, numbers",
    [
        ("(44 - 19) * 4 - 35", 65, [44, 19, 4, 35]),  # 25 * 4 = 100, 100 - 35 = 65
        # 3 - 8/3 = 1/3, 8 / (1/3) = 24: needs exact fractions
        ("8 / (3 - 8 / 3)", 24, [8, 3, 8, 3]),
        ("-3 + 5", 2, [3, 5]),
        ("+7 - -2", 9, [7, 2]),
        ("6 × 2 ÷ 3 − 1", 3, [6, 2, 3, 1]),  # typographic operators: 12 / 3 - 1 = 3
        ("  2+5-3 ", 4, [2, 5, 3]),
        ("7 / 2", Fraction(7, 2), [7, 2]),
    ],
)
def test_evaluate_expression(text, value, numbers):
    assert evaluate_expression(text) == (value, numbers)


@pytest.mark.parametrize(
    "text",
    [
        "2 ** 3",
        "abs(3)",
        "2.5 + 1",
        "__import__('os').system('true')",
        "2 + 5 - 3 = 4",
        "(((",
        "",
        "x + 1",
        "3 // 2",
        "3 % 2",
        "[1, 2]",
        "1e3",
        "True + 1",
        "(" * 300 + "1" + ")" * 300,  # nested too deeply for the parser
        "1 + " * 300 + "1",
    ],  # over 1024 characters
)
def test_evaluate_expression_rejects_non_arithmetic(text):
    with pytest.raises(ValueError):
        evaluate_expression(text)


def test_evaluate_expression_division_by_zero_keeps_numbers():
    with pytest.raises(ZeroDivisionError) as exc:
        evaluate_expression("8 / (3 - 3) + 8")
    assert exc.value.numbers == [8, 3, 3, 8]


@pytest.mark.parametrize(
    "answer, reward",
    [
        ("8 / (3 - 8 / 3)", 1.0),  # correct: all four numbers, exact value 24
        ("(8 / (3 - (8 / 3)))", 1.0),  # redundant parentheses are fine
        ("8 + 8 + 3 + 3", 0.1),  # right numbers, 22 != 24
        ("8 / (3 - 3) + 8", 0.1),  # right numbers, division by zero
        ("8 * 3", 0.0),  # numbers missing
        ("8 * 3 * 3 / 3", 0.0),  # 3 used three times, one 8 missing
        ("8 * 3 + 8 - 8 + 3 - 3", 0.0),  # numbers reused
        ("24 + 3 - 3 + 8 - 8", 0.0),  # foreign number 24
        ("the answer is 24", 0.0),  # not arithmetic
        # '=' is not part of an expression (the target is a foreign number too)
        ("8 / (3 - 8 / 3) = 24", 0.0),
        ("", 0.0),
        (24, 0.0),  # wrong type
        (None, 0.0),
    ],
)
def test_step_rewards(answer, reward):
    env = _env()
    obs, r, terminated, truncated, info = env.step(answer)
    assert r == reward
    assert obs == f"Your answer get {reward} points."
    assert terminated and not truncated
    assert info == {
        "success": reward == 1.0,
        "action_is_valid": reward > 0,
        "action_is_effective": reward > 0,
    }


def test_custom_scores():
    env = CountdownEnv(format_score=0.2, score=2.0)
    env.reset(options={"target": 5, "nums": [2, 3]})
    assert env.step("2 + 3")[1] == 2.0
    env.reset(options={"target": 5, "nums": [2, 3]})
    assert env.step("2 * 3")[1] == 0.2


def test_observation_format():
    env = CountdownEnv()
    obs, info = env.reset(options={"target": 98, "nums": [44, 19, 35]})
    assert obs == "Target: 98, nums: [44, 19, 35]"
    assert info["success"] is False


def test_generated_instances_are_solvable_and_in_range():
    env = CountdownEnv()
    sizes = set()
    for seed in range(300):
        obs, _ = env.reset(seed=seed)
        assert obs == f"Target: {env.target}, nums: {env.nums}"
        sizes.add(len(env.nums))
        assert all(1 <= n <= 99 for n in env.nums)
        assert isinstance(env.target, int) and 1 <= env.target <= 100
        solution = solve_countdown(env.nums, env.target)
        assert solution is not None, (env.nums, env.target)
        assert env.check_answer(solution) == 1.0
    assert sizes == {3, 4}


def test_solver():
    assert evaluate_expression(solve_countdown([1, 5, 5, 5], 24))[0] == 24  # needs 5 * (5 - 1/5)
    assert solve_countdown([2, 3], 7) is None  # 2+3, 2*3, 3-2, 3/2, ... never 7
    assert solve_countdown([44, 19, 35], 98) == "44 + 19 + 35"
    assert solve_countdown([], 1) is None


def test_generation_options():
    env = CountdownEnv(min_numbers=4, max_numbers=4, max_number=9, max_target=20)
    for seed in range(20):
        env.reset(seed=seed)
        assert len(env.nums) == 4 and max(env.nums) <= 9 and env.target <= 20


def test_determinism():
    a, b = CountdownEnv(), CountdownEnv()
    assert [a.reset(seed=s)[0] for s in range(5)] == [b.reset(seed=s)[0] for s in range(5)]
    assert len({a.reset(seed=s)[0] for s in range(10)}) == 10


def test_step_after_end_and_before_reset():
    env = CountdownEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("1 + 2")
    env = _env()
    obs, *_ = env.step("8 / (3 - 8 / 3)")
    obs2, reward, terminated, truncated, info = env.step("8 / (3 - 8 / 3)")
    assert (obs2, reward, terminated, truncated) == (obs, 0.0, True, False)
    assert info["action_is_valid"] is False


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"min_numbers": 1}, "min_numbers"),
        ({"min_numbers": 4, "max_numbers": 3}, "max_numbers"),
        ({"max_number": 0}, "max_number"),
        ({"max_target": 0}, "max_target"),
    ],
)
def test_constructor_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        CountdownEnv(**kwargs)


def test_bad_options():
    env = CountdownEnv()
    with pytest.raises(ValueError, match="unknown options"):
        env.reset(options={"goal": 3})
    with pytest.raises(ValueError, match="both"):
        env.reset(options={"target": 3})
