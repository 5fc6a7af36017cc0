"""2x2 Rubik's cube (Pocket Cube), RAGEN's ``rubikscube`` env.

The 12 quarter-turn permutations are not written by hand: they are derived once, at import, from the
cube's geometry. Each sticker is a (position, normal) pair in 3-D; a face move rotates the stickers
of that face's layer by -90 degrees about the face's outward axis (clockwise as seen looking at the
face), and the permutation records which slot each sticker lands in.

Coordinates: x points to R, y to U, z to F. Each face is read row-major as seen from outside the
cube: U with B at the top, D with F at the top, and L, F, R, B with U at the top. So sticker
``4*face + 2*row + col`` is the face's (row, col) sticker and the render's ``[a, b] / [c, d]`` shows
it as seen.

Departure from RAGEN: a random scramble never picks the inverse of its previous move, and a scramble
that happens to leave the cube solved is redrawn, so every episode starts unsolved.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from envs.base import PromptSpec, TextEnv, as_action, bounded_int, going, text_space

FACES = ("U", "L", "F", "R", "B", "D")
FACE_NAMES = ("Up", "Left", "Front", "Right", "Back", "Down")
COLORS = ("W", "O", "G", "R", "B", "Y")  # solved colour of each face, in FACES order
ACTION_NAMES = ("U", "U'", "D", "D'", "L", "L'", "R", "R'", "F", "F'", "B", "B'")

INSTRUCTION = (
    "You are solving a 2x2 Rubik's Cube (Pocket Cube). The goal is to restore the cube so that each of the faces "
    "consists of a single, unique color.\n"
    "Available actions use standard Singmaster notation for face rotations: U, U', D, D', L, L', R, R', F, F', "
    "B, B'.\n"
    "- Faces: U (Up), D (Down), L (Left), R (Right), F (Front), B (Back).\n"
    "- Modifiers: A letter alone means 90° clockwise (e.g., 'R'). A letter with prime (') means 90° "
    'counter-clockwise (e.g., "R\'").\n'
    'Respond with a sequence of actions separated by "||".\n'
    "Example: <answer>U</answer>\n"
)

# Outward normal, then the in-face "right" and "down" directions as seen from outside, per face.
_FACE_FRAMES = {
    "U": ((0, 1, 0), (1, 0, 0), (0, 0, 1)),
    "L": ((-1, 0, 0), (0, 0, 1), (0, -1, 0)),
    "F": ((0, 0, 1), (1, 0, 0), (0, -1, 0)),
    "R": ((1, 0, 0), (0, 0, -1), (0, -1, 0)),
    "B": ((0, 0, -1), (-1, 0, 0), (0, -1, 0)),
    "D": ((0, -1, 0), (1, 0, 0), (0, 0, -1)),
}


def _sticker_geometry() -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
    """(doubled position, normal) of the 24 stickers in state order; positions doubled to stay
    integral."""
    stickers = []
    for face in FACES:
        normal, right, down = (np.array(v) for v in _FACE_FRAMES[face])
        for row in range(2):
            for col in range(2):
                # Cubie centres sit at +-1/2; the sticker lies on the face plane at distance 1 from
                # the centre.
                pos = 2 * normal + (2 * col - 1) * right + (2 * row - 1) * down
                stickers.append((tuple(int(x) for x in pos), tuple(int(x) for x in normal)))
    return stickers


def _quarter_turn(axis: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``v`` rotated by -90 degrees about unit ``axis`` (clockwise seen from the axis tip)."""
    return -np.cross(axis, v) + axis * int(axis @ v)


def _move_permutation(face: str) -> np.ndarray:
    """``perm`` with ``new_state = state[perm]`` for a clockwise quarter turn of ``face``."""
    stickers = _sticker_geometry()
    slot = {s: i for i, s in enumerate(stickers)}
    axis = np.array(_FACE_FRAMES[face][0])
    perm = np.arange(24)
    for i, (pos, normal) in enumerate(stickers):
        p, n = np.array(pos), np.array(normal)
        if p @ axis > 0:  # the sticker belongs to this face's layer
            j = slot[
                (
                    tuple(int(x) for x in _quarter_turn(axis, p)),
                    tuple(int(x) for x in _quarter_turn(axis, n)),
                )
            ]
            perm[j] = i
    return perm


def _build_moves() -> tuple[np.ndarray, ...]:
    moves = []
    for face in ("U", "D", "L", "R", "F", "B"):
        base = _move_permutation(face)
        moves.append(base)
        prime = np.arange(24)
        for _ in range(3):
            prime = prime[base]
        moves.append(prime)
    return tuple(moves)


MOVES: tuple[np.ndarray, ...] = _build_moves()  # indexed like ACTION_NAMES
SOLVED_STATE = np.repeat(np.arange(6), 4)


def inverse_action(action: int) -> int:
    """Index of the move that undoes ``action`` (X <-> X')."""
    return action ^ 1


def apply_move(state: np.ndarray, action: int) -> np.ndarray:
    """The sticker array after move ``action`` (an index into ``ACTION_NAMES``); ``state`` is not
    modified."""
    return np.asarray(state)[MOVES[action]]


def apply_moves(state: np.ndarray, actions: Sequence[int]) -> np.ndarray:
    """The sticker array after applying ``actions`` (indices into ``ACTION_NAMES``) in order."""
    for a in actions:
        state = apply_move(state, a)
    return state


def is_solved(state: np.ndarray) -> bool:
    """Every face shows a single colour."""
    faces = np.asarray(state).reshape(6, 4)
    return bool((faces == faces[:, :1]).all())


# random quarter turns at most (God's number in the quarter-turn metric is 26)
MAX_SCRAMBLE_DEPTH = 1000


class RubiksCubeEnv(TextEnv):
    """2x2 Rubik's cube: undo a random scramble with quarter turns.

    ## Description The state is 24 stickers (4 per face, faces U L F R B D, solved colours W O G R B
    Y). Reset applies ``scramble_depth`` random quarter turns to the solved cube (never undoing the
    previous move; redrawn if the result is solved). Each step applies one quarter turn.

    ## Action Space ``Discrete(12)``: ``U, U', D, D', L, L', R, R', F, F', B, B'`` for 0..11
    (``action_names``). A letter turns that face 90 degrees clockwise as seen looking at it; the
    prime turns it back.

    ## Observation Space
    ``Text`` over printable ASCII::

        === Rubik's Cube 2x2 State ===
        Step: 0/20
        <blank line>
        Up (U):    [W, W]
         [W, W]
        ... (Left, Front, Right, Back, Down)
        <blank line>
        Available Actions:
        U, U', D, D', L, L', R, R', F, F', B, B'
        <blank line>
        What is your next move?

    When the episode has ended the last two blocks are replaced by ``=== Game Over: Cube Solved!
    ===`` or ``=== Game Over: Max steps reached. ===``.

    ## Rewards 1.0 on the move that solves the cube (every face one colour; a 2x2 has no fixed
    centres, so a solved cube turned as a whole, e.g. after ``U D'``, counts as solved), else 0.0.
    An invalid action (not an int in 0..11) gives 0.0, leaves the cube unchanged, counts as a step
    and has ``action_is_valid=False``.

    ## Episode End Terminated when solved. Truncated (reward 0.0) after ``max_steps`` steps.
    Stepping after the end returns the last observation, reward 0.0, the same end flags and
    ``action_is_valid=False``.

    ## Info ``success`` (solved), ``action_is_valid``, ``action_is_effective`` (the sticker colours
    changed).

    ## Arguments
    - ``scramble_depth`` (1): random quarter turns applied at reset, in [1, 1000] (far past a fully
      mixed cube).
    - ``max_steps`` (20). ``render_mode``: ``None`` or ``"ansi"``.

    ## Options ``reset(options={"scramble": [actions]})`` applies the given moves (indices or names
    such as ``"R'"``) instead of a random scramble; the result must not be solved.
    """

    branchable = True  # small in-process state: turns may branch (--data.branching.branches)

    action_names = ACTION_NAMES
    # Pure helpers on sticker arrays, reachable from an env instance (used by solvers that only see
    # the env).
    apply_move = staticmethod(apply_move)
    is_solved = staticmethod(is_solved)

    def __init__(
        self, scramble_depth: int = 1, max_steps: int = 20, render_mode: str | None = None
    ):
        super().__init__(render_mode=render_mode)
        scramble_depth = bounded_int(
            "RubiksCubeEnv", "scramble_depth", scramble_depth, 1, MAX_SCRAMBLE_DEPTH
        )
        max_steps = bounded_int("RubiksCubeEnv", "max_steps", max_steps, 1)
        self.scramble_depth = scramble_depth
        self.max_steps = max_steps
        self.action_space = spaces.Discrete(len(ACTION_NAMES))
        self.observation_space = text_space()
        self.state: np.ndarray | None = None
        self.scramble: tuple[int, ...] = ()
        self.num_steps = 0
        self._terminated = False
        self._truncated = False
        self._obs = ""

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(instruction=INSTRUCTION, action_names=self.action_names)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = self._reset_options(options, ("scramble",))
        if "scramble" in options:
            scramble = tuple(self._action_index(a) for a in options["scramble"])
            if is_solved(apply_moves(SOLVED_STATE, scramble)):
                raise ValueError("options['scramble'] leaves the cube solved")
        else:
            scramble = self._random_scramble()
        self.scramble = scramble
        self.state = apply_moves(SOLVED_STATE, scramble)
        self.num_steps = 0
        self._terminated = self._truncated = False
        self._obs = self._render_text()
        return self._obs, self._info(valid=True, effective=False)

    @staticmethod
    def _action_index(a: Any) -> int:
        if isinstance(a, str) and a in ACTION_NAMES:
            return ACTION_NAMES.index(a)
        index = as_action(a, len(ACTION_NAMES))
        if index is None:
            raise ValueError(
                f"options['scramble'] entries must be action indices 0..11 or names, got {a!r}"
            )
        return index

    def _random_scramble(self) -> tuple[int, ...]:
        while True:
            moves: list[int] = []
            while len(moves) < self.scramble_depth:
                a = int(self.np_random.integers(len(ACTION_NAMES)))
                if moves and a == inverse_action(moves[-1]):
                    continue
                moves.append(a)
            if not is_solved(apply_moves(SOLVED_STATE, moves)):
                return tuple(moves)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.state is None:
            raise RuntimeError("RubiksCubeEnv: call reset() before step()")
        if self._terminated or self._truncated:
            return (
                self._obs,
                0.0,
                self._terminated,
                self._truncated,
                self._info(valid=False, effective=False),
            )
        self.num_steps += 1
        a = as_action(action, len(ACTION_NAMES))
        effective = False
        if a is not None:
            new_state = self.state[MOVES[a]]
            effective = not np.array_equal(new_state, self.state)
            self.state = new_state
        self._terminated = is_solved(self.state)
        self._truncated = not self._terminated and self.num_steps >= self.max_steps
        reward = 1.0 if self._terminated else 0.0
        self._obs = self._render_text()
        info = self._info(valid=a is not None, effective=effective)
        return self._obs, reward, self._terminated, self._truncated, info

    def _info(self, *, valid: bool, effective: bool) -> dict[str, Any]:
        return {
            "success": self._terminated,
            "action_is_valid": valid,
            "action_is_effective": effective,
        }

    def expert_turn(
        self, max_actions: int, max_states: int = 200_000
    ) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert: the first ``max_actions`` moves of a shortest solving sequence,
        by breadth-first search from ``state`` (:func:`apply_move`, :func:`is_solved`). Scrambles
        are shallow (RAGEN: depth 1 on a 2x2 cube), so the search stops long before ``max_states``
        states."""
        names = tuple(self.action_names)
        start = self.state
        if is_solved(start):
            return "the cube is solved", (names[0],)
        seen = {np.asarray(start).tobytes()}
        queue: deque[tuple[Any, list[int]]] = deque([(start, [])])
        while queue and len(seen) < max_states:
            state, path = queue.popleft()
            for a in range(len(names)):
                nxt = apply_move(state, a)
                k = np.asarray(nxt).tobytes()
                if k in seen:
                    continue
                if is_solved(nxt):
                    actions = tuple(names[i] for i in (path + [a])[:max_actions])
                    n = len(path) + 1
                    how = "1 move solves it" if n == 1 else f"{n} moves solve it"
                    return f"{how}; {going(actions)}", actions
                seen.add(k)
                queue.append((nxt, path + [a]))
        return f"no solution found in {max_states} states; I go {names[0]}", (names[0],)

    def _render_text(self) -> str:
        if self.state is None:
            return ""
        lines = ["=== Rubik's Cube 2x2 State ===", f"Step: {self.num_steps}/{self.max_steps}", ""]
        for f, (face, name) in enumerate(zip(FACES, FACE_NAMES)):
            c = [COLORS[int(x)] for x in self.state[4 * f : 4 * f + 4]]
            label = f"{name} ({face}):"
            lines.append(f"{label:<11}[{c[0]}, {c[1]}]\n [{c[2]}, {c[3]}]")
        lines.append("")
        if self._terminated or self._truncated:
            lines.append(
                f"=== Game Over: {'Cube Solved!' if self._terminated else 'Max steps reached.'} ==="
            )
        else:
            lines += ["Available Actions:", ", ".join(ACTION_NAMES), "\nWhat is your next move?"]
        return "\n".join(lines)
