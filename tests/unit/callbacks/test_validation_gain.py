"""callbacks.ValidationGain: the paired gain over the first validation, by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from callbacks import ValidationGain


def _batch(successes, seeds=None):
    seeds = seeds or list(range(len(successes)))
    trajs = [
        SimpleNamespace(seed=100 + s, env_index=i, success=bool(x))
        for i, (s, x) in enumerate(zip(seeds, successes, strict=True))
    ]
    return SimpleNamespace(trajectories=trajs)


class _Module:
    def __init__(self):
        self.logged = []
        self.validating_first = False

    def log_dict(self, values, **kwargs):
        self.logged.append(values)


def _trainer(fn="fit", sanity=False):
    return SimpleNamespace(state=SimpleNamespace(fn=fn), sanity_checking=sanity)


def test_later_validations_log_the_gain_paired_over_the_same_levels():
    cb, module = ValidationGain(), _Module()
    module.validating_first = True  # iteration 0: the trainer validates before fitting
    cb.on_validation_batch_end(_trainer("validate"), module, None, _batch([0, 0, 1, 1]), 0)
    module.validating_first = False
    assert module.logged == [] and cb.first == {"100/0": 0, "101/1": 0, "102/2": 1, "103/3": 1}
    cb.on_validation_batch_end(_trainer(), module, None, _batch([1, 0, 1, 1]), 0)
    # diffs 1, 0, 0, 0: mean 0.25, sample sd 0.5, se 0.25, half 1.96 * 0.25 = 0.49
    (gain,) = module.logged
    assert gain == pytest.approx(
        {"val/success_gain": 0.25, "val/success_gain_lo": -0.24, "val/success_gain_hi": 0.74}
    )


def test_sanity_checks_and_stand_alone_validation_compare_nothing_and_state_survives():
    cb, module = ValidationGain(), _Module()
    cb.on_validation_batch_end(_trainer(sanity=True), module, None, _batch([1, 1]), 0)
    cb.on_validation_batch_end(_trainer("validate"), module, None, _batch([1, 1]), 0)
    assert cb.first is None and module.logged == []
    cb.on_validation_batch_end(_trainer(), module, None, _batch([0, 1, 0]), 0)
    resumed = ValidationGain()
    resumed.load_state_dict(cb.state_dict())
    resumed.on_validation_batch_end(_trainer(), module, None, _batch([1, 1, 0]), 0)
    d = module.logged[0]["val/success_gain"]
    assert d == pytest.approx(1 / 3) and math.isfinite(module.logged[0]["val/success_gain_lo"])
