"""BestActorExport: exports on a new best only, in the monitored direction, atomically; skips plain
validate runs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from callbacks import BestActorExport
from callbacks.best_actor import improves
from ragen_lightning.errors import ConfigError


class FakeModule:
    def __init__(self):
        self.last_rollout, self.last_logs, self.weights = None, {}, 0.0
        self.device_mesh = None  # LightningModule's public property: None unless FSDP2 built a mesh

    def export_actor(self, path):
        path.mkdir(parents=True)
        (path / "weights.txt").write_text(str(self.weights))


class FakeLogger:
    def __init__(self):
        self.logged = []

    def log_metrics(self, values, step):
        self.logged.append((step, values))


def fake_trainer(value, fn="fit", step=0):
    return SimpleNamespace(
        state=SimpleNamespace(fn=fn),
        sanity_checking=False,
        callback_metrics={"val_success": torch.tensor(value)},
        global_step=step,
        global_rank=0,
        strategy=SimpleNamespace(barrier=lambda: None),
        loggers=[FakeLogger()],
        fit_loop=SimpleNamespace(total_batch_idx=step),
    )


def validate_after(cb, module, value, iteration, weights, fn="fit"):
    """One validation after ``iteration`` training iterations (0: the starting model, before any
    rollout)."""
    if iteration:
        module.last_rollout, module.last_logs = object(), {"iteration": float(iteration - 1)}
    module.weights = weights
    trainer = fake_trainer(value, fn, step=3 * iteration)
    cb.on_validation_end(trainer, module)
    return trainer


def test_improves_by_mode_and_min_delta():
    assert improves(0.3, None, "max", 0.0) and improves(0.3, None, "min", 0.0)
    # a tie keeps the earlier
    assert improves(0.5, 0.4, "max", 0.0) and not improves(0.4, 0.4, "max", 0.0)
    assert not improves(0.44, 0.4, "max", 0.05) and improves(0.46, 0.4, "max", 0.05)
    assert improves(0.3, 0.4, "min", 0.0) and not improves(0.5, 0.4, "min", 0.0)


def test_exports_each_new_best_with_its_iteration(tmp_path):
    cb, module = BestActorExport(dirpath=str(tmp_path / "best")), FakeModule()
    module.validating_first = True  # the CLI's --validate_first runs under trainer.validate
    validate_after(cb, module, 0.30, 0, weights=0.0, fn="validate")
    module.validating_first = False
    assert json.loads((tmp_path / "best" / "best.json").read_text())["iteration"] == 0
    trainer = validate_after(cb, module, 0.45, 20, weights=20.0)
    assert trainer.loggers[0].logged == [
        (60, {"best/val_success": pytest.approx(0.45), "best/iteration": 20})
    ]
    validate_after(cb, module, 0.40, 40, weights=40.0)  # worse: the folder keeps iteration 20
    validate_after(cb, module, 0.45, 60, weights=60.0)  # a tie: still 20
    record = json.loads((tmp_path / "best" / "best.json").read_text())
    assert record == {
        "monitor": "val_success",
        "value": pytest.approx(0.45),
        "iteration": 20,
        "global_step": 60,
    }
    assert (tmp_path / "best" / "weights.txt").read_text() == "20.0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]  # no temporary or old folder left
    assert cb.state_dict() == {"best": pytest.approx(0.45), "best_iteration": 20}


def test_min_mode_and_resume_keeps_the_best(tmp_path):
    cb, module = (
        BestActorExport(dirpath=str(tmp_path / "best"), monitor="val_success", mode="min"),
        FakeModule(),
    )
    validate_after(cb, module, 0.5, 10, weights=10.0)
    resumed = BestActorExport(dirpath=str(tmp_path / "best"), mode="min")
    resumed.load_state_dict(cb.state_dict())
    validate_after(resumed, module, 0.6, 20, weights=20.0)  # higher is worse under min
    assert (tmp_path / "best" / "weights.txt").read_text() == "10.0"
    validate_after(resumed, module, 0.2, 30, weights=30.0)
    assert (tmp_path / "best" / "weights.txt").read_text() == "30.0"


def test_plain_validate_and_sanity_checks_never_export(tmp_path):
    cb, module = BestActorExport(dirpath=str(tmp_path / "best")), FakeModule()
    # main.py validate of a checkpoint
    validate_after(cb, module, 0.9, 5, weights=5.0, fn="validate")
    trainer = fake_trainer(0.9)
    trainer.sanity_checking = True
    cb.on_validation_end(trainer, module)
    assert not (tmp_path / "best").exists() and cb.best is None


def test_bad_settings_and_unlogged_monitor_name_the_culprit(tmp_path):
    with pytest.raises(ConfigError, match="mode must be 'max' or 'min', got 'up'"):
        BestActorExport(dirpath=str(tmp_path), mode="up")
    with pytest.raises(ConfigError, match="min_delta must be a finite number >= 0, got -0.1"):
        BestActorExport(dirpath=str(tmp_path), min_delta=-0.1)
    cb = BestActorExport(dirpath=str(tmp_path / "best"), monitor="val/sucess")
    with pytest.raises(
        ConfigError,
        match=r"monitor 'val/sucess' was not logged by validation \(validation logged: "
        r"val_success\)",
    ):
        cb.on_validation_end(fake_trainer(0.5), FakeModule())
