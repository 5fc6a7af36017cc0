"""The Sudoku solver and puzzle generator of :mod:`envs.grid.sudoku.env`, on flat lists with
bitmasks (bit ``v - 1`` set = number ``v`` used).

A depth-first search that branches on the most constrained cell counts solutions up to a limit
(:func:`search_solutions`); the generator fills an empty grid with it in random order, then blanks
cells one at a time in a seeded random order, keeping a blank only when no completion puts another
number there, so every puzzle has exactly one solution. All randomness comes from the caller's
``np.random.Generator``. Search-node budgets bound every search: a check that runs out is answered
conservatively (see the budgets below).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np


@functools.cache
def _geometry(
    n: int,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Row, column and box index of every cell, and each cell's peers (same row, column or box)."""
    b = math.isqrt(n)
    rows = tuple(i // n for i in range(n * n))
    cols = tuple(i % n for i in range(n * n))
    boxes = tuple((i // n) // b * b + (i % n) // b for i in range(n * n))
    peers = tuple(
        tuple(
            j
            for j in range(n * n)
            if j != i and (rows[j] == rows[i] or cols[j] == cols[i] or boxes[j] == boxes[i])
        )
        for i in range(n * n)
    )
    return rows, cols, boxes, peers


def search_solutions(
    values: list[int],
    n: int,
    limit: int,
    forbid: dict[int, int] | None = None,
    rng: np.random.Generator | None = None,
    max_nodes: int | None = None,
) -> tuple[int, list[int] | None]:
    """Count solutions of a flat board up to ``limit``; also return the first solution found.

    Depth-first search, always branching on the empty cell with the fewest candidates. ``forbid``
    maps a cell to a bitmask of numbers it may not take. With ``rng`` the candidates of each cell
    are tried in random order (used to fill an empty board randomly). When more than ``max_nodes``
    search nodes are needed the count is -1 (unknown).
    """
    rows, cols, boxes, _ = _geometry(n)
    units = _unit_masks(values, n)
    if units is None:
        return 0, None  # the givens already clash
    rm, cm, bm, empties = units
    allowed = [(1 << n) - 1] * (n * n)
    for cell, mask in (forbid or {}).items():
        allowed[cell] &= ~mask
    work = list(values)
    count = 0
    first: list[int] | None = None
    num_empty = len(empties)
    budget = [max_nodes if max_nodes is not None else -1]

    def dfs(d: int) -> None:
        nonlocal count, first
        budget[0] -= 1
        if budget[0] == 0:
            raise _OutOfBudget
        if d == num_empty:
            count += 1
            if first is None:
                first = list(work)
            return
        best_mask = _branch_cell(d, empties, allowed, rm, cm, bm, n)
        if not best_mask:
            return
        i = empties[d]
        r, c, bx = rows[i], cols[i], boxes[i]
        for bit in _candidate_bits(best_mask, rng):
            work[i] = bit.bit_length()
            rm[r] |= bit
            cm[c] |= bit
            bm[bx] |= bit
            dfs(d + 1)
            rm[r] ^= bit
            cm[c] ^= bit
            bm[bx] ^= bit
            if count >= limit:
                break
        work[i] = 0

    try:
        dfs(0)
    except _OutOfBudget:
        return -1, None
    return count, first


def _unit_masks(
    values: list[int], n: int
) -> tuple[list[int], list[int], list[int], list[int]] | None:
    """The numbers used in each row, column and box (bitmasks) and the empty cells of a flat board;
    None when two givens clash."""
    rows, cols, boxes, _ = _geometry(n)
    rm, cm, bm = [0] * n, [0] * n, [0] * n
    empties: list[int] = []
    for i, v in enumerate(values):
        if v:
            bit = 1 << (v - 1)
            if (rm[rows[i]] | cm[cols[i]] | bm[boxes[i]]) & bit:
                return None
            rm[rows[i]] |= bit
            cm[cols[i]] |= bit
            bm[boxes[i]] |= bit
        else:
            empties.append(i)
    return rm, cm, bm, empties


def _branch_cell(
    d: int,
    empties: list[int],
    allowed: list[int],
    rm: list[int],
    cm: list[int],
    bm: list[int],
    n: int,
) -> int:
    """Move the empty cell with the fewest candidates among ``empties[d:]`` (the first such) to
    ``empties[d]`` and return its candidates' bitmask; 0, and nothing moved, when some cell has no
    candidate left."""
    rows, cols, boxes, _ = _geometry(n)
    num_empty = len(empties)
    best_j, best_mask, best_n = -1, 0, n + 1
    for j in range(d, num_empty):
        i = empties[j]
        mask = allowed[i] & ~(rm[rows[i]] | cm[cols[i]] | bm[boxes[i]])
        k = mask.bit_count()
        if k < best_n:
            best_j, best_mask, best_n = j, mask, k
            if k <= 1:
                break
    if best_n == 0:
        return 0
    empties[d], empties[best_j] = empties[best_j], empties[d]
    return best_mask


def _candidate_bits(mask: int, rng: np.random.Generator | None) -> list[int]:
    """The set bits of ``mask``, lowest first, or in ``rng``'s random order (one permutation draw
    when there are two or more)."""
    bits = []
    while mask:
        bit = mask & -mask
        bits.append(bit)
        mask ^= bit
    if rng is not None and len(bits) > 1:
        bits = [bits[k] for k in rng.permutation(len(bits))]
    return bits


class _OutOfBudget(Exception):
    pass


# Search-node budgets for generation: a uniqueness check that needs more is treated as "not unique"
# (the cell keeps its number), a random fill that needs more restarts. 9x9 checks need well under
# 100 nodes; some 16x16 checks would otherwise run for minutes.
_CHECK_BUDGET = 2_000
_FILL_BUDGET = 50_000
# Default budget for checking a given puzzle (``reset(options={"puzzle": ...})``): generated hard
# 16x16 puzzles need up to ~55k nodes; 200k nodes take about 3 s on one busy core of the build
# machine. A 16x16 grid with a hidden contradiction (no cell without candidates, yet no solution)
# otherwise searches for minutes.
PUZZLE_SEARCH_BUDGET = 200_000


def check_grid(board: Any, n: int, name: str) -> np.ndarray:
    """``board`` as an ``n x n`` int64 array of 0..n (0 = empty), or a ValueError that calls it
    ``name``."""
    arr = np.asarray(board)
    if arr.shape != (n, n) or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"{name} must be a {n}x{n} grid of ints, got shape {arr.shape} and dtype {arr.dtype}"
        )
    if arr.min() < 0 or arr.max() > n:
        raise ValueError(f"{name} values must be in 0..{n} (0 = empty)")
    return arr.astype(np.int64)


def count_solutions(board: Any, limit: int = 2) -> int:
    """Number of solutions of a square Sudoku grid (0 = empty), counting stops at ``limit``."""
    arr = np.asarray(board)
    n = arr.shape[0] if arr.ndim == 2 else 0
    if n not in (4, 9, 16):
        raise ValueError(f"board must be 4x4, 9x9 or 16x16, got shape {arr.shape}")
    arr = check_grid(arr, n, "board")
    return search_solutions([int(v) for v in arr.ravel()], n, limit)[0]


def solve_sudoku(board: Any) -> np.ndarray | None:
    """A solution of the grid (0 = empty) as an array, or None if it has none."""
    arr = np.asarray(board)
    n = arr.shape[0] if arr.ndim == 2 else 0
    if n not in (4, 9, 16):
        raise ValueError(f"board must be 4x4, 9x9 or 16x16, got shape {arr.shape}")
    arr = check_grid(arr, n, "board")
    _, first = search_solutions([int(v) for v in arr.ravel()], n, 1)
    return None if first is None else np.array(first, dtype=np.int64).reshape(n, n)


def generate_sudoku(
    rng: np.random.Generator, grid_size: int, num_blanks: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(puzzle, solution)``: a random full grid, then up to ``num_blanks`` blanks keeping the
    solution unique."""
    n = grid_size
    _, _, _, peers = _geometry(n)
    solution = None
    while solution is None:
        _, solution = search_solutions([0] * (n * n), n, 1, rng=rng, max_nodes=_FILL_BUDGET)
    puzzle = list(solution)
    removed = 0
    for cell in rng.permutation(n * n):
        if removed >= num_blanks:
            break
        cell = int(cell)
        value = puzzle[cell]
        bit = 1 << (value - 1)
        puzzle[cell] = 0
        used = 0
        for p in peers[cell]:
            if puzzle[p]:
                used |= 1 << (puzzle[p] - 1)
        # The blank is safe when no other number fits there, or no completion uses another number
        # there.
        only_fit = (~used & ((1 << n) - 1)) == bit
        if only_fit or search_solutions(puzzle, n, 1, {cell: bit}, max_nodes=_CHECK_BUDGET)[0] == 0:
            removed += 1
        else:
            puzzle[cell] = value
    return np.array(puzzle, dtype=np.int64).reshape(n, n), np.array(
        solution, dtype=np.int64
    ).reshape(n, n)
