"""Sokoban as an exact Gymnasium text env (RAGEN's ``sokoban`` env type and its tags).

Rules, rewards and renderings follow RAGEN (RAGEN's sokoban env; the board's text lives in
:mod:`envs.grid.sokoban.text`). Two level generators (:mod:`envs.grid.sokoban.ragen` and
:mod:`envs.grid.sokoban.generate`), both seeded from ``np_random`` only
(never Python's ``random``, the global NumPy state or string hashing), both always solvable:

* ``generator="ragen"`` (the presets named after RAGEN's tags): RAGEN's own procedure on bitmask
  boards: random-walk room, player then targets on random floor cells, depth-first reverse play with
  pulls up to ``search_depth`` keeping the first state with the highest ``box_swaps x sum of
  Manhattan distances``, then a short random player walk. Same level distribution as RAGEN: on 300
  seeds the shortest solution averages 4.0 steps (1-12) at 6x6 with one box and 5.7 (2-11) at 8x8
  with two boxes and search depth 10 (``python benchmarks/envs.py --histogram``).
* ``generator="uniform_depth"`` (the default of ``ragen/Sokoban-v0``): a breadth-first backward
  search from the solved room gives every reachable start state its exact shortest solution length
  and the start is drawn uniformly among those needing ``min_solution_steps..search_depth`` steps:
  harder levels (mean 5.0 steps, 2-16, at 6x6 with one box; 8.0, 3-10, at 8x8 with two boxes and
  search depth 10).

Either way ``info["optimal_steps"]`` gives the level's shortest solution length.

Departures from RAGEN (all deliberate):

* actions are 0..3 = Up, Down, Left, Right (RAGEN: 1..4 with the same names);
* the prompt legend comes from the env's actual symbol lookup (RAGEN always shows the default
  legend), the coordinate sentence names the actual board corner (RAGEN always says (5, 5)), and the
  ``coord`` format (no grid shown) gets no legend and no mention of a symbol grid;
* ``num_boxes`` defaults to 1 (RAGEN's dataclass default is 3; every RAGEN tag sets 1 or 2);
* the episode limit is a truncation, not a termination (Gymnasium semantics);
* with ``generator="uniform_depth"`` levels are drawn uniformly among the start states whose
  shortest solution has between ``min_solution_steps`` and ``search_depth`` steps, with no box on a
  target (RAGEN keeps the state of its depth-first reverse play that displaced the boxes most, as
  ``generator="ragen"`` does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from envs.base import PromptSpec, TextEnv, as_action, bounded_int, going, relation, text_space
from envs.grid.sokoban import generate as gen
from envs.grid.sokoban import ragen
from envs.grid.sokoban.text import BoardText, check_symbols, parse_board

ACTION_NAMES = ("Up", "Down", "Left", "Right")
OBSERVATION_FORMATS = ("grid", "coord", "grid_coord")

# RAGEN's env_instruction texts (config/envs.yaml block scalars keep their trailing spaces and final
# newline).
INSTRUCTION = (
    "You are solving the Sokoban puzzle. \n"
    "You are the player and you need to push all boxes to targets. \n"
    "When you are right next to a box, you can push it by moving in the same direction. \n"
    "You cannot push a box through a wall, and you cannot pull a box. \n"
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>\n"
)
COORD_INSTRUCTION = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets.\n"
    "You are provided with {what}the zero-indexed coordinates of the player, each box, and each target. \n"
    "Coordinates range from the top-left corner (0, 0) to the bottom-right corner ({last_row}, {last_col}). \n"
    "When you are exactly next to a box, you can push it by moving in the same direction. \n"
    "You cannot push a box through a wall, and you cannot pull a box.\n"
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>.\n"
)

# Defaults of every keyword; a preset overrides some of them, explicit keywords override both.
# Documented maxima: a 30x30 room generates in well under 0.1 s; beyond them a reset could hold a
# core for minutes.
MAX_DIM_ROOM = 30
MAX_SEARCH_DEPTH = 1000
MAX_SEARCH_BUDGET = 1_000_000
DEFAULTS: dict[str, Any] = {
    "dim_room": (6, 6),
    "num_boxes": 1,
    "max_steps": 100,
    "observation_format": "grid",
    "grid_lookup": None,
    "grid_vocab": None,
    "search_depth": 300,
    "min_solution_steps": 2,
    "search_budget": 10_000,
    "generator": "uniform_depth",
    "distance_reward": 0.0,
    "heuristic_reward": 0.0,
    "dead_distance": 20,
}
GENERATORS = ("ragen", "uniform_depth")

# RAGEN's Sokoban tags (config/envs.yaml) with RAGEN's generator; search_depth as in RAGEN (300 by
# default, 10 and 30 where it sets one).
PRESETS: dict[str, dict[str, Any]] = {
    "SimpleSokoban": {
        "dim_room": (6, 6),
        "num_boxes": 1,
        "max_steps": 100,
        "observation_format": "grid",
        "generator": "ragen",
    },
    "LargerSokoban": {
        "dim_room": (8, 8),
        "num_boxes": 2,
        "max_steps": 100,
        "search_depth": 10,
        "generator": "ragen",
    },
    "CoordSokoban": {
        "dim_room": (6, 6),
        "num_boxes": 1,
        "max_steps": 100,
        "observation_format": "grid_coord",
        "generator": "ragen",
    },
    "SokobanDifferentGridVocab": {
        "generator": "ragen",
        "dim_room": (6, 6),
        "num_boxes": 1,
        "max_steps": 100,
        "search_depth": 30,
        "grid_lookup": {0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"},
        "grid_vocab": {
            "W": "wall",
            ".": "empty",
            "G": "target",
            "C": "box on target",
            "B": "box",
            "A": "player",
            "@": "player on target",
        },
    },
}

_MAX_GENERATION_TRIES = 1000


def solve_board(
    board: str | Sequence[str] | np.ndarray, grid_lookup: dict[int, str] | None = None
) -> list[int] | None:
    """Shortest action sequence (0..3 = Up, Down, Left, Right) solving a hand-built board (see
    :func:`~envs.grid.sokoban.text.parse_board`); ``[]`` if solved already, None if unsolvable."""
    rows, cols, floor, targets, boxes, player = parse_board(board, grid_lookup)
    return gen.solve(gen.geometry(rows, cols), floor, targets, boxes, player)


class SokobanEnv(TextEnv):
    """Sokoban: push every box onto a target.

    ## Description
    A room of walls and floor with some targets, as many boxes and one player. The player walks one cell per action
    and pushes a box by walking into it when the cell behind the box is free (floor or target, no box). Boxes cannot
    be pulled or pushed two at a time. Levels are generated from the seed (see
    :mod:`envs.grid.sokoban.generate`): a random room and random targets, then, by ``generator``:
    ``"ragen"``, RAGEN's reverse play (pull boxes off the targets depth-first, keep the state that
    displaced them most, walk the player a few random steps); ``"uniform_depth"``, a backward
    breadth-first search from the solved room gives every start state its exact shortest solution
    length and the start is drawn uniformly among those needing ``min_solution_steps..search_depth``
    steps with no box on a target (harder levels). Every level is solvable. A hand-built board can
    be loaded with ``reset(options={"board": ...})`` (see
    :func:`~envs.grid.sokoban.text.parse_board`).

    ## Action Space
    ``Discrete(4)``: 0 Up, 1 Down, 2 Left, 3 Right (``action_names``). Anything that is not an integer in
    ``[0, 4)`` (a NumPy integer counts) is an invalid action: the state does not change, the reward is 0, no step
    is counted and ``info["action_is_valid"]`` is False.

    ## Observation Space
    A string (``Text`` over printable ASCII plus the lookup's symbols), by ``observation_format``:

    * ``"grid"``: one row per line, one symbol per cell: ``#`` wall, ``_`` empty, ``O`` target, ``√`` box on
      target, ``X`` box, ``P`` player, ``S`` player on target (or the ``grid_lookup`` symbols);
    * ``"coord"``: ``Board size: R rows x C cols (zero-indexed).`` then, only when non-empty, lines
      ``Targets: (r, c), ...`` (covered targets included), ``Boxes:``, ``Boxes on target:``, ``Player:``,
      ``Player on target:``;
    * ``"grid_coord"``: ``"Coordinates: \\n" + coord + "\\n" + "Grid Map: \\n" + grid``.

    ## Rewards
    Every valid action: -0.1; +1 when the number of boxes on targets goes up, -1 when it goes down; +10 more when
    every box is on a target. Invalid actions and actions after the episode ended: 0.

    Optional distance shaping (``distance_reward`` c > 0; off by default, RAGEN has none): every valid action also
    earns ``c * (d_before - d_after)``, d the length of a shortest solution from the state (:meth:`solve`; a state
    that can no longer be solved, or none found within ``search_budget`` states, counts as ``dead_distance``).
    A walk towards the solution earns +c a step, a step away -c, a push into a dead corner ``-c * (dead_distance -
    d_before)``. It is potential-based shaping (Ng, Harada and Russell, 1999: the potential ``-c * d``), so an
    episode's shaping sums to ``c * (d_start - d_end)`` and the best policy is unchanged; it only tells a failed
    episode that got closer from one that did not. ``info["success"]`` and the unshaped reward's ranking of solved
    episodes do not change.

    Optional heuristic shaping (``heuristic_reward`` c > 0; off by default): the same potential-based form with a
    distance read from the observed grid alone, no search and no solver: h = 3 x the sum over boxes off a target of
    the Manhattan distance to the nearest free target, plus the Manhattan distance from the player to the nearest cell
    it must stand on to push such a box towards that target (the cell behind the box on an axis where box and target
    differ). The factor 3 makes every push towards a target a gain, also one after which the player must walk round
    the box (at most 2 steps further from the next push cell); a box off a target in a corner (a wall above or below
    it and a wall left or right of it) can never move again, and h is then ``dead_distance``; h is capped at
    ``dead_distance`` and is 0 when solved. Every valid
    action earns ``c * (h_before - h_after)``. It ignores walls between cells, so a detour around the box or a wall
    scores as a step away. Use one of the two shapings (both > 0 is refused).

    ## Episode End
    ``terminated`` when every box is on a target (``info["success"]``). ``truncated`` when ``max_steps`` valid
    actions were taken without solving. After the end, ``step`` is harmless: same observation, reward 0, the same
    ``terminated``/``truncated`` flags, ``action_is_effective`` False.

    ``info`` on reset and every step: ``success``, ``action_is_effective`` (the player moved),
    ``action_is_valid``, ``boxes_on_target``; on reset of a generated level also ``optimal_steps`` (length of a
    shortest solution, as :meth:`solve` returns).

    ## Arguments
    Every keyword defaults to ``DEFAULTS`` updated by ``PRESETS[preset]``; explicit keywords override both.

    * ``dim_room=(6, 6)``: (rows, cols) of generated rooms, border included (each in [3, 30]).
    * ``num_boxes=1``: boxes (and targets) per generated room.
    * ``max_steps=100``: valid actions per episode before truncation.
    * ``observation_format="grid"``: ``"grid"``, ``"coord"`` or ``"grid_coord"``.
    * ``grid_lookup=None``: cell code -> symbol (codes 0..6 above), default ``{0:"#",1:"_",2:"O",3:"√",4:"X",
      5:"P",6:"S"}``; single characters, all different.
    * ``grid_vocab=None``: symbol -> meaning for the prompt legend; missing symbols get the code's meaning.
    * ``generator="uniform_depth"`` (``"ragen"`` in every preset): the level generator, see the description.
    * ``search_depth=300`` (at most 1000): bound of the reverse play: ``"ragen"``, RAGEN's ``ttl`` (pull sequences of at most
      ``search_depth - 2`` moves); ``"uniform_depth"``, the longest shortest-solution (in steps) a level may have.
    * ``min_solution_steps=2``: shortest shortest-solution a generated level may have (``"uniform_depth"`` only;
      RAGEN's generator has no such floor and yields 1-step levels ~10 % of the time at 6x6).
    * ``search_budget=10000`` (at most 1000000): states the backward search may find per room (``"uniform_depth"`` only: bounds
      generation time of big rooms; ``"ragen"`` caps its reverse play at RAGEN's 300000 explored states).
    * ``distance_reward=0.0``: the shaping coefficient c above (finite, >= 0; 0 = RAGEN's rewards).
    * ``heuristic_reward=0.0``: the heuristic shaping's coefficient c above (finite, >= 0; 0 = RAGEN's rewards).
    * ``dead_distance=20``: the distance an unsolvable state (a cornered box under heuristic shaping) counts as
      (>= 1).
    * ``preset=None``: one of ``PRESETS`` (SimpleSokoban, LargerSokoban, CoordSokoban, SokobanDifferentGridVocab).
    * ``render_mode=None``: ``"ansi"`` makes ``render()`` return the observation text.
    """

    branchable = True  # small in-process state: turns may branch (--data.branching.branches)

    action_names = ACTION_NAMES
    # settings that change rewards only (not observations or the expert's actions): warm starts
    # ignore them
    reward_only_kwargs = ("distance_reward", "heuristic_reward", "dead_distance")

    def __init__(
        self,
        dim_room: tuple[int, int] | None = None,
        num_boxes: int | None = None,
        max_steps: int | None = None,
        observation_format: str | None = None,
        grid_lookup: dict[int, str] | None = None,
        grid_vocab: dict[str, str] | None = None,
        search_depth: int | None = None,
        min_solution_steps: int | None = None,
        search_budget: int | None = None,
        generator: str | None = None,
        distance_reward: float | None = None,
        dead_distance: int | None = None,
        heuristic_reward: float | None = None,
        preset: str | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        if preset is not None and preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)} or None, got {preset!r}")
        cfg = dict(DEFAULTS)
        if preset is not None:
            cfg.update(PRESETS[preset])
        explicit = {
            "dim_room": dim_room,
            "num_boxes": num_boxes,
            "max_steps": max_steps,
            "observation_format": observation_format,
            "grid_lookup": grid_lookup,
            "grid_vocab": grid_vocab,
            "search_depth": search_depth,
            "min_solution_steps": min_solution_steps,
            "search_budget": search_budget,
            "generator": generator,
            "distance_reward": distance_reward,
            "dead_distance": dead_distance,
            "heuristic_reward": heuristic_reward,
        }
        cfg.update({k: v for k, v in explicit.items() if v is not None})
        self.preset = preset

        self._check_settings(cfg)
        self._distance = 0
        self.grid_lookup, self.grid_vocab, symbols = check_symbols(
            cfg["grid_lookup"], cfg["grid_vocab"]
        )

        self.action_space = spaces.Discrete(4)
        self.observation_space = text_space(extra_chars="".join(symbols))
        # placeholder until the first reset: an empty, already-finished 1x1 room (step refuses to
        # run on it)
        self._was_reset = False
        self._set_board(1, 1, 0, 0, 0, gen.geometry(1, 1).index(0, 0), optimal_steps=None)

    def _check_settings(self, cfg: dict[str, Any]) -> None:
        """Validate the merged keywords (defaults, preset, explicit) other than the symbols and set
        them as attributes, in the order that names the first bad one."""
        dim = tuple(cfg["dim_room"]) if isinstance(cfg["dim_room"], (tuple, list)) else ()
        if len(dim) != 2:
            raise ValueError(
                f"SokobanEnv: dim_room must be two integers in [3, {MAX_DIM_ROOM}] "
                f"(rows, cols), got {cfg['dim_room']!r}"
            )
        self.dim_room = (
            bounded_int("SokobanEnv", "dim_room[0]", dim[0], 3, MAX_DIM_ROOM),
            bounded_int("SokobanEnv", "dim_room[1]", dim[1], 3, MAX_DIM_ROOM),
        )
        interior = (self.dim_room[0] - 2) * (self.dim_room[1] - 2)
        self.num_boxes = bounded_int("SokobanEnv", "num_boxes", cfg["num_boxes"], 1)
        if self.num_boxes + 1 > interior:
            raise ValueError(
                f"num_boxes={self.num_boxes} is too many for dim_room={self.dim_room}: the room's interior has "
                f"{interior} cells for the boxes and the player"
            )
        self.max_steps = bounded_int("SokobanEnv", "max_steps", cfg["max_steps"], 1)
        if cfg["observation_format"] not in OBSERVATION_FORMATS:
            raise ValueError(
                f"observation_format must be one of {OBSERVATION_FORMATS}, got {cfg['observation_format']!r}"
            )
        self.observation_format = cfg["observation_format"]
        self.search_depth = bounded_int(
            "SokobanEnv", "search_depth", cfg["search_depth"], 1, MAX_SEARCH_DEPTH
        )
        self.min_solution_steps = bounded_int(
            "SokobanEnv", "min_solution_steps", cfg["min_solution_steps"], 1
        )
        if self.min_solution_steps > self.search_depth:
            raise ValueError(
                f"min_solution_steps={self.min_solution_steps} must be <= search_depth={self.search_depth}"
            )
        self.search_budget = bounded_int(
            "SokobanEnv", "search_budget", cfg["search_budget"], 1, MAX_SEARCH_BUDGET
        )
        if cfg["generator"] not in GENERATORS:
            raise ValueError(f"generator must be one of {GENERATORS}, got {cfg['generator']!r}")
        self.generator = cfg["generator"]
        for name in ("distance_reward", "heuristic_reward"):
            c = cfg[name]
            if (
                isinstance(c, bool)
                or not isinstance(c, (int, float, np.integer, np.floating))
                or not math.isfinite(c)
                or c < 0
            ):
                raise ValueError(f"{name} must be a finite number >= 0, got {c!r}")
            setattr(self, name, float(c))
        if self.distance_reward and self.heuristic_reward:
            raise ValueError(
                f"distance_reward={self.distance_reward} and heuristic_reward={self.heuristic_reward}: "
                "two shapings of the same progress; set one of them (the other 0)"
            )
        self.dead_distance = bounded_int("SokobanEnv", "dead_distance", cfg["dead_distance"], 1)

    # ------------------------------------------------------------------ gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        board = self._reset_options(options, ("board",)).get("board")
        self._was_reset = True
        if board is not None:
            self._set_board(*parse_board(board, self.grid_lookup), optimal_steps=None)
        else:
            rng = self.np_random
            if self.generator == "ragen":
                level = ragen.generate_level_ragen(
                    lambda n: rng.random(n).tolist(),
                    self.dim_room[0],
                    self.dim_room[1],
                    self.num_boxes,
                    self.search_depth,
                    ragen.RAGEN_MAX_STATES,
                    _MAX_GENERATION_TRIES,
                )
            else:
                level = gen.generate_level(
                    lambda n: rng.random(n).tolist(),
                    self.dim_room[0],
                    self.dim_room[1],
                    self.num_boxes,
                    self.min_solution_steps,
                    self.search_depth,
                    self.search_budget,
                    _MAX_GENERATION_TRIES,
                )
            self._set_board(
                level.rows,
                level.cols,
                level.floor,
                level.targets,
                level.boxes,
                level.player,
                optimal_steps=level.optimal_steps,
            )
        if self.distance_reward:
            self._distance = (
                self._optimal_steps if self._optimal_steps is not None else self._distance_now()
            )
        elif self.heuristic_reward:
            self._distance = self.heuristic_distance()
        info = self._info(effective=False, valid=True)
        if self._optimal_steps is not None:
            info["optimal_steps"] = self._optimal_steps
        return self._render_text(), info

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if not self._was_reset:
            raise RuntimeError("SokobanEnv.step called before reset: call reset() first")
        a = as_action(action, 4)
        if a is None or self._terminated or self._truncated:
            return (
                self._render_text(),
                0.0,
                self._terminated,
                self._truncated,
                self._info(False, a is not None),
            )
        o = self._offsets[a]
        p = self._player
        t = p + o
        tbit = 1 << t
        on_before = (self._boxes & self._targets).bit_count()
        moved = False
        if self._floor & tbit:
            if self._boxes & tbit:
                t2bit = 1 << (t + o)
                if self._floor & t2bit and not self._boxes & t2bit:
                    self._boxes ^= tbit | t2bit
                    moved = True
            else:
                moved = True
        if moved:
            self._player = t
        self._num_env_steps += 1
        on_after = (self._boxes & self._targets).bit_count()
        reward = -0.1
        if on_after > on_before:
            reward += 1.0
        elif on_after < on_before:
            reward -= 1.0
        if moved and self.distance_reward:
            before, self._distance = self._distance, self._distance_now()
            reward += self.distance_reward * (before - self._distance)
        elif moved and self.heuristic_reward:
            before, self._distance = self._distance, self.heuristic_distance()
            reward += self.heuristic_reward * (before - self._distance)
        if self._boxes == self._targets:
            reward += 10.0
            self._terminated = True
        elif self._num_env_steps >= self.max_steps:
            self._truncated = True
        return (
            self._render_text(),
            reward,
            self._terminated,
            self._truncated,
            self._info(moved, True),
        )

    def prompt_spec(self) -> PromptSpec:
        if self.observation_format == "grid":
            instruction = INSTRUCTION
        else:
            instruction = COORD_INSTRUCTION.format(
                what="a symbol grid and " if self.observation_format == "grid_coord" else "",
                last_row=self.dim_room[0] - 1,
                last_col=self.dim_room[1] - 1,
            )
        symbols = () if self.observation_format == "coord" else tuple(self.grid_vocab.items())
        return PromptSpec(instruction=instruction, action_names=self.action_names, symbols=symbols)

    # ------------------------------------------------------------------ solver and state views
    def solve(self, max_states: int | None = None) -> list[int] | None:
        """A shortest action sequence (0..3 = Up, Down, Left, Right) from the current state that
        solves the level; ``[]`` when already solved, None when the state cannot be solved any more
        (e.g. a box pushed into a corner) or no solution was found within ``max_states`` searched
        states. Ignores the remaining step budget."""
        return gen.solve(
            self._geo, self._floor, self._targets, self._boxes, self._player, max_states
        )

    def _distance_now(self) -> int:
        """Shortest-solution length from the current state, ``dead_distance`` when unsolvable
        (distance shaping)."""
        plan = self.solve(self.search_budget)
        return self.dead_distance if plan is None else min(len(plan), self.dead_distance)

    def heuristic_distance(self) -> int:
        """The heuristic shaping's h of the current state (class docstring, "Rewards"): read from
        the grid, no search. 0 when solved, ``dead_distance`` with a cornered box off a target."""
        geo, floor = self._geo, self._floor
        off = list(gen.iter_bits(self._boxes & ~self._targets))
        if not off:
            return 0
        up, down, left, right = self._offsets
        free_targets = [geo.coords(t) for t in gen.iter_bits(self._targets & ~self._boxes)]
        pr, pc = geo.coords(self._player)
        boxes_term, player_term = 0, None
        for b in off:
            wall = [not (floor >> (b + o)) & 1 for o in (up, down, left, right)]
            if (wall[0] or wall[1]) and (wall[2] or wall[3]):
                return self.dead_distance
            br, bc = geo.coords(b)
            tr, tc = min(free_targets, key=lambda t: abs(t[0] - br) + abs(t[1] - bc))
            boxes_term += 3 * (abs(tr - br) + abs(tc - bc))
            pushes = []
            if tr != br:
                pushes.append((br - (1 if tr > br else -1), bc))
            if tc != bc:
                pushes.append((br, bc - (1 if tc > bc else -1)))
            near = min(abs(pr - r) + abs(pc - c) for r, c in pushes)
            player_term = near if player_term is None else min(player_term, near)
        return min(boxes_term + player_term, self.dead_distance)

    @property
    def optimal_steps(self) -> int | None:
        """Shortest solution length of the generated level at reset (None for a hand-built
        board)."""
        return self._optimal_steps

    @property
    def num_env_steps(self) -> int:
        return self._num_env_steps

    @property
    def boxes_on_target(self) -> int:
        return (self._boxes & self._targets).bit_count()

    @property
    def player_position(self) -> tuple[int, int]:
        return self._geo.coords(self._player)

    @property
    def room_fixed(self) -> np.ndarray:
        """Static cells as int8 codes: 0 wall, 1 floor, 2 target."""
        return self._codes(dynamic=False)

    @property
    def room_state(self) -> np.ndarray:
        """Current cells as int8 codes: 0 wall, 1 empty, 2 target, 3 box on target, 4 box, 5 player
        (RAGEN's ``room_state``; the render shows a player on a target as code 6)."""
        return self._codes(dynamic=True)

    # ------------------------------------------------------------------ internals
    def _set_board(self, rows, cols, floor, targets, boxes, player, *, optimal_steps):
        self._geo = gen.geometry(rows, cols)
        self._offsets = self._geo.offsets
        self._rows, self._cols = rows, cols
        self._floor, self._targets, self._boxes, self._player = floor, targets, boxes, player
        self._optimal_steps = optimal_steps
        self._num_env_steps = 0
        self._terminated = boxes == targets
        self._truncated = False
        self._text = BoardText(self._geo, floor, targets, self.grid_lookup)

    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert: the first ``max_actions`` steps of a shortest solution
        (:meth:`solve`) from the current state.

        Reasoning: where the first box that is off a target lies relative to the nearest free target
        and relative to the player, then the moves, e.g. ``"box is above and left of target, below
        me; I go Down, Right"``. The second relation says which way the player must walk to get
        behind the box; without it the clause names the push but not the first moves (the warm start
        read the clause on 0.77 of held-out turns yet solved 0.17, docs/learning.md).
        """
        plan = self.solve()
        names = tuple(self.action_names)
        # None: unsolvable from here (cannot happen on an expert's own path); []: already solved
        if not plan:
            return "no push can solve this any more; I go " + names[0], (names[0],)
        actions = tuple(names[a] for a in plan[:max_actions])
        state, fixed = np.asarray(self.room_state), np.asarray(self.room_fixed)
        boxes = [tuple(int(x) for x in rc) for rc in np.argwhere(state == 4)]
        targets = [tuple(int(x) for x in rc) for rc in np.argwhere((fixed == 2) & (state != 3))]
        if boxes and targets:
            box = boxes[0]
            target = min(targets, key=lambda t: (abs(t[0] - box[0]) + abs(t[1] - box[1]), t))
            me = tuple(self.player_position)
            return (
                f"box is {relation(box, target)} target, {relation(box, me)} me; {going(actions)}",
                actions,
            )
        return going(actions), actions

    def _render_text(self) -> str:
        fmt = self.observation_format
        if fmt == "grid":
            return self._grid()
        if fmt == "coord":
            return self._coord()
        return "Coordinates: \n" + self._coord() + "\n" + "Grid Map: \n" + self._grid()

    def _grid(self) -> str:
        return self._text.grid(self._boxes, self._player)

    def _coord(self) -> str:
        return self._text.coord(self._boxes, self._player)

    def _info(self, effective: bool, valid: bool) -> dict[str, Any]:
        return {
            "success": self._boxes == self._targets,
            "action_is_effective": effective,
            "action_is_valid": valid,
            "boxes_on_target": (self._boxes & self._targets).bit_count(),
        }

    def _codes(self, dynamic: bool) -> np.ndarray:
        geo = self._geo
        out = np.zeros((self._rows, self._cols), dtype=np.int8)
        for r in range(self._rows):
            for c in range(self._cols):
                bit = 1 << geo.index(r, c)
                if self._floor & bit:
                    out[r, c] = 2 if self._targets & bit else 1
                    if dynamic and self._boxes & bit:
                        out[r, c] = 3 if self._targets & bit else 4
        if dynamic:
            out[self.player_position] = 5
        return out
