"""Sokoban boards as text (:mod:`envs.grid.sokoban.env`): the cell symbols, reading a hand-built
board, and rendering a board in the grid and coordinate formats.

Boards are :mod:`envs.grid.sokoban.generate`'s bitmasks; this module turns them into the strings the
agent reads and back. It is its own module because the env's rules and rewards never look at
symbols: everything here depends on the board and the symbol lookup only. The renderings are
bit-identical to RAGEN's sokoban env: the tiny model's tokenizer corpus and every measured result
were produced from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from envs.grid.sokoban import generate as gen

# Cell codes: 0 wall, 1 empty, 2 target, 3 box on target, 4 box, 5 player, 6 player on target.
DEFAULT_GRID_LOOKUP = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
CODE_MEANINGS = {
    0: "wall",
    1: "empty",
    2: "target",
    3: "box on target",
    4: "box",
    5: "player",
    6: "player on target",
}


def parse_board(board: str | Sequence[str] | np.ndarray, grid_lookup: dict[int, str] | None = None):
    """Read a hand-built board: rows of symbols (a newline-separated string or a list of strings, in
    the symbols of ``grid_lookup``, default ``#_O√XPS``) or a 2-D array of cell codes 0..6.

    Returns ``(rows, cols, floor, targets, boxes, player)`` in :mod:`envs.grid.sokoban.generate`'s
    bitmask encoding. Raises ValueError for ragged rows, unknown symbols, not exactly one player, no
    box, or a box/target mismatch.
    """
    lookup = grid_lookup or DEFAULT_GRID_LOOKUP
    inverse = {v: k for k, v in lookup.items()}
    if isinstance(board, str):
        board = board.strip("\n").split("\n")
    if isinstance(board, np.ndarray) or (len(board) and not isinstance(board[0], str)):
        codes = np.asarray(board)
        if (
            codes.ndim != 2
            or not np.issubdtype(codes.dtype, np.integer)
            or codes.min() < 0
            or codes.max() > 6
        ):
            raise ValueError("board: a code array must be 2-D with integer cell codes 0..6")
        grid = codes.tolist()
    else:
        grid = []
        for r, line in enumerate(board):
            row = []
            for c, ch in enumerate(line):
                if ch not in inverse:
                    raise ValueError(
                        f"board: unknown symbol {ch!r} at ({r}, {c}); symbols are {sorted(inverse)}"
                    )
                row.append(inverse[ch])
            grid.append(row)
    if not grid or not grid[0] or any(len(row) != len(grid[0]) for row in grid):
        raise ValueError("board: rows must be non-empty and of equal length")
    rows, cols = len(grid), len(grid[0])
    geo = gen.geometry(rows, cols)
    floor = targets = boxes = 0
    players = []
    for r, row in enumerate(grid):
        for c, code in enumerate(row):
            bit = 1 << geo.index(r, c)
            if code:
                floor |= bit
            if code in (2, 3, 6):
                targets |= bit
            if code in (3, 4):
                boxes |= bit
            if code in (5, 6):
                players.append(geo.index(r, c))
    if len(players) != 1:
        raise ValueError(f"board: needs exactly one player, found {len(players)}")
    if not boxes or boxes.bit_count() != targets.bit_count():
        raise ValueError(
            f"board: needs at least one box and as many targets as boxes "
            f"({boxes.bit_count()} boxes, {targets.bit_count()} targets)"
        )
    return rows, cols, floor, targets, boxes, players[0]


def check_symbols(
    grid_lookup: dict[Any, str] | None, grid_vocab: dict[str, str] | None
) -> tuple[dict[int, str], dict[str, str], list[str]]:
    """The validated ``(grid_lookup, grid_vocab, symbols)`` of the env's keywords: the lookup keyed
    by cell code 0..6 in order (``None``: :data:`DEFAULT_GRID_LOOKUP`; digit-string keys, as read
    from JSON, become ints), the legend with every symbol (a missing meaning is the code's,
    :data:`CODE_MEANINGS`), and the symbols in the order the caller gave them (the order of the
    observation space's extra characters)."""
    lookup = dict(grid_lookup or DEFAULT_GRID_LOOKUP)
    if all(isinstance(k, str) and k.isdigit() for k in lookup):  # e.g. keys read from JSON
        lookup = {int(k): v for k, v in lookup.items()}
    if set(lookup) != set(range(7)):
        raise ValueError(
            f"grid_lookup must map each cell code 0..6 to a symbol, got keys {sorted(lookup)}"
        )
    symbols = list(lookup.values())
    if (
        not all(isinstance(s, str) and len(s) == 1 and s not in "\n\r" for s in symbols)
        or len(set(symbols)) != 7
    ):
        raise ValueError(
            f"grid_lookup symbols must be 7 different single characters, got {symbols!r}"
        )
    vocab = dict(grid_vocab or {})
    unknown = set(vocab) - set(symbols)
    if unknown:
        raise ValueError(
            f"grid_vocab has symbols {sorted(unknown)} that grid_lookup does not render"
        )
    return (
        {k: lookup[k] for k in range(7)},
        {lookup[k]: vocab.get(lookup[k], CODE_MEANINGS[k]) for k in range(7)},
        symbols,
    )


class BoardText:
    """The text of one board (its size, floor and targets fixed; boxes and player given per call) in
    the symbols of ``lookup``: :meth:`grid` (one symbol per cell) and :meth:`coord` (cell lists).
    Built once per board, it caches what every render shares: the static symbol per character of the
    grid text and the coordinate header."""

    def __init__(self, geo: gen.Geometry, floor: int, targets: int, lookup: dict[int, str]):
        self._geo, self._targets, self._lookup = geo, targets, lookup
        wall, empty, target = lookup[0], lookup[1], lookup[2]
        layout = geo.layout
        # the static symbol per character of the grid text; bit index -> position in that list
        self._base = [
            "\n" if i < 0 else target if targets >> i & 1 else empty if floor >> i & 1 else wall
            for i in layout
        ]
        self._pos = _positions(layout)
        self._coord_head = f"Board size: {geo.rows} rows x {geo.cols} cols (zero-indexed)."
        tcells = geo.cells(targets)
        self._coord_targets = "Targets: " + _fmt(tcells) if tcells else None

    def grid(self, boxes: int, player: int) -> str:
        chars = self._base.copy()
        lk, pos, tg = self._lookup, self._pos, self._targets
        b = boxes
        while b:
            low = b & -b
            b ^= low
            chars[pos[low.bit_length() - 1]] = lk[3] if tg & low else lk[4]
        chars[pos[player]] = lk[6] if tg >> player & 1 else lk[5]
        return "".join(chars)

    def coord(self, boxes: int, player: int) -> str:
        geo, tg, bx = self._geo, self._targets, boxes
        lines = [self._coord_head]
        if self._coord_targets:
            lines.append(self._coord_targets)
        off, on = geo.cells(bx & ~tg), geo.cells(bx & tg)
        if off:
            lines.append("Boxes: " + _fmt(off))
        if on:
            lines.append("Boxes on target: " + _fmt(on))
        label = "Player on target: " if tg >> player & 1 else "Player: "
        lines.append(label + _fmt([geo.coords(player)]))
        return "\n".join(lines)


@lru_cache(maxsize=64)
def _positions(layout: tuple[int, ...]) -> dict[int, int]:
    return {i: k for k, i in enumerate(layout) if i >= 0}


def _fmt(cells: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"({r}, {c})" for r, c in cells)
