"""Intervals of the evaluation and the benchmarks: Wilson's for a proportion, a seeded percentile
bootstrap for other means, and the paired difference of two runs over the same levels."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "bootstrap",
    "interval",
    "paired_difference",
    "wilson",
]

BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 2000, 0  # the percentile bootstrap of non-[0, 1] metrics


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion ``k / n``."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(
    after: Sequence[float], before: Sequence[float], z: float = 1.96
) -> tuple[float, float, float]:
    """``(d, lo, hi)``: the mean of ``after[i] - before[i]`` over paired items (the same levels
    played twice) and its normal-approximation interval, ``d +- z * sd(diffs) / sqrt(n)``. Pairing
    removes the levels' own difficulty from the noise: tighter than comparing two independent
    proportions."""
    if len(after) != len(before) or len(after) < 2:
        raise ValueError(
            f"paired_difference needs two equal lists of >= 2 items, got {len(after)}, {len(before)}"
        )
    diffs = [float(a) - float(b) for a, b in zip(after, before, strict=True)]
    d = sum(diffs) / len(diffs)
    sd = math.sqrt(sum((x - d) ** 2 for x in diffs) / (len(diffs) - 1))
    half = z * sd / math.sqrt(len(diffs))
    return d, d - half, d + half


def bootstrap(
    values: Sequence[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values``: ``resamples`` draws of
    ``len(values)`` values with replacement (a generator seeded with ``seed``: the same values give
    the same interval), then the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the
    resampled means. It lies within ``[min(values), max(values)]``, so within any range the values
    are bounded by."""
    x = torch.tensor([float(v) for v in values], dtype=torch.float64)
    idx = torch.randint(len(x), (resamples, len(x)), generator=torch.Generator().manual_seed(seed))
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(x[idx].mean(1), q).tolist()
    return lo, hi


def interval(
    values: Sequence[float], *, unit: bool = False, z: float = 1.96
) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` over per-seed values: ``unit`` values (in [0, 1]: success, format-valid,
    pass@k) get Wilson's interval of ``sum / n`` (exact for 0/1 values; a [0, 1] value's variance is
    at most mean * (1 - mean), what Wilson's interval assumes, so for fractions it is conservative);
    others (return, turns) the percentile
    :func:`bootstrap`. Both stay inside the values' range, unlike the normal approximation."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = sum(values) / n
    if unit:
        return (mean, *wilson(sum(values), n, z))
    return (mean, *bootstrap(values))
