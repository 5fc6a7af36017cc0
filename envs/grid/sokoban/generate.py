"""Sokoban level generation and shortest-path solving on bitmask boards (pure Python, no
dependency).

Board encoding
--------------
A ``rows x cols`` board is embedded in a grid padded with one cell of wall on every side, stored
row-major with ``stride = cols + 2``. Cell ``(r, c)`` is bit ``(r + 1) * stride + c + 1`` of a
Python ``int``. A board is three masks and one index:

* ``floor``: every non-wall cell (targets included); padding cells are never floor, so moving off
  the board is the same as moving into a wall and shifting a mask by one row/column never wraps into
  a real cell;
* ``targets``: target cells; ``boxes``: cells holding a box; ``player``: the player's bit index.

A move in direction ``o`` (one of :attr:`Geometry.offsets`: Up, Down, Left, Right) is a shift by
``o`` bits.

Exact distances by bit-parallel breadth-first search
----------------------------------------------------
Searches run over the full state (box set, player cell), so distances count player steps (walks and
pushes), not just pushes. States are grouped by box set: for each box set a search keeps one ``int``
mask of player cells, so a whole layer of walking moves is one dilation (four shifts, one ``&``) and
the pushes/pulls out of a layer are found with a few masks per direction. This keeps a 6x6
single-box state space (a few hundred states) to a fraction of a millisecond in CPython.

* :func:`reverse_layers` searches backwards (walks and *pulls*) from every solved state at once. A
  state found in layer ``d`` needs exactly ``d`` steps to be solved, so a level drawn from layer
  ``d`` has a known optimal length and is solvable by construction.
* :func:`solve` searches forwards from one state and reconstructs a shortest action sequence from
  the layers.

Level generation (:func:`generate_level`)
-----------------------------------------
1. carve a room: a random walk over the interior stamps small floor shapes (:func:`carve_room`);
2. put the targets on distinct random floor cells;
3. :func:`reverse_layers` from the solved room, up to ``max_steps`` deep (and ``max_states``
   states);
4. draw the start uniformly among the states found at depth ``>= min_steps`` with no box on a target
   (:func:`pick_state`); if there is none, start over with a new room.

All randomness comes from one caller-supplied source of uniforms, drawn in blocks.

RAGEN's own generator (``generator="ragen"``) uses the same boards and :func:`solve`; it lives in
:mod:`envs.grid.sokoban.ragen`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

# Action indices 0..3 = Up, Down, Left, Right; (row, col) deltas.
DELTAS = ((-1, 0), (1, 0), (0, -1), (0, 1))

# Room carving: a random walk over the interior that stamps one of these shapes (cells relative to
# the walker) at every step. Turn probability and walk length follow RAGEN's generator (0.35, 1.7 x
# (rows + cols) steps).
_STAMPS = (
    ((0, -1), (0, 0), (0, 1)),  # horizontal bar
    ((-1, 0), (0, 0), (1, 0)),  # vertical bar
    ((0, 0), (-1, 0), (0, -1)),  # corner, arms up and left
    ((0, 0), (1, 0), (0, 1)),  # corner, arms down and right
    ((0, 0), (0, 1), (1, 0), (1, 1)),  # 2x2 block
)
P_TURN = 0.35
WALK_FACTOR = 1.7


def iter_bits(mask: int) -> Iterator[int]:
    """Indices of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class Geometry:
    """Index arithmetic of a padded ``rows x cols`` board (see the module docstring); get one via
    :func:`geometry`."""

    __slots__ = ("rows", "cols", "stride", "offsets", "layout")

    def __init__(self, rows: int, cols: int):
        self.rows, self.cols = rows, cols
        self.stride = s = cols + 2
        self.offsets = (-s, s, -1, 1)  # Up, Down, Left, Right
        # text layout of a grid render: the bit index of each character, -1 for the newline between
        # rows
        self.layout = tuple(
            i
            for r in range(rows)
            for i in ([-1] if r else []) + [self.index(r, c) for c in range(cols)]
        )

    def __repr__(self) -> str:
        return f"Geometry(rows={self.rows}, cols={self.cols})"

    def index(self, r: int, c: int) -> int:
        return (r + 1) * self.stride + c + 1

    def coords(self, i: int) -> tuple[int, int]:
        r, c = divmod(i, self.stride)
        return r - 1, c - 1

    def mask(self, cells: Iterable[tuple[int, int]]) -> int:
        m = 0
        for r, c in cells:
            m |= 1 << self.index(r, c)
        return m

    def cells(self, mask: int) -> list[tuple[int, int]]:
        """Cells of ``mask`` in row-major order."""
        return [self.coords(i) for i in iter_bits(mask)]


@lru_cache(maxsize=64)
def geometry(rows: int, cols: int) -> Geometry:
    return Geometry(rows, cols)


@lru_cache(maxsize=64)
def _carve_tables(
    rows: int, cols: int
) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """Tables over cells ``r * cols + c``: ``stamps[k][cell]`` is the floor mask of stamp k centred
    on an interior cell (border cells left out); ``steps[d][cell]`` is the interior cell one step in
    direction d (clamped)."""
    geo = geometry(rows, cols)
    stamps = []
    for stamp in _STAMPS:
        row = [0] * (rows * cols)
        for r in range(1, rows - 1):
            for c in range(1, cols - 1):
                row[r * cols + c] = geo.mask(
                    (r + dr, c + dc)
                    for dr, dc in stamp
                    if 1 <= r + dr <= rows - 2 and 1 <= c + dc <= cols - 2
                )
        stamps.append(tuple(row))
    steps = []
    for dr, dc in DELTAS:
        row = [0] * (rows * cols)
        for r in range(1, rows - 1):
            for c in range(1, cols - 1):
                row[r * cols + c] = min(max(r + dr, 1), rows - 2) * cols + min(
                    max(c + dc, 1), cols - 2
                )
        steps.append(tuple(row))
    return tuple(stamps), tuple(steps)


def carve_room(rows: int, cols: int, u: Sequence[float]) -> int:
    """Floor mask of a random room: a walk over the interior stamping small shapes; the border stays
    wall.

    ``u`` supplies the uniforms in [0, 1): 3 for the start, then 2 per walk step
    (:func:`room_uniforms_needed`).
    """
    stamps, steps = _carve_tables(rows, cols)
    n_stamps = len(stamps)
    cell = (1 + int(u[0] * (rows - 2))) * cols + 1 + int(u[1] * (cols - 2))
    step = steps[int(u[2] * 4)]
    floor = 0
    k = 3
    for _ in range(int(WALK_FACTOR * (rows + cols))):
        x = u[k]
        if x < P_TURN:  # one uniform decides both whether to turn and the new direction
            step = steps[int(x / P_TURN * 4)]
        cell = step[cell]
        floor |= stamps[int(u[k + 1] * n_stamps)][cell]
        k += 2
    return floor


def room_uniforms_needed(rows: int, cols: int) -> int:
    return 3 + 2 * int(WALK_FACTOR * (rows + cols))


def reverse_layers(
    geo: Geometry, floor: int, targets: int, max_depth: int, max_states: int
) -> list[dict[int, int]]:
    """Backward search from every solved state (boxes on ``targets``, player on any other floor
    cell).

    Returns ``layers`` where ``layers[d]`` maps a box set to the mask of player cells whose state
    first appears at depth ``d``, i.e. states whose shortest solution has exactly ``d`` steps. The
    search stops after layer ``max_depth``, when no new state is found, or once ``max_states``
    states were found (the last layer may then be partial; every state it holds still has exactly
    that distance).
    """
    s = geo.stride
    start = floor & ~targets
    layers: list[dict[int, int]] = [{targets: start}]
    # box set -> [player cells seen, free cells, player cells from which some pull is possible]
    cfg: dict[int, list[int]] = {}
    cget = cfg.get

    _pull_entry(cfg, floor, s, targets)[0] = start
    frontier = layers[0]
    found = start.bit_count()
    for _ in range(max_depth):
        nxt: dict[int, int] = {}
        nget = nxt.get
        for boxes, fr in frontier.items():
            c = cfg[boxes]
            seen, free = c[0], c[1]
            # reverse of a walk is a walk
            walk = ((fr << 1) | (fr >> 1) | (fr << s) | (fr >> s)) & free & ~seen
            if walk:
                c[0] = seen | walk
                nxt[boxes] = nget(boxes, 0) | walk
            if not fr & c[2]:
                continue
            # reverse of a push is a pull: player at q, box at q+o, cell q-o free -> box to q,
            # player to q-o
            for k in (1, s):
                for cand, up in (
                    (fr & (boxes >> k) & (free << k), True),  # o = +k
                    (fr & (boxes << k) & (free >> k), False),  # o = -k
                ):
                    while cand:
                        q = cand & -cand
                        cand ^= q
                        if up:
                            nb, p = boxes ^ (q << k) ^ q, q >> k
                        else:
                            nb, p = boxes ^ (q >> k) ^ q, q << k
                        c2 = cget(nb) or _pull_entry(cfg, floor, s, nb)
                        if not c2[0] & p:
                            c2[0] |= p
                            nxt[nb] = nget(nb, 0) | p
        if not nxt:
            break
        layers.append(nxt)
        frontier = nxt
        found += sum(map(int.bit_count, nxt.values()))
        if found >= max_states:
            break
    return layers


def solve(
    geo: Geometry, floor: int, targets: int, boxes: int, player: int, max_states: int | None = None
) -> list[int] | None:
    """A shortest action sequence (indices 0..3 = Up, Down, Left, Right) that puts every box on a
    target.

    ``[]`` when the state is already solved; ``None`` when no solution exists (or none was found
    within ``max_states`` searched states). Requires as many targets as boxes.
    """
    if boxes == targets:
        return []
    s = geo.stride
    start = 1 << player
    layers: list[dict[int, int]] = [{boxes: start}]
    # box set -> [player cells seen, free cells, player cells from which some push is possible]
    cfg: dict[int, list[int]] = {}
    cget = cfg.get

    _push_entry(cfg, floor, s, boxes)[0] = start
    frontier = layers[0]
    found = 1
    while True:
        nxt: dict[int, int] = {}
        nget = nxt.get
        for bx, fr in frontier.items():
            c = cfg[bx]
            seen, free = c[0], c[1]
            walk = ((fr << 1) | (fr >> 1) | (fr << s) | (fr >> s)) & free & ~seen
            if walk:
                c[0] = seen | walk
                nxt[bx] = nget(bx, 0) | walk
            if not fr & c[2]:
                continue
            # push: player at p, box at p+o, cell p+2o free -> box to p+2o, player to p+o
            for k in (1, s):
                k2 = 2 * k
                for cand, up in (
                    (fr & (bx >> k) & (free >> k2), True),
                    (fr & (bx << k) & (free << k2), False),
                ):
                    while cand:
                        p = cand & -cand
                        cand ^= p
                        if up:
                            np_, nb = p << k, bx ^ (p << k) ^ (p << k2)
                        else:
                            np_, nb = p >> k, bx ^ (p >> k) ^ (p >> k2)
                        if nb == targets:
                            layers.append({nb: np_})
                            return _reconstruct(geo, layers, nb, np_.bit_length() - 1)
                        c2 = cget(nb) or _push_entry(cfg, floor, s, nb)
                        if not c2[0] & np_:
                            c2[0] |= np_
                            nxt[nb] = nget(nb, 0) | np_
        if not nxt:
            return None
        layers.append(nxt)
        frontier = nxt
        found += sum(map(int.bit_count, nxt.values()))
        if max_states is not None and found >= max_states:
            return None


def _pull_entry(cfg: dict[int, list[int]], floor: int, s: int, b: int) -> list[int]:
    """:func:`reverse_layers`' new table entry for box set ``b`` (``s`` the stride): ``[player cells
    seen, free cells, player cells from which some pull is possible]``, stored in ``cfg``."""
    free = floor & ~b
    # pull possible from q when a box is at q+o and q-o is free, for some direction o
    pull = (
        ((b >> 1) & (free << 1))
        | ((b << 1) & (free >> 1))
        | ((b >> s) & (free << s))
        | ((b << s) & (free >> s))
    )
    c = cfg[b] = [0, free, pull]
    return c


def _push_entry(cfg: dict[int, list[int]], floor: int, s: int, b: int) -> list[int]:
    """:func:`solve`'s new table entry for box set ``b`` (``s`` the stride): ``[player cells seen,
    free cells, player cells from which some push is possible]``, stored in ``cfg``."""
    free = floor & ~b
    # push possible from p when a box is at p+o and p+2o is free, for some direction o
    push = (
        ((b >> 1) & (free >> 2))
        | ((b << 1) & (free << 2))
        | ((b >> s) & (free >> 2 * s))
        | ((b << s) & (free << 2 * s))
    )
    c = cfg[b] = [0, free, push]
    return c


def _reconstruct(geo: Geometry, layers: list[dict[int, int]], boxes: int, player: int) -> list[int]:
    """Walk back from a state in the last layer to the start, one predecessor per layer."""
    offsets = geo.offsets
    actions: list[int] = []
    for d in range(len(layers) - 2, -1, -1):
        layer = layers[d]
        for a, o in enumerate(offsets):  # noqa: B007 (a: the action found, read after the loop)
            prev = player - o
            pbit = 1 << prev
            if layer.get(boxes, 0) & pbit:  # walked from prev
                break
            ahead = player + o
            if boxes >> ahead & 1:  # pushed the box now at `ahead` from `player`
                pb = boxes ^ (1 << ahead) ^ (1 << player)
                if layer.get(pb, 0) & pbit:
                    boxes = pb
                    break
        else:  # pragma: no cover - the layers always hold a predecessor
            raise AssertionError("broken search layers")
        actions.append(a)
        player = prev
    actions.reverse()
    return actions


@dataclass(frozen=True)
class Level:
    """A generated level: masks on :func:`geometry` ``(rows, cols)`` and its exact shortest solution
    length."""

    rows: int
    cols: int
    floor: int
    targets: int
    boxes: int
    player: int
    optimal_steps: int


def pick_state(
    layers: list[dict[int, int]], targets: int, min_steps: int, x: float
) -> tuple[int, int, int] | None:
    """Draw (boxes, player index, distance) uniformly among states at distance >= ``min_steps`` with
    no box on a target, using the uniform ``x``; None when there is none."""
    pool: list[tuple[int, int, int]] = []  # (box set, player mask, distance)
    total = 0
    for d in range(min_steps, len(layers)):
        for boxes, m in layers[d].items():
            if not boxes & targets:
                pool.append((boxes, m, d))
                total += m.bit_count()
    if not total:
        return None
    k = int(x * total)
    for boxes, m, d in pool:
        n = m.bit_count()
        if k < n:
            for i in iter_bits(m):
                if not k:
                    return boxes, i, d
                k -= 1
        k -= n
    raise AssertionError("unreachable")  # pragma: no cover


def generate_level(
    uniforms: Callable[[int], Sequence[float]],
    rows: int,
    cols: int,
    num_boxes: int,
    min_steps: int,
    max_steps: int,
    max_states: int,
    max_tries: int,
) -> Level:
    """Carve a room, place targets, search backwards from the solved room and draw a start state.

    ``uniforms(n)`` must return ``n`` floats in [0, 1) (e.g. ``lambda n:
    np_random.random(n).tolist()``): every random choice comes from it, so a seeded source gives the
    same level on every run and platform. Raises RuntimeError after ``max_tries`` rooms without a
    state at distance ``>= min_steps``.
    """
    geo = geometry(rows, cols)
    n_room = room_uniforms_needed(rows, cols)
    for _ in range(max_tries):
        u = uniforms(n_room + num_boxes + 1)
        floor = carve_room(rows, cols, u)
        free = list(iter_bits(floor))
        if len(free) < num_boxes + 2:
            continue
        targets = 0
        k = n_room
        for _b in range(num_boxes):
            targets |= 1 << free.pop(int(u[k] * len(free)))
            k += 1
        layers = reverse_layers(geo, floor, targets, max_steps, max_states)
        picked = pick_state(layers, targets, min_steps, u[k])
        if picked is None:
            continue
        boxes, player, d = picked
        return Level(rows, cols, floor, targets, boxes, player, d)
    raise RuntimeError(
        f"no Sokoban level with dim_room=({rows}, {cols}), num_boxes={num_boxes} and a shortest solution of at "
        f"least min_solution_steps={min_steps} steps found in {max_tries} rooms"
    )
