"""Expert demonstrations: the environments' own solvers answer in the exact text and token format of RL rollouts.

An :class:`ExpertEngine` is a :class:`~ragen_lightning.rollout.engine.GenerationEngine` that ignores the prompt and
answers from the env state (the runner hands it ``env.unwrapped`` of every request because it sets
``needs_envs = True``). Demonstrations are therefore produced by the real
:class:`~ragen_lightning.rollout.runner.RolloutRunner`: same system prompt, turn blocks, reward feedback, context
window and token ids as an RL rollout, with loss mask 1 exactly on the expert's response tokens (RAGEN v1 shipped a
supervised step on solver trajectories; it rendered them through its own text pipeline, here they are token-exact).

One expert per env class, chosen in one place (:data:`EXPERTS`). Each returns an :class:`ExpertTurn`: a short,
deterministic reasoning sentence derived from the state (the tiny model learns to imitate it, so it stays short and
says something true about the board) and the action words / answer strings of this turn.

Experts read the env's public state and solvers duck-typed (this library never imports the ``envs`` package; a
solver function that lives next to an env class is looked up through the env's own module). An env class with no
expert raises a ``KeyError`` naming the class and the envs that have one.
"""

from __future__ import annotations

import importlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ragen_lightning.rollout import prompting
from ragen_lightning.rollout.engine import Generation, SamplingParams

__all__ = [
    "EXPERTS",
    "ExpertEngine",
    "ExpertTurn",
    "collect_demonstrations",
    "expert_actions",
    "expert_turn",
    "render_response",
]

_DIRECTIONS = ("Up", "Down", "Left", "Right")
_DELTAS = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


@dataclass(frozen=True)
class ExpertTurn:
    """One expert answer.

    Attributes:
        reasoning: the text placed between ``<think>`` and ``</think>`` (dropped when thinking is off).
        actions: action words (discrete envs, ``env.action_names`` spelling) or answer strings (free-text envs).
    """

    reasoning: str
    actions: tuple[str, ...]


# ----------------------------------------------------------------------------------------------------------------
# reasoning helpers
# ----------------------------------------------------------------------------------------------------------------


def relation(a: tuple[int, int], b: tuple[int, int]) -> str:
    """Where cell ``a`` lies relative to cell ``b``: ``"above and left of"``, ``"below"``, ``"right of"``, ``"at"``."""
    vertical = "above" if a[0] < b[0] else "below" if a[0] > b[0] else ""
    horizontal = "left of" if a[1] < b[1] else "right of" if a[1] > b[1] else ""
    if vertical and horizontal:
        return f"{vertical} and {horizontal}"
    return vertical or horizontal or "at"


def _go(actions: Sequence[str]) -> str:
    return "I go " + ", ".join(actions)


# ----------------------------------------------------------------------------------------------------------------
# per-env experts: (env.unwrapped, max_actions) -> ExpertTurn
# ----------------------------------------------------------------------------------------------------------------


def sokoban_expert(env: Any, max_actions: int) -> ExpertTurn:
    """The first ``max_actions`` steps of a shortest solution (``env.solve()``) from the current state.

    Reasoning: where the first box that is off a target lies relative to the nearest free target, then the moves,
    e.g. ``"box is above and left of target; I go Down, Right"``.
    """
    plan = env.solve()
    names = tuple(env.action_names)
    if not plan:  # None: unsolvable from here (cannot happen on an expert's own path); []: already solved
        return ExpertTurn("no push can solve this any more; I go " + names[0], (names[0],))
    actions = tuple(names[a] for a in plan[:max_actions])
    state, fixed = np.asarray(env.room_state), np.asarray(env.room_fixed)
    boxes = [tuple(int(x) for x in rc) for rc in np.argwhere(state == 4)]
    targets = [tuple(int(x) for x in rc) for rc in np.argwhere((fixed == 2) & (state != 3))]
    if boxes and targets:
        box = boxes[0]
        target = min(targets, key=lambda t: (abs(t[0] - box[0]) + abs(t[1] - box[1]), t))
        return ExpertTurn(f"box is {relation(box, target)} target; {_go(actions)}", actions)
    return ExpertTurn(_go(actions), actions)


def frozen_lake_expert(env: Any, max_actions: int) -> ExpertTurn:
    """Deterministic ice: the first ``max_actions`` steps of the shortest path (``env.solve()``). Slippery ice: the
    optimal policy's action (``env.optimal_policy()``) at the player's cell, then at the cell that action intends to
    reach, and so on up to ``max_actions`` (stopping at the goal or a hole).

    After a slip the later actions of a slippery turn were chosen for the wrong cell, but a turn budget binds harder:
    with RAGEN's 5 turns x 2 actions the expert succeeds in 83 % of episodes this way against 65 % with one action
    per turn (512 default maps, success rate 0.8).

    Reasoning: ``"goal is below and right of me; I go Down, Right"`` (``"...; ice is slippery, I go ..."``).
    """
    names = tuple(env.action_names)
    pos = tuple(env.player_position)
    goal = next((r, c) for r, row in enumerate(env.desc) for c, ch in enumerate(row) if ch == "G")
    where = f"goal is {relation(goal, pos)} me"
    if env.success_rate >= 1.0:
        plan = env.solve()
        if not plan:
            return ExpertTurn(f"{where}; no safe path, I go {names[0]}", (names[0],))
        actions = tuple(names[a] for a in plan[:max_actions])
        return ExpertTurn(f"{where}; {_go(actions)}", actions)
    policy = _slippery_policy(env)
    actions: list[str] = []
    cell = pos
    while len(actions) < max_actions:
        action = names[int(policy[cell])]
        actions.append(action)
        dr, dc = _DELTAS[action]
        cell = (min(max(cell[0] + dr, 0), env.nrow - 1), min(max(cell[1] + dc, 0), env.ncol - 1))
        if env.desc[cell[0]][cell[1]] in "GH":
            break
    return ExpertTurn(f"{where}; ice is slippery, {_go(actions)}", tuple(actions))


_POLICY_CACHE: dict[tuple, np.ndarray] = {}


def _slippery_policy(env: Any) -> np.ndarray:
    """``env.optimal_policy()[0]``, cached per (map, success rate): value iteration takes ~0.1 s and an episode asks
    every turn."""
    key = (tuple(env.desc), float(env.success_rate))
    if key not in _POLICY_CACHE:
        if len(_POLICY_CACHE) >= 4096:
            _POLICY_CACHE.clear()
        _POLICY_CACHE[key] = env.optimal_policy()[0]
    return _POLICY_CACHE[key]


def bandit_expert(env: Any, max_actions: int) -> ExpertTurn:
    """The risky arm (the higher expected reward): ``env.hi_arm_name``. The reasoning names no arm: the tiny model
    learns to copy a multi-token arm name slowly, and with one name to copy instead of two it answered in format
    0.64 vs 0.39 of the time after 300 steps."""
    hi = env.hi_arm_name
    return ExpertTurn("the riskier arm pays more on average", (hi,))


def countdown_expert(env: Any, max_actions: int) -> ExpertTurn:
    """The solver's equation (``solve_countdown`` of the env's own module) for the current numbers and target."""
    # looked up through the env's module: this library never imports the envs package itself
    solve_countdown = getattr(importlib.import_module(type(env).__module__), "solve_countdown")
    expr = solve_countdown(list(env.nums), int(env.target))
    if expr is None:  # generated instances always have one; a hand-set instance might not
        expr = " + ".join(str(n) for n in env.nums)
        return ExpertTurn(f"no exact equation; closest try {expr}", (expr,))
    return ExpertTurn(f"{expr} = {env.target}", (expr,))


def metamathqa_expert(env: Any, max_actions: int) -> ExpertTurn:
    """The item's label (``env.answer``)."""
    return ExpertTurn(f"the answer is {env.answer}", (str(env.answer),))


def sudoku_expert(env: Any, max_actions: int) -> ExpertTurn:
    """Up to ``max_actions`` correct placements (``place N at row R col C``, 1-indexed) from ``env.solution``, the
    most constrained empty cells first (fewest legal numbers, then row-major). Placements from the unique solution
    never conflict with each other, so their order within a turn does not matter."""
    board, solution = np.asarray(env.board), np.asarray(env.solution)
    empty = [(int(r), int(c)) for r, c in np.argwhere(board == 0)]
    if not empty:
        return ExpertTurn("the grid is full", ("place 1 at row 1 col 1",))
    options = {rc: len(env.valid_numbers(*rc)) for rc in empty}
    cells = sorted(empty, key=lambda rc: (options[rc], rc))[:max_actions]
    actions = tuple(f"place {int(solution[r, c])} at row {r + 1} col {c + 1}" for r, c in cells)
    r, c = cells[0]
    why = "can only be" if options[(r, c)] == 1 else "must be"
    return ExpertTurn(f"row {r + 1} col {c + 1} {why} {int(solution[r, c])}", actions)


# -- 2048 -------------------------------------------------------------------------------------------------------


def _slide_row_left(row: Sequence[int]) -> tuple[list[int], int]:
    """One 2048 row slid left: merged row and the score gained (each merge scores the new tile's value)."""
    tiles = [v for v in row if v]
    out, score, i = [], 0, 0
    while i < len(tiles):
        if i + 1 < len(tiles) and tiles[i] == tiles[i + 1]:
            out.append(tiles[i] * 2)
            score += tiles[i] * 2
            i += 2
        else:
            out.append(tiles[i])
            i += 1
    return out + [0] * (len(row) - len(out)), score


def slide_2048(board: np.ndarray, direction: str) -> tuple[np.ndarray, int]:
    """``board`` after sliding in ``direction`` (Up/Down/Left/Right) and the merge score; no tile is spawned."""
    b = np.asarray(board)
    turns = {"Left": 0, "Up": 1, "Right": 2, "Down": 3}[direction]  # rotate so the move becomes a left slide
    rotated = np.rot90(b, turns)
    rows, score = [], 0
    for row in rotated.tolist():
        slid, s = _slide_row_left(row)
        rows.append(slid)
        score += s
    return np.rot90(np.array(rows, dtype=b.dtype), -turns), score


def game_2048_expert(env: Any, max_actions: int) -> ExpertTurn:
    """A one-step greedy heuristic on ``env.board`` (a square array of tile values, 0 = empty): among the moves
    that change the board, the one maximising merge score + 2 x empty cells, keeping the largest tile in a corner as
    a tie-break; ties in the fixed order Up, Down, Left, Right. One action per turn (a tile spawns after each)."""
    board = np.asarray(env.board)
    names = tuple(getattr(env, "action_names", ()) or _DIRECTIONS)
    best, best_key = None, None
    for name in _DIRECTIONS:
        if name not in names:
            continue
        after, score = slide_2048(board, name)
        if np.array_equal(after, board):
            continue
        corner = max(after[0, 0], after[0, -1], after[-1, 0], after[-1, -1]) == after.max()
        key = (score + 2 * int((after == 0).sum()), corner)
        if best_key is None or key > best_key:
            best, best_key = name, key
    if best is None:
        return ExpertTurn(f"no move changes the board; I go {names[0]}", (names[0],))
    gain = best_key[0] - 2 * int((board == 0).sum())
    return ExpertTurn(f"{best} merges the most tiles; I go {best}", (best,)) if gain > 0 else \
        ExpertTurn(f"{best} keeps the board open; I go {best}", (best,))


# -- Rubik's cube -----------------------------------------------------------------------------------------------


def rubiks_expert(env: Any, max_actions: int, max_states: int = 200_000) -> ExpertTurn:
    """The first ``max_actions`` moves of a shortest solving sequence, by breadth-first search from ``env.state``.

    Needs ``env.state`` (the sticker array), ``env.action_names`` and the pure functions ``apply_move(state, action
    index) -> state`` and ``is_solved(state) -> bool``, taken from the env or else from the env's module. Scrambles
    are shallow (RAGEN: depth 1 on a 2x2 cube), so the search stops long before ``max_states`` states.
    """
    module = importlib.import_module(type(env).__module__)
    apply_move = getattr(env, "apply_move", None) or getattr(module, "apply_move", None)
    is_solved = getattr(env, "is_solved", None) or getattr(module, "is_solved", None)
    if apply_move is None or is_solved is None or not hasattr(env, "state"):
        raise KeyError(f"the Rubik's-cube expert needs env.state, apply_move and is_solved for {type(env).__name__}")
    names = tuple(env.action_names)

    def key(state: Any) -> bytes:
        return np.asarray(state).tobytes()

    start = env.state
    if is_solved(start):
        return ExpertTurn("the cube is solved", (names[0],))
    seen = {key(start)}
    queue: deque[tuple[Any, list[int]]] = deque([(start, [])])
    while queue and len(seen) < max_states:
        state, path = queue.popleft()
        for a in range(len(names)):
            nxt = apply_move(state, a)
            k = key(nxt)
            if k in seen:
                continue
            if is_solved(nxt):
                actions = tuple(names[i] for i in (path + [a])[:max_actions])
                n = len(path) + 1
                how = "1 move solves it" if n == 1 else f"{n} moves solve it"
                return ExpertTurn(f"{how}; {_go(actions)}", actions)
            seen.add(k)
            queue.append((nxt, path + [a]))
    return ExpertTurn(f"no solution found in {max_states} states; I go {names[0]}", (names[0],))


ExpertFn = Callable[[Any, int], ExpertTurn]

# env class name -> expert; the one place that decides which expert answers which env
EXPERTS: dict[str, ExpertFn] = {
    "SokobanEnv": sokoban_expert,
    "FrozenLakeEnv": frozen_lake_expert,
    "BanditEnv": bandit_expert,
    "CountdownEnv": countdown_expert,
    "MetaMathQAEnv": metamathqa_expert,
    "SudokuEnv": sudoku_expert,
    "Game2048Env": game_2048_expert,
    "RubiksCubeEnv": rubiks_expert,
}


def _expert_for(env: Any) -> ExpertFn:
    for cls in type(env).__mro__:  # subclasses of a known env use its expert
        if cls.__name__ in EXPERTS:
            return EXPERTS[cls.__name__]
    raise KeyError(
        f"no expert for env {type(env).__name__!r} (spec id {getattr(getattr(env, 'spec', None), 'id', None)!r}); "
        f"experts exist for {sorted(EXPERTS)}"
    )


def expert_turn(env: Any, max_actions: int = 2) -> ExpertTurn:
    """The expert's reasoning and actions for the env's current state (``env`` or its wrapper)."""
    if max_actions < 1:
        raise ValueError(f"max_actions must be >= 1, got {max_actions}")
    core = getattr(env, "unwrapped", env)
    turn = _expert_for(core)(core, max_actions)
    if not turn.actions:
        raise RuntimeError(f"the expert for {type(core).__name__} proposed no action")
    return ExpertTurn(turn.reasoning, tuple(turn.actions[:max_actions]))


def expert_actions(env: Any, max_actions: int = 2) -> list[str]:
    """The expert's next action words (discrete envs) or answer strings (free-text envs)."""
    return list(expert_turn(env, max_actions).actions)


def render_response(turn: ExpertTurn, enable_think: bool = True) -> str:
    """The assistant text AFTER the generation prefix: ``"reasoning</think><answer>A || B</answer>"`` (thinking on)
    or ``"A || B</answer>"`` (off)."""
    answer = f" {prompting.ACTION_SEP} ".join(turn.actions) + prompting.ANSWER_CLOSE
    if enable_think:
        return turn.reasoning + prompting.THINK_CLOSE + prompting.ANSWER_OPEN + answer
    return answer


class ExpertEngine:
    """A generation engine whose "samples" are the experts' answers, token for token.

    Args:
        tokenizer: the tokenizer of the model to be trained (the response is encoded without special tokens and
            closed with its eos id, like a sampled turn that stopped).
        enable_think: answer with ``reasoning</think><answer>...`` (the runner's prefix is ``<think>``); False gives
            ``...</answer>`` after an ``<answer>`` prefix. Must match the runner's ``enable_think``.
        max_actions_per_turn: actions per answer at most (set it to the runner's value).
    """

    needs_envs = True  # the runner passes env.unwrapped of each request as ``envs``

    def __init__(self, tokenizer: Any, *, enable_think: bool = True, max_actions_per_turn: int = 2):
        if max_actions_per_turn < 1:
            raise ValueError(f"max_actions_per_turn must be >= 1, got {max_actions_per_turn}")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token to end an expert turn with")
        self.tokenizer = tokenizer
        self.enable_think = enable_think
        self.max_actions_per_turn = max_actions_per_turn
        self.num_truncated = 0  # answers longer than max_new_tokens (cut, finish_reason "length")

    def sync_weights(self) -> None:
        return None

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None = None,
                 envs: Sequence[Any] | None = None) -> list[Generation]:
        if envs is None or len(envs) != len(prompts):
            raise ValueError(
                "ExpertEngine answers from the env state: call it through RolloutRunner (which passes envs=...) or "
                f"pass one env per prompt (got {None if envs is None else len(envs)} envs for {len(prompts)} prompts)"
            )
        out = []
        for env in envs:
            text = render_response(expert_turn(env, self.max_actions_per_turn), self.enable_think)
            ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.tokenizer.eos_token_id]
            finish = "stop"
            if len(ids) > params.max_new_tokens:
                ids, finish = ids[: params.max_new_tokens], "length"
                self.num_truncated += 1
            out.append(Generation(ids, [0.0] * len(ids), finish))
        return out


def collect_demonstrations(
    env_id: str,
    tokenizer: Any,
    seeds: Sequence[int],
    *,
    env_kwargs: dict[str, Any] | None = None,
    max_turns: int = 5,
    max_actions_per_turn: int = 2,
    max_actions_per_episode: int = 10,
    context_window: str = "full",
    window_turns: int = 2,
    max_model_len: int = 4096,
    max_new_tokens: int = 100,
    enable_think: bool = True,
):
    """Run one expert episode per seed through the real :class:`RolloutRunner`; returns its trajectories.

    Each ``Trajectory.samples[i].conversation`` holds the exact prompt/turn token ids an RL rollout would have and
    loss mask 1 on the expert's tokens. Arguments mirror the runner's (see its docstring).
    """
    from ragen_lightning.rollout.runner import RolloutRunner
    from ragen_lightning.rollout.tokens import ChatTokens

    engine = ExpertEngine(tokenizer, enable_think=enable_think, max_actions_per_turn=max_actions_per_turn)
    runner = RolloutRunner(
        env_id, env_kwargs, ChatTokens(tokenizer, enable_think=enable_think), engine,
        max_turns=max_turns, max_actions_per_turn=max_actions_per_turn,
        max_actions_per_episode=max_actions_per_episode, context_window=context_window,  # type: ignore[arg-type]
        window_turns=window_turns, max_model_len=max_model_len, enable_think=enable_think,
    )
    try:
        return runner.run(list(seeds), 1, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
    finally:
        runner.close()
