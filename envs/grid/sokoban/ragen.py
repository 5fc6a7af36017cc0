"""RAGEN's Sokoban level generator (``ragen/env/sokoban/utils.py``, adapted from gym-sokoban) on the
bitmask boards of :mod:`envs.grid.sokoban.generate`: the same choices in the same order, so a seed
gives RAGEN's level distribution (``generator="ragen"`` of
:class:`envs.grid.sokoban.env.SokobanEnv`, the presets named after RAGEN's tags).

It is its own module because it shares only the board encoding, the room walk's constants and the
solver with the default generator (:func:`envs.grid.sokoban.generate.generate_level`): RAGEN's room
walk, its depth-first reverse play and its player walk are a second, independent procedure. All
randomness comes from one caller-supplied source of uniforms, read one at a time in RAGEN's order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from envs.grid.sokoban.generate import (
    P_TURN,
    WALK_FACTOR,
    Geometry,
    Level,
    geometry,
    iter_bits,
    solve,
)

# gym-sokoban's five topology masks (3x3 around the walker), as (row, col) offsets of their ones
RAGEN_STAMPS = (
    ((0, -1), (0, 0), (0, 1)),  # [[0,0,0],[1,1,1],[0,0,0]]
    ((-1, 0), (0, 0), (1, 0)),  # [[0,1,0],[0,1,0],[0,1,0]]
    ((0, -1), (0, 0), (1, 0)),  # [[0,0,0],[1,1,0],[0,1,0]]
    ((0, -1), (0, 0), (1, -1), (1, 0)),  # [[0,0,0],[1,1,0],[1,1,0]]
    ((0, 0), (0, 1), (1, 0)),  # [[0,0,0],[0,1,1],[0,1,0]]
)
RAGEN_DIRECTIONS = ((1, 0), (0, 1), (-1, 0), (0, -1))
RAGEN_MAX_WALK = 3  # extra player steps after the reverse play
RAGEN_MAX_STATES = 300_000  # RAGEN's cap on the reverse play's explored states


def _stream(uniforms: Callable[[int], Sequence[float]]) -> Callable[[], float]:
    """One uniform at a time from a block source (blocks of 64, consumed in order)."""
    buf: list[float] = []

    def nxt() -> float:
        if not buf:
            buf.extend(reversed(list(uniforms(64))))
        return buf.pop()

    return nxt


def carve_room_ragen(rows: int, cols: int, u: Callable[[], float]) -> int:
    """RAGEN's ``room_topology_generation``: a walk of ``int(1.7 (rows + cols))`` steps from a
    random cell (row in ``[1, rows - 1]``, as ``random.randint`` draws it), turning to a random
    direction with probability 0.35 before each step, clamped to the interior, stamping one of
    :data:`RAGEN_STAMPS`; the border stays wall."""
    geo = geometry(rows, cols)
    r, c = 1 + int(u() * (rows - 1)), 1 + int(u() * (cols - 1))
    dr, dc = RAGEN_DIRECTIONS[int(u() * 4)]
    floor = 0
    for _ in range(int(WALK_FACTOR * (rows + cols))):
        if u() < P_TURN:
            dr, dc = RAGEN_DIRECTIONS[int(u() * 4)]
        r, c = max(min(r + dr, rows - 2), 1), max(min(c + dc, cols - 2), 1)
        for sr, sc in RAGEN_STAMPS[int(u() * len(RAGEN_STAMPS))]:
            if 1 <= r + sr <= rows - 2 and 1 <= c + sc <= cols - 2:
                floor |= 1 << geo.index(r + sr, c + sc)
    return floor


def ragen_reverse_play(
    geo: Geometry,
    floor: int,
    targets: Sequence[int],
    player: int,
    search_depth: int,
    max_states: int,
) -> tuple[tuple[int, ...], int, int]:
    """RAGEN's ``reverse_playing``: a depth-first search from the solved room (box ``i`` on
    ``targets[i]``) where every move pulls the box behind the player, if any (RAGEN explores its
    pull actions 0..3 only).

    A state is scored ``box_swaps x sum of Manhattan distances (box, its own target)``, 0 unless
    every target is empty (no box, no player); ``box_swaps`` counts the pulls of a box other than
    the last one pulled. Each state (box cells, player) is expanded once, the first time the search
    reaches it; ``ttl`` starts at ``search_depth`` and drops by one per call (states deeper than
    ``search_depth - 2`` moves are never scored); at most ``max_states`` states. Returns the first
    best state: (box cells by box, player, its displacement score).
    """
    offsets = geo.offsets
    stride = geo.stride
    tmask = 0
    for t in targets:
        tmask |= 1 << t
    explored: set[tuple[int, int]] = set()
    best: list = [-1, tuple(targets), player]

    def displacement(pos: tuple[int, ...]) -> int:
        total = 0
        for p, t in zip(pos, targets):
            pr, pc = divmod(p, stride)
            tr, tc = divmod(t, stride)
            total += abs(pr - tr) + abs(pc - tc)
        return total

    def dfs(pos: tuple[int, ...], boxes: int, player: int, swaps: int, last: int, ttl: int) -> None:
        ttl -= 1
        if ttl <= 0 or len(explored) >= max_states:
            return
        key = (boxes, player)
        if key in explored:
            return
        score = 0 if boxes & tmask or tmask >> player & 1 else swaps * displacement(pos)
        if score > best[0]:
            best[:] = [score, pos, player]
        explored.add(key)
        for o in offsets:
            nxt = player + o
            if not floor >> nxt & 1 or boxes >> nxt & 1:
                continue  # RAGEN recurses into the unchanged, already explored state: a no-op
            behind = player - o
            if boxes >> behind & 1:  # pull it onto the player's old cell
                i = pos.index(behind)
                dfs(
                    pos[:i] + (player,) + pos[i + 1 :],
                    boxes ^ (1 << behind) ^ (1 << player),
                    nxt,
                    swaps + (i != last),
                    i,
                    ttl,
                )
            else:
                dfs(pos, boxes, nxt, swaps, last, ttl)

    dfs(tuple(targets), tmask, player, 0, -1, search_depth)
    pos, player = best[1], best[2]
    return pos, player, displacement(pos) if best[0] > 0 else 0


def generate_level_ragen(
    uniforms: Callable[[int], Sequence[float]],
    rows: int,
    cols: int,
    num_boxes: int,
    search_depth: int,
    max_states: int,
    max_tries: int,
) -> Level:
    """RAGEN's ``generate_room`` on masks: carve a room (:func:`carve_room_ragen`); put the player,
    then the targets, on uniform distinct floor cells (a room with ``<= num_boxes + 1`` floor cells
    is redrawn); reverse play (:func:`ragen_reverse_play`; a room whose best state displaces no box
    is redrawn, where RAGEN retries 4 rooms then reseeds); then, with probability 0.8 if the
    displacement is 1 else 0.5, walk the player 1-3 random steps to free cells not visited in this
    walk (another step with probability 0.5 after each).

    Every level is solvable (reverse play and walks undo to the solved room); ``optimal_steps`` is
    measured with
    :func:`solve`. Raises RuntimeError after ``max_tries`` rooms without a level.
    """
    geo = geometry(rows, cols)
    u = _stream(uniforms)
    offsets = geo.offsets
    for _ in range(max_tries):
        floor = carve_room_ragen(rows, cols, u)
        free = list(iter_bits(floor))
        if len(free) <= num_boxes + 1:
            continue
        player = free.pop(int(u() * len(free)))
        targets = [free.pop(int(u() * len(free))) for _b in range(num_boxes)]
        pos, player, disp = ragen_reverse_play(
            geo, floor, targets, player, search_depth, max_states
        )
        if disp == 0:
            continue
        boxes = 0
        for p in pos:
            boxes |= 1 << p
        if u() <= (0.8 if disp == 1 else 0.5):
            visited = [player]
            for step in range(1, RAGEN_MAX_WALK + 1):
                moves = [
                    player + o
                    for o in offsets
                    if floor >> (player + o) & 1
                    and not boxes >> (player + o) & 1
                    and player + o not in visited
                ]
                if not moves:
                    break
                player = moves[int(u() * len(moves))]
                visited.append(player)
                if step >= RAGEN_MAX_WALK or u() > 0.5:
                    break
        tmask = 0
        for t in targets:
            tmask |= 1 << t
        plan = solve(geo, floor, tmask, boxes, player)
        if plan is None:  # pragma: no cover - reverse play only reaches solvable states
            raise AssertionError("RAGEN reverse play produced an unsolvable level")
        return Level(rows, cols, floor, tmask, boxes, player, len(plan))
    raise RuntimeError(
        f"no Sokoban level with dim_room=({rows}, {cols}) and num_boxes={num_boxes} found by RAGEN's generator in "
        f"{max_tries} rooms"
    )
