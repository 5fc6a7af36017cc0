"""FrozenLake as an exact Gymnasium text env (RAGEN's ``frozen_lake`` env type, FrozenLake /
CoordFrozenLake tags).

Behaviour follows RAGEN's frozen_lake env: a new random map per seeded reset, slippery moves with a
configurable ``success_rate``, RAGEN's symbols and coordinate rendering. Written from scratch on
:class:`envs.base.TextEnv` (no wrapping of Gymnasium's toy-text env), with two solvers:
:meth:`FrozenLakeEnv.solve` (shortest path, as if the ice were not slippery) and
:meth:`FrozenLakeEnv.optimal_policy` (value iteration for the slippery lake).

Departures from RAGEN (deliberate): actions are 0..3 = Up, Down, Left, Right (RAGEN: 1..4 = Left,
Down, Right, Up); the coordinate sentence of the prompt names the actual board corner (RAGEN always
says (5, 5)); the prompt drops the "slippery ice" sentence when ``success_rate == 1`` (nothing slips
then).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding

from envs.base import (
    TRANSITION_SEED,
    PromptSpec,
    TextEnv,
    as_action,
    bounded_int,
    going,
    relation,
    text_space,
)

ACTION_NAMES = ("Up", "Down", "Left", "Right")
DELTAS = ((-1, 0), (1, 0), (0, -1), (0, 1))
_DELTA_BY_NAME = dict(zip(ACTION_NAMES, DELTAS))
_POLICY_CACHE: dict[tuple, np.ndarray] = {}  # (map, success rate) -> the expert's slippery policy
# the two directions at right angles to each action (the slips), in a fixed order
PERPENDICULAR = ((2, 3), (2, 3), (0, 1), (0, 1))
OBSERVATION_FORMATS = ("grid", "coord", "grid_coord")

# RAGEN's render codes: 0 player, 1 empty (start shown as empty), 2 hole, 3 goal, 4 player in hole,
# 5 player on goal
GRID_LOOKUP = {0: "P", 1: "_", 2: "O", 3: "G", 4: "X", 5: "√"}
GRID_VOCAB = {
    "P": "player",
    "_": "empty",
    "O": "hole",
    "G": "goal",
    "X": "player in hole",
    "√": "player on goal",
}

# RAGEN's env_instruction texts (config/envs.yaml).
_SLIP_SENTENCE = "You may move to the unintended direction due to the slippery ice. "
INSTRUCTION = (
    "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. "
    + _SLIP_SENTENCE
    + "Example answer format: <think>To forbid the hole and go to the target, I should go left then go up.</think>"
    "<answer>Left || Up</answer>"
)
_COORD_SLIP_LINE = (
    "Beware that the ice is slippery, so the agent might slide and end up in an unintended tile.\n"
)
COORD_INSTRUCTION = (
    "You are solving the FrozenLake puzzle. The observation includes {what}zero-indexed coordinates for the start, "
    "goal, player, and any holes.\n"
    "Coordinates range from the top-left corner (0, 0) to the bottom-right corner ({last_row}, {last_col}).\n"
    "{slip}"
    "Respond with a sequence of actions such as <answer>Left || Up || Up</answer>.\n"
)


MAX_SIZE = 64  # the largest map side (size, and desc's rows and columns)


def generate_random_map(size: int, p: float, np_random: np.random.Generator) -> list[str]:
    """A ``size x size`` map of ``S``/``F``/``H``/``G``: each tile frozen with probability ``p``,
    start and goal two different uniform cells, redrawn until the goal is reachable from the start
    through non-hole tiles."""
    while True:
        frozen = np_random.random((size, size)) < p
        start, goal = np_random.integers(size * size, size=2).tolist()
        if start == goal:
            continue
        board = [["F" if f else "H" for f in row] for row in frozen.tolist()]
        board[start // size][start % size] = "S"
        board[goal // size][goal % size] = "G"
        desc = ["".join(row) for row in board]
        if _bfs(desc, divmod(start, size))[0].get(divmod(goal, size)) is not None:
            return desc


def _bfs(desc: Sequence[str], start: tuple[int, int]) -> tuple[dict[tuple[int, int], int], dict]:
    """Distances and parent links from ``start`` through non-hole tiles (holes and the goal are not
    expanded)."""
    nrow, ncol = len(desc), len(desc[0])
    dist = {start: 0}
    parent: dict[tuple[int, int], tuple[tuple[int, int], int]] = {}
    queue = deque([start])
    while queue:
        cur = queue.popleft()
        if desc[cur[0]][cur[1]] in "GH" and cur != start:
            continue
        for a, (dr, dc) in enumerate(DELTAS):
            r, c = cur[0] + dr, cur[1] + dc
            if 0 <= r < nrow and 0 <= c < ncol and (r, c) not in dist and desc[r][c] != "H":
                dist[(r, c)] = dist[cur] + 1
                parent[(r, c)] = (cur, a)
                queue.append((r, c))
    return dist, parent


class FrozenLakeEnv(TextEnv):
    """FrozenLake: walk from the start to the goal on slippery ice without falling into a hole.

    ## Description
    A grid of frozen tiles and holes with one start and one goal. Each reset draws a new map from ``np_random`` (so
    the same seed gives the same map; ``map_seed`` or ``desc`` fix one map instead): every tile is frozen with
    probability ``p``, start and goal are two different random tiles, and maps are redrawn until the goal is
    reachable. The player starts on the start tile. A move goes in the intended direction with probability
    ``success_rate`` and in each of the two directions at right angles with probability ``(1 - success_rate) / 2``
    (``success_rate=1`` is deterministic); a move off the board leaves the player in place.

    ## Action Space
    ``Discrete(4)``: 0 Up, 1 Down, 2 Left, 3 Right (``action_names``). Anything that is not an integer in
    ``[0, 4)`` (a NumPy integer counts) is an invalid action: nothing changes, reward 0, ``action_is_valid`` False.

    ## Observation Space
    A string (``Text`` over printable ASCII plus ``√``), by ``observation_format``:

    * ``"grid"``: one row per line: ``P`` player, ``_`` frozen (the start too), ``O`` hole, ``G`` goal, ``X``
      player in a hole, ``√`` player on the goal;
    * ``"coord"``: ``Board size: R rows x C cols (zero-indexed).`` then ``Start: (r, c)``, ``Goal: (r, c)``, one of
      ``Player:`` / ``Player on goal:`` / ``Player in hole:``, and ``Holes: (r, c), ...`` when there are holes;
    * ``"grid_coord"``: ``"Coordinates: \\n" + coord + "\\n" + "Grid Map: \\n" + grid``.

    ## Rewards
    +1 on reaching the goal, 0 otherwise.

    ## Episode End
    ``terminated`` on reaching the goal (``info["success"]``) or falling into a hole. Never truncated (the caller
    sets the action budget). After the end, ``step`` is harmless: same observation, reward 0, ``terminated`` stays
    True, ``action_is_effective`` False, and no random number is drawn.

    ``info`` on reset and every step: ``success``, ``action_is_effective`` (the player's tile changed),
    ``action_is_valid``; on valid steps of a running episode also ``direction`` (the direction actually taken after
    slipping, 0..3, even when the border stopped the move).

    ## Arguments
    * ``size=4``: side of the generated square maps (in [2, 64]: a 64x64 map generates in ~0.01 s and already
      renders as 4096 characters a turn).
    * ``p=0.9``: probability that a generated tile is frozen (in (0, 1]).
    * ``success_rate=0.8``: probability that a move goes the intended way (in [0, 1]).
    * ``observation_format="grid"``: ``"grid"``, ``"coord"`` or ``"grid_coord"``.
    * ``map_seed=None``: when set, one map drawn from this seed is used for every episode.
    * ``desc=None``: an explicit map (rows of ``S``, ``F``, ``H``, ``G``; one ``S`` and one ``G``), e.g.
      ``["SFFF", "FHFH", "FFFH", "HFFG"]``; it wins over ``size``/``p``/``map_seed``.
    * ``shared_transitions=False``: ignore the ``transition_seed`` reset option, so envs reset with the same seed
      slip identically under identical actions (RAGEN's group behaviour, RAGEN's frozen_lake env).
    * ``render_mode=None``: ``"ansi"`` makes ``render()`` return the observation text.

    ## Randomness
    The reset seed decides the map (group invariant: same seed, same map and start). The slips are transition
    draws: from the stream seeded by ``reset(options={"transition_seed": t})`` (``transition_seeded = True``; the
    trainer gives every member of a group its own ``t``, so members slip independently), else from ``np_random``
    (same seed and actions => same slips). Same seed and same ``t`` => identical episodes.
    """

    branchable = True  # small in-process state: turns may branch (--data.branching.branches)

    action_names = ACTION_NAMES
    transition_seeded = True

    def __init__(
        self,
        size: int = 4,
        p: float = 0.9,
        success_rate: float = 0.8,
        observation_format: str = "grid",
        map_seed: int | None = None,
        desc: Sequence[str] | None = None,
        shared_transitions: bool = False,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        size = bounded_int("FrozenLakeEnv", "size", size, 2, MAX_SIZE)
        if not 0.0 < float(p) <= 1.0:
            raise ValueError(f"p must be in (0, 1], got {p!r}")
        if not 0.0 <= float(success_rate) <= 1.0:
            raise ValueError(f"success_rate must be in [0, 1], got {success_rate!r}")
        if observation_format not in OBSERVATION_FORMATS:
            raise ValueError(
                f"observation_format must be one of {OBSERVATION_FORMATS}, got {observation_format!r}"
            )
        self.size, self.p, self.success_rate = int(size), float(p), float(success_rate)
        self.observation_format = observation_format
        self.shared_transitions = bool(shared_transitions)
        self.map_seed = map_seed
        self._fixed_desc: list[str] | None = None
        if desc is not None:
            self._fixed_desc = _check_desc(desc)
        elif map_seed is not None:
            self._fixed_desc = generate_random_map(
                self.size, self.p, seeding.np_random(map_seed)[0]
            )
        self.action_space = spaces.Discrete(4)
        self.observation_space = text_space(extra_chars="".join(GRID_LOOKUP.values()))
        self._load(self._fixed_desc or ["SG"])

    # ------------------------------------------------------------------ gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        self._seed_transitions(self._reset_options(options, (TRANSITION_SEED,)))
        self._load(self._fixed_desc or generate_random_map(self.size, self.p, self.np_random))
        return self._render_text(), self._info(False, True)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        a = as_action(action, 4)
        if a is None or self._terminated:
            return (
                self._render_text(),
                0.0,
                self._terminated,
                False,
                self._info(False, a is not None),
            )
        direction = a
        if self.success_rate < 1.0:
            u = float(self.transition_rng.random())
            if u >= self.success_rate:
                half = (1.0 - self.success_rate) / 2.0
                direction = PERPENDICULAR[a][0 if u < self.success_rate + half else 1]
        dr, dc = DELTAS[direction]
        r, c = self._pos
        nr, nc = min(max(r + dr, 0), self.nrow - 1), min(max(c + dc, 0), self.ncol - 1)
        moved = (nr, nc) != (r, c)
        self._pos = (nr, nc)
        tile = self.desc[nr][nc]
        reward = 1.0 if tile == "G" else 0.0
        self._terminated = tile in "GH"
        info = self._info(moved, True)
        info["direction"] = direction
        return self._render_text(), reward, self._terminated, False, info

    def prompt_spec(self) -> PromptSpec:
        slippery = self.success_rate < 1.0
        fixed = self._fixed_desc
        rows, cols = (len(fixed), len(fixed[0])) if fixed else (self.size, self.size)
        if self.observation_format == "grid":
            instruction = INSTRUCTION if slippery else INSTRUCTION.replace(_SLIP_SENTENCE, "")
        else:
            instruction = COORD_INSTRUCTION.format(
                what="both a symbol grid and " if self.observation_format == "grid_coord" else "",
                last_row=rows - 1,
                last_col=cols - 1,
                slip=_COORD_SLIP_LINE if slippery else "",
            )
        symbols = () if self.observation_format == "coord" else tuple(GRID_VOCAB.items())
        return PromptSpec(instruction=instruction, action_names=self.action_names, symbols=symbols)

    # ------------------------------------------------------------------ solvers and state views
    def solve(self) -> list[int] | None:
        """Shortest action sequence (0..3 = Up, Down, Left, Right) from the player to the goal
        through non-hole tiles, as if nothing slipped; ``[]`` on the goal, None when the goal is
        unreachable (or the player is in a hole)."""
        if self.tile == "G":
            return []
        if self.tile == "H":
            return None
        dist, parent = _bfs(self.desc, self._pos)
        if self._goal not in dist:
            return None
        actions, cell = [], self._goal
        while cell != self._pos:
            cell, a = parent[cell]
            actions.append(a)
        return actions[::-1]

    def optimal_policy(
        self, gamma: float = 1.0, tol: float = 1e-12, max_iter: int = 100_000
    ) -> tuple[np.ndarray, np.ndarray]:
        """Value iteration for the slippery lake.

        Returns ``(policy, value)``, both ``[nrow, ncol]``. With ``gamma=1`` (default) ``value[r,
        c]`` is the highest probability of ever reaching the goal from (r, c) (no step limit); with
        ``gamma < 1`` it is the highest ``E[gamma ** T]``, T the number of steps to the goal (0 if
        never reached), which favours fast routes. Goal: 1, holes: 0. ``policy[r, c]`` is an action
        achieving it; among equally good actions it takes one with the fewest expected steps to the
        end of the episode, so it never dithers (e.g. bumping into the border forever where that is
        "safe"). Safe play can still be slow: with ``gamma=1`` the best route may wait for lucky
        slips.
        """
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
        nrow, ncol = self.nrow, self.ncol
        n = nrow * ncol
        flat = "".join(self.desc)
        # nxt[s, direction]: cell reached moving that way from s
        nxt = np.empty((n, 4), dtype=np.int64)
        for s in range(n):
            r, c = divmod(s, ncol)
            for d, (dr, dc) in enumerate(DELTAS):
                nxt[s, d] = min(max(r + dr, 0), nrow - 1) * ncol + min(max(c + dc, 0), ncol - 1)
        sr = self.success_rate
        half = (1.0 - sr) / 2.0
        probs = np.zeros((4, 4))  # probs[a, d]: probability that action a moves in direction d
        for a in range(4):
            probs[a, a] += sr
            for d in PERPENDICULAR[a]:
                probs[a, d] += half
        goal = np.array([ch == "G" for ch in flat])
        end = np.array([ch in "GH" for ch in flat])

        def expect(x: np.ndarray) -> np.ndarray:  # [n, 4]: expected x of the next cell, per action
            return x[nxt] @ probs.T

        v = goal.astype(float)
        for _ in range(max_iter):
            new = np.where(end, v, gamma * expect(v).max(axis=1))
            done = np.max(np.abs(new - v)) < tol
            v = new
            if done:
                break
        q = gamma * expect(v)
        # actions keeping the best success probability
        best = q >= q.max(axis=1, keepdims=True) - 1e-9
        # Expected steps until the episode ends (hopeless tiles count as ends), using only those
        # actions. A proper choice exists from every hopeful tile, and dithering ones cost 1 per
        # step forever, so this converges.
        stop = end | (v < 1e-12)
        t = np.zeros(n)
        for _ in range(max_iter):
            cost = np.where(best, 1.0 + expect(t), np.inf)
            new = np.where(stop, 0.0, cost.min(axis=1))
            done = np.max(np.abs(new - t)) < 1e-7 * max(1.0, float(new.max()))  # only breaks ties
            t = new
            if done:
                break
        cost = np.where(best, 1.0 + expect(t), np.inf)
        policy = np.where(stop, q.argmax(axis=1), cost.argmin(axis=1))
        return policy.reshape(nrow, ncol), v.reshape(nrow, ncol)

    @property
    def player_position(self) -> tuple[int, int]:
        return self._pos

    @property
    def tile(self) -> str:
        """Map letter under the player: ``S``, ``F``, ``H`` or ``G``."""
        return self.desc[self._pos[0]][self._pos[1]]

    # ------------------------------------------------------------------ internals
    def _load(self, desc: list[str]) -> None:
        self.desc = list(desc)
        self.nrow, self.ncol = len(desc), len(desc[0])
        cells = [(r, c) for r in range(self.nrow) for c in range(self.ncol)]
        self._start = next(rc for rc in cells if desc[rc[0]][rc[1]] == "S")
        self._goal = next(rc for rc in cells if desc[rc[0]][rc[1]] == "G")
        self._holes = [rc for rc in cells if desc[rc[0]][rc[1]] == "H"]
        self._pos = self._start
        self._terminated = False
        self._static_lines = [
            "".join("O" if ch == "H" else "G" if ch == "G" else "_" for ch in row) for row in desc
        ]
        self._coord_head = (
            f"Board size: {self.nrow} rows x {self.ncol} cols (zero-indexed).\n"
            f"Start: {_fmt([self._start])}\nGoal: {_fmt([self._goal])}"
        )
        self._coord_holes = "\nHoles: " + _fmt(self._holes) if self._holes else ""

    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert. Deterministic ice: the first ``max_actions`` steps of the
        shortest path (:meth:`solve`). Slippery ice: the optimal policy's action
        (:meth:`optimal_policy`) at the player's cell, then at the cell that action intends to
        reach, and so on up to ``max_actions`` (stopping at the goal or a hole).

        After a slip the later actions of a slippery turn were chosen for the wrong cell, but a turn
        budget binds harder: with RAGEN's 5 turns x 2 actions the expert succeeds in 83 % of
        episodes this way against 65 % with one action per turn (512 default maps, success rate
        0.8).

        Reasoning: ``"goal is below and right of me; I go Down, Right"`` (``"...; ice is slippery, I
        go ..."``).
        """
        names = tuple(self.action_names)
        pos = tuple(self.player_position)
        goal = next(
            (r, c) for r, row in enumerate(self.desc) for c, ch in enumerate(row) if ch == "G"
        )
        where = f"goal is {relation(goal, pos)} me"
        if self.success_rate >= 1.0:
            plan = self.solve()
            if not plan:
                return f"{where}; no safe path, I go {names[0]}", (names[0],)
            actions = tuple(names[a] for a in plan[:max_actions])
            return f"{where}; {going(actions)}", actions
        policy = self._slippery_policy()
        chosen: list[str] = []
        cell = pos
        while len(chosen) < max_actions:
            action = names[int(policy[cell])]
            chosen.append(action)
            dr, dc = _DELTA_BY_NAME[action]
            cell = (
                min(max(cell[0] + dr, 0), self.nrow - 1),
                min(max(cell[1] + dc, 0), self.ncol - 1),
            )
            if self.desc[cell[0]][cell[1]] in "GH":
                break
        return f"{where}; ice is slippery, {going(chosen)}", tuple(chosen)

    def _slippery_policy(self) -> np.ndarray:
        """``self.optimal_policy()[0]``, cached per (map, success rate): value iteration takes ~0.1
        s and an episode asks every turn."""
        key = (tuple(self.desc), float(self.success_rate))
        if key not in _POLICY_CACHE:
            if len(_POLICY_CACHE) >= 4096:
                _POLICY_CACHE.clear()
            _POLICY_CACHE[key] = self.optimal_policy()[0]
        return _POLICY_CACHE[key]

    def _render_text(self) -> str:
        if self.observation_format == "grid":
            return self._grid()
        if self.observation_format == "coord":
            return self._coord()
        return "Coordinates: \n" + self._coord() + "\n" + "Grid Map: \n" + self._grid()

    def _grid(self) -> str:
        r, c = self._pos
        tile = self.desc[r][c]
        mark = GRID_LOOKUP[4] if tile == "H" else GRID_LOOKUP[5] if tile == "G" else GRID_LOOKUP[0]
        lines = self._static_lines.copy()
        lines[r] = lines[r][:c] + mark + lines[r][c + 1 :]
        return "\n".join(lines)

    def _coord(self) -> str:
        tile = self.tile
        label = "Player on goal" if tile == "G" else "Player in hole" if tile == "H" else "Player"
        return f"{self._coord_head}\n{label}: {_fmt([self._pos])}{self._coord_holes}"

    def _info(self, effective: bool, valid: bool) -> dict[str, Any]:
        return {
            "success": self.tile == "G",
            "action_is_effective": effective,
            "action_is_valid": valid,
        }


def _check_desc(desc: Sequence[str]) -> list[str]:
    rows = [str(row) for row in desc]
    if not rows or not rows[0] or any(len(row) != len(rows[0]) for row in rows):
        raise ValueError("desc rows must be non-empty strings of equal length")
    if len(rows) > MAX_SIZE or len(rows[0]) > MAX_SIZE:
        raise ValueError(
            f"desc must have at most {MAX_SIZE} rows and columns, got {len(rows)}x{len(rows[0])}"
        )
    flat = "".join(rows)
    if set(flat) - set("SFHG"):
        raise ValueError(f"desc may only contain S, F, H, G, got {sorted(set(flat) - set('SFHG'))}")
    if flat.count("S") != 1 or flat.count("G") != 1:
        raise ValueError("desc needs exactly one S and one G")
    return rows


def _fmt(cells: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"({r}, {c})" for r, c in cells)
