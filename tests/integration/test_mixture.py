"""Environment mixtures through the command line: configs/mixture.yaml trains on Bandit + FrozenLake
and validates on BanditTest + CoordFrozenLake, configs/bandit_heldout.yaml (RAGEN's _1_bandit)
validates on Bandit + BanditTest; the per-tag metrics land in the CSV log beside the pooled ones;
the warm start trains on every entry's demonstrations."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import envs  # noqa: F401
from ragen_lightning.cli import main
from tests.integration.inprocess import in_process  # noqa: F401  (autouse: main() in this process)

pytestmark = pytest.mark.slow
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# --validate_first false: both configs validate at iteration 0, which builds and closes the rollout
# engine a second time (~3-5 s); the validation after the iteration is the one read here (test_cli
# checks --validate_first)
SHORT = [
    "--model.warm_start",
    "false",
    "--validate_first",
    "false",
    "--trainer.callbacks",
    "[]",
    "--trainer.logger",
    "lightning.pytorch.loggers.CSVLogger",
    "--trainer.logger.save_dir",
    "logs",
    "--data.training.group_size",
    "2",
    "--data.validation.num_groups",
    "2",
    "--data.training.num_iterations",
    "1",
    "--trainer.val_check_interval",
    "1",
    "--model.update.mini_batch_size",
    "8",
    "--model.update.micro_batch_size",
    "4",
]


def _rows(tmp_path):
    return list(csv.DictReader(open(next((tmp_path / "logs").rglob("metrics.csv")))))


def _row_with(rows, key):
    """The last logged row holding ``key``."""
    row = [r for r in rows if r.get(key)][-1]
    return {k: float(v) for k, v in row.items() if v not in ("", None)}


def test_mixture_config_logs_per_tag_metrics(tmp_path):
    main(
        [
            "fit",
            "--config",
            str(CONFIGS / "mixture.yaml"),
            *SHORT,
            "--data.episode.max_turns",
            "2",
            "--data.episode.max_new_tokens",
            "12",
        ]
    )
    rows = _rows(tmp_path)
    train = _row_with(rows, "train/batch_size")
    for tag in ("bandit", "lake"):
        for name in ("success", "return", "format_error_rate", "pass@2"):
            assert 0.0 <= train[f"train/{tag}/{name}"] <= 1.0, (tag, name)
        # + the format penalty (<= 0)
        assert train[f"train/{tag}/score"] <= train[f"train/{tag}/return"]
    # each entry's own episode settings: the bandit is one turn, the lake up to
    # --data.episode.max_turns (2)
    assert train["train/bandit/num_turns"] == 1.0 and 1.0 <= train["train/lake/num_turns"] <= 2.0
    # 4 groups of each entry x 2 members: the pooled rate is the mean of the two entries' rates
    assert train["train/success"] == pytest.approx(
        (train["train/bandit/success"] + train["train/lake/success"]) / 2
    )
    # every episode trains (no filter); windowed lake turns add rows
    assert train["train/batch_size"] >= 16
    val = _row_with(rows, "val/success")
    # validation runs its own list
    assert not any(k.startswith(("val/bandit/", "val/lake/")) for k in val)
    for tag in ("bandit_test", "coord_lake"):
        assert (
            0.0 <= val[f"val/{tag}/success"] <= 1.0
            and 0.0 <= val[f"val/{tag}/format_error_rate"] <= 1.0
        )
    assert val["val/bandit_test/num_turns"] == 1.0
    assert val["val/success"] == pytest.approx(
        (val["val/bandit_test/success"] + val["val/coord_lake/success"]) / 2
    )


def test_ragen_bandit_setting_validates_on_bandit_and_bandit_test(tmp_path):
    main(
        [
            "fit",
            "--config",
            str(CONFIGS / "bandit_heldout.yaml"),
            *SHORT,
            # what is checked is the validation suite's per-tag metrics, not how the episodes were
            # generated: the HF engine (no vLLM start-up and shut-down, ~3.5 s; the mixture fit
            # above rolls out on vLLM)
            "--data.engine.name",
            "hf",
            "--data.training.num_groups",
            "2",
            "--data.episode.max_new_tokens",
            "12",
        ]
    )
    rows = _rows(tmp_path)
    train = _row_with(rows, "train/batch_size")
    # one training env: train/* only
    assert not [k for k in train if k.startswith("train/") and k.count("/") > 1]
    val = _row_with(rows, "val/success")
    assert 0.0 <= val["val/Bandit/success"] <= 1.0 and 0.0 <= val["val/BanditTest/success"] <= 1.0
    assert val["val/success"] == pytest.approx(
        (val["val/Bandit/success"] + val["val/BanditTest/success"]) / 2
    )


def test_warm_start_trains_on_every_entry_s_demonstrations(tiny_path, tmp_path, monkeypatch):
    import json

    from ragen_lightning.rollout.settings import EpisodeSettings
    from ragen_lightning.sft import warm_start as ws

    recipe = ws.WarmStartSettings(steps=2, num_episodes=4, batch_size=2, cache_dir=str(tmp_path))
    small = {
        "env_id": "ragen/Bandit-v0",
        "settings": recipe,
        "episode": EpisodeSettings(max_turns=1, max_actions_per_turn=1, max_actions_per_episode=1),
    }
    lake = (
        "ragen/FrozenLake-v0",
        {"success_rate": 1.0},
        EpisodeSettings(max_turns=2, max_actions_per_turn=2, context_window="single_turn"),
    )
    trained = []
    train_sft = ws.train_sft
    monkeypatch.setattr(
        ws,
        "train_sft",
        lambda net, demos, *a, **kw: trained.append(len(demos)) or train_sft(net, demos, *a, **kw),
    )
    single = ws.warm_start(str(tiny_path), **small)
    assert ws.warm_start(str(tiny_path), **small, more_envs=()) == single  # the key of before
    mixed = ws.warm_start(str(tiny_path), **small, more_envs=[lake])
    assert mixed != single
    meta = json.loads((mixed / ws.META_FILE).read_text())
    (more,) = meta["args"]["more_envs"]
    assert (more["env_id"], more["env_kwargs"], more["max_turns"], more["context_window"]) == (
        "ragen/FrozenLake-v0",
        {"success_rate": 1.0},
        2,
        "single_turn",
    )
    stats = meta["demo_stats"]
    assert [stats["env0"]["env_id"], stats["env1"]["env_id"]] == [
        "ragen/Bandit-v0",
        "ragen/FrozenLake-v0",
    ]
    assert stats["env0"]["demo/episodes"] == stats["env1"]["demo/episodes"] == 4
    # one bandit sample per episode; the lake's one per turn (single_turn): every demonstration of
    # both is trained
    assert (
        trained[-1] == stats["env0"]["demo/samples"] + stats["env1"]["demo/samples"]
        and trained[-1] > 8
    )
