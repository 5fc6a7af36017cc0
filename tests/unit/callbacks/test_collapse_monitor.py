"""CollapseMonitor: rules on synthetic metric streams, each action, and state round trips."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from callbacks import CollapseMonitor
from ragen_lightning.data.sampler import FilterSettings
from ragen_lightning.errors import ConfigError
from ragen_lightning.starpo.module import StarPOModule

RS, ENT, GN, MI = (
    "rollout/in_group_reward_std",
    "actor/entropy",
    "actor/grad_norm",
    "collapse/first_turn/mi",
)


def _monitor(**kw) -> CollapseMonitor:
    args = {
        "baseline_window": 5,
        "window": 3,
        "reward_std_ratio": 0.3,
        "entropy_ratio": 0.5,
        "mi_ratio": 0.3,
        "mi_baseline_window": 2,
        "mi_window": 2,
        "grad_spike_factor": 5.0,
        "compute_freq": 0,
    }
    return CollapseMonitor(**{**args, **kw})


def _run(monitor, stream) -> list[tuple[int, str]]:
    fired = []
    for it, values in enumerate(stream, start=1):
        fired += [(it, r) for r in monitor.observe(values)]
    return fired


def _healthy(n=20):
    # reward std wobbles around 1, entropy declines slowly 2.0 -> 1.62, grad norm around 1, MI every
    # 5th iteration
    out = []
    for i in range(n):
        v = {RS: 1.0 + 0.2 * (-1) ** i, ENT: 2.0 - 0.02 * i, GN: 1.0 + 0.5 * (i % 3)}
        if i % 5 == 0:
            v[MI] = 0.5 + 0.05 * (i % 2)
        out.append(v)
    return out


def test_healthy_stream_never_fires():
    assert _run(_monitor(), _healthy()) == []


def test_collapsing_reward_std_fires_after_window():
    # baseline = mean of the first 5 values = 1.0; threshold 0.3 * 1.0 = 0.3; below it at iterations
    # 7, 8, 9
    stream = [{RS: 1.0}] * 5 + [
        {RS: 0.5},
        {RS: 0.2},
        {RS: 0.2},
        {RS: 0.1},
        {RS: 0.1},
        {RS: 0.1},
        {RS: 0.1},
    ]
    # the streak restarts after firing
    assert _run(_monitor(), stream) == [(9, "reward_std"), (12, "reward_std")]


def test_entropy_drop_mi_drop_and_grad_spike():
    # entropy: baseline 2.0, threshold 1.0; values 0.9 at iterations 6, 7, 8 -> fires at 8
    ent = [{ENT: 2.0}] * 5 + [{ENT: 0.9}] * 3
    assert _run(_monitor(), ent) == [(8, "entropy")]
    # a recovery in the middle resets the streak: 0.9, 1.5, 0.9, 0.9 -> no third low value in a row
    assert (
        _run(_monitor(), [{ENT: 2.0}] * 5 + [{ENT: 0.9}, {ENT: 1.5}, {ENT: 0.9}, {ENT: 0.9}]) == []
    )
    # MI: baseline (0.6 + 0.4) / 2 = 0.5, threshold 0.15; measurements 0.1, 0.1 -> fires at the
    # second
    mi = [{MI: 0.6}, {}, {MI: 0.4}, {}, {MI: 0.1}, {}, {MI: 0.1}]
    assert _run(_monitor(), mi) == [(7, "mi")]
    # grad spike: median of [1, 1, 2, 1, 1] = 1, 6 > 5 x 1 fires; 4 does not
    gn = [{GN: 1.0}, {GN: 1.0}, {GN: 2.0}, {GN: 1.0}, {GN: 1.0}, {GN: 4.0}, {GN: 6.0}]
    assert _run(_monitor(), gn) == [(7, "grad_spike")]
    # fewer than baseline_window values known: no spike however large
    assert _run(_monitor(), [{GN: 1.0}, {GN: 100.0}]) == []


def test_template_collapse_stream_fires_only_the_mi_rule():
    # RAGEN-2's template collapse: entropy and reward std stay put while the MI falls
    stream = []
    for i in range(15):
        v = {RS: 1.0, ENT: 2.0}
        if i % 2 == 0:
            v[MI] = 0.8 if i < 4 else 0.05
        stream.append(v)
    # MI measured at iterations 1, 3 (baseline 0.8), then 0.05 at 5, 7 -> fires at 7, again at 11
    # and 15
    assert _run(_monitor(), stream) == [(7, "mi"), (11, "mi"), (15, "mi")]


def test_non_positive_baseline_and_disabled_rules_stay_silent():
    # baseline 0: no fraction to fall below
    assert _run(_monitor(), [{RS: 0.0}] * 5 + [{RS: 0.0}] * 5) == []
    # an MI baseline of 1e-5 nats (reasoning never depended on the prompt) is below mi_min_baseline
    # = 0.01
    assert _run(_monitor(), [{MI: 1e-5}, {MI: 1e-5}, {MI: 0.0}, {MI: 0.0}, {MI: 0.0}]) == []
    assert _run(_monitor(mi_min_baseline=0.0), [{MI: 1e-5}, {MI: 1e-5}, {MI: 0.0}, {MI: 0.0}]) == [
        (4, "mi")
    ]
    m = _monitor(reward_std_ratio=0, entropy_ratio=0, mi_ratio=0, grad_spike_factor=0)
    assert m.rules == {}


def _fake(tmp_path, filter_value=0.9, entropy_coeff=0.001):
    saved = []
    trainer = SimpleNamespace(
        should_stop=False,
        default_root_dir=str(tmp_path),
        save_checkpoint=saved.append,
        datamodule=SimpleNamespace(filter=FilterSettings(value=filter_value)),
    )
    # no model is loaded before configure_model
    module = StarPOModule(loss={"entropy_coeff": entropy_coeff})
    return trainer, module, saved


def test_each_action_does_what_it_says(tmp_path):
    trainer, module, saved = _fake(tmp_path)
    with pytest.warns(UserWarning, match="reward_std rule fired at iteration 9"):
        logs = _monitor(actions=["log"]).act(trainer, module, 9, ["reward_std"])
    assert logs == {"collapse_monitor/warning/reward_std": 1.0, "collapse_monitor/action/log": 1.0}
    assert not trainer.should_stop and saved == [] and trainer.datamodule.filter.value == 0.9

    warnings.simplefilter("ignore")
    trainer, module, saved = _fake(tmp_path)
    _monitor(actions=["stop"]).act(trainer, module, 9, ["entropy"])
    assert trainer.should_stop

    _monitor(actions=["checkpoint"]).act(trainer, module, 4, ["mi", "grad_spike"])
    assert saved == [str(tmp_path / "collapse_checkpoints" / "collapse-mi-grad_spike-iter4.ckpt")]
    _monitor(actions=["checkpoint"], dirpath=str(tmp_path / "x")).act(trainer, module, 5, ["mi"])
    assert saved[-1] == str(tmp_path / "x" / "collapse-mi-iter5.ckpt")

    m = _monitor(actions=["adjust_filter"])
    m.act(trainer, module, 9, ["reward_std"])
    assert trainer.datamodule.filter.value == pytest.approx(0.72)  # 0.9 x 0.8
    trainer.datamodule.filter = FilterSettings(value=0.11)
    m.act(trainer, module, 12, ["reward_std"])
    assert trainer.datamodule.filter.value == 0.1  # 0.11 x 0.8 = 0.088, floored at filter_value_min
    assert m.adjusted == {"filter_value": 0.1}
    # the settings are replaced by a checked copy: top_k_abs (a number of groups) refuses 3.2
    trainer.datamodule.filter = counted = FilterSettings(strategy="top_k_abs", value=4)
    with pytest.warns(
        UserWarning,
        match=r"adjust_filter left the filter as it was: "
        r"--data.filter.value must be a whole number .* got 3.2",
    ):
        m.act(trainer, module, 13, ["reward_std"])
    assert trainer.datamodule.filter is counted and m.adjusted == {"filter_value": 0.1}

    m = _monitor(actions=["adjust_entropy"])
    m.act(trainer, module, 9, ["entropy"])
    assert module.loss.entropy_coeff == pytest.approx(0.002)  # 0.001 x 2
    # what a checkpoint saves
    assert module.hparams["loss"]["entropy_coeff"] == pytest.approx(0.002)
    module.set_entropy_coeff(0.0)
    m.act(trainer, module, 10, ["entropy"])
    assert module.loss.entropy_coeff == 1e-3  # zero -> entropy_coeff_start
    module.set_entropy_coeff(0.04)
    m.act(trainer, module, 11, ["entropy"])
    assert module.loss.entropy_coeff == 0.05  # 0.08 capped at entropy_coeff_max
    assert m.fired == [(9, "entropy"), (10, "entropy"), (11, "entropy")]


def test_state_dict_round_trip_continues_the_same_stream(tmp_path):
    stream = (
        [{RS: 1.0, GN: 1.0}] * 5 + [{RS: 0.2, GN: 1.0}] * 2 + [{RS: 0.2, GN: 9.0}] + [{RS: 0.2}] * 3
    )
    whole = _run(_monitor(), stream)
    assert whole == [(8, "reward_std"), (8, "grad_spike"), (11, "reward_std")]
    first = _monitor(actions=["adjust_entropy"])
    head = _run(first, stream[:6])
    state = first.state_dict()
    second = _monitor(actions=["adjust_entropy"])
    second.load_state_dict(state)
    tail = [(it + 6, r) for it, r in _run(second, stream[6:])]
    assert head + tail == whole
    # adjusted values come back on resume (the module's hparams are not restored by a fit resume)
    trainer, module, _ = _fake(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first.act(trainer, module, 6, ["entropy"])
    third = _monitor(actions=["adjust_entropy"])
    third.load_state_dict(first.state_dict())
    trainer2, module2, _ = _fake(tmp_path)
    third.on_train_start(trainer2, module2)
    assert module2.loss.entropy_coeff == pytest.approx(0.002) and third.fired == [(6, "entropy")]


def test_bad_settings_raise():
    with pytest.raises(ConfigError, match="actions"):
        CollapseMonitor(actions=["explode"])
    with pytest.raises(ConfigError, match="window"):
        CollapseMonitor(window=0)
