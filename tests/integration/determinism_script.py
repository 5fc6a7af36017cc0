"""Seeded short Bandit fits run several times in one process; prints one ``RESULT_JSON`` line with,
per variant, each fit's fingerprint (tests/integration/test_determinism.py compares them).

A fingerprint is the SHA-256 of everything a checkpoint holds that a run computes (weights,
optimizer and scheduler states, loop progress, the data module's and callbacks' states, the module's
counters) plus every logged value that is not a clock reading. vLLM pins torch to one thread and
patches ``torch.set_num_threads`` in the process that builds an engine, so its variant runs last.

    python tests/integration/determinism_script.py OUT_DIR REPEATS VARIANT [VARIANT ...]

Each fit's folder (``OUT_DIR/<variant><index>``) is kept: the kill -9 tests resume an interrupted
``hf`` or ``async`` fit and compare it with fit 0 of that variant (the uninterrupted run).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
from pathlib import Path

import torch

import envs  # noqa: F401
from ragen_lightning.cli import main

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# configs/bandit.yaml's own settings (engine auto, two micro-batch threads, the critic in the
# background), shortened: four micro-batches per step (so the order gradients are added in matters)
# and a validation after every iteration (it starts while the background critic is stepping).
SHORT = [
    "--config",
    str(CONFIGS / "bandit.yaml"),
    "--model.warm_start",
    "false",
    "--data.training.num_groups",
    "2",
    "--data.training.group_size",
    "4",
    "--data.episode.max_new_tokens",
    "12",
    "--data.validation.num_groups",
    "2",
    "--model.update.mini_batch_size",
    "8",
    "--model.update.micro_batch_size",
    "2",
    "--trainer.val_check_interval",
    "1",
    "--data.training.num_iterations",
    "3",
    "--trainer.logger",
    "{class_path: lightning.pytorch.loggers.CSVLogger, init_args: {save_dir: logs, name: csv}}",
]
# Three iterations are 4 validations (validate_first): below the early stops' windows (5 low-success
# validations, 10 iterations of reward-std baseline), so the untrained model's success of 0 stops
# no fit early.
HF = ["--data.engine.name", "hf"]
VARIANTS = {
    "config": [],
    "hf": HF,
    # one-step-off-policy rollouts: each batch after the first sampled, on the rollout thread, by
    # the weights of one update before while the update runs
    "async": [*HF, "--data.training.async_level", "1", "--model.loss.tis_cap", "2.0"],
    # the warm start rebuilt from scratch (a fresh cache per fit) with its two SFT threads, then the
    # fit. 12 steps of 4 demonstrations in two threaded parts: the threaded backward and the seeded
    # demonstrations, batch order and initialisation are what can differ between builds, and a
    # dozen steps run them all (more steps only repeat them)
    "warm_start": [*HF, "--model.warm_start", "{steps: 12, num_episodes: 16, threads: 2}"],
}
CHECKPOINT_KEYS = (
    "state_dict",
    "optimizer_states",
    "lr_schedulers",
    "loops",
    "global_step",
    "epoch",
    "starpo",
    "datamodule_state",
    "RolloutDataModule",
)
SKIPPED = ("model_path",)  # the warm start's folder: under each fit's own cache


def is_clock(name: str) -> bool:
    """A wall-clock reading (a logged value or a callback's state): ``timing_s/*``,
    ``throughput/*``, ``*_s``."""
    return name.startswith(("timing", "throughput")) or name.split("/")[-1].endswith("_s")


def _feed(h, value) -> None:
    if isinstance(value, torch.Tensor):
        h.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        h.update(value.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            if str(k) in SKIPPED or is_clock(str(k)):
                continue
            h.update(f"K{k}".encode())
            _feed(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}".encode())
        for v in value:
            _feed(h, v)
    else:
        h.update(repr(value).encode())


def fingerprint(root: Path) -> dict[str, str | int]:
    ckpt = torch.load(
        root / "outputs" / "bandit" / "checkpoints" / "last.ckpt",
        map_location="cpu",
        weights_only=False,
    )
    parts = {}
    for key in ckpt:
        if key in CHECKPOINT_KEYS or key.endswith("DataModule"):
            h = hashlib.sha256()
            _feed(h, ckpt[key])
            parts[key] = h.hexdigest()[:16]
    callbacks = {k: v for k, v in ckpt.get("callbacks", {}).items() if "ModelCheckpoint" not in k}
    h = hashlib.sha256()
    _feed(h, callbacks)
    parts["callbacks"] = h.hexdigest()[:16]
    rows = []
    for path in sorted((root / "logs" / "csv").glob("version_*/metrics.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                rows.append({k: v for k, v in row.items() if v != "" and not is_clock(k)})
    h = hashlib.sha256()
    h.update(json.dumps(rows, sort_keys=True).encode())
    parts["metrics"] = h.hexdigest()[:16]
    parts["metric_rows"] = len(rows)
    parts["global_step"] = int(ckpt["global_step"])
    return parts


def run(out: Path, variant: str, index: int) -> dict[str, str | int]:
    root = out / f"{variant}{index}"
    root.mkdir(parents=True)
    os.chdir(root)
    if variant == "warm_start":
        os.environ["RAGEN_LIGHTNING_CACHE"] = str(root / "cache")  # nothing cached: built again
    try:
        main(["fit", *SHORT, *VARIANTS[variant]])
    finally:
        os.environ.pop("RAGEN_LIGHTNING_CACHE", None)
    return fingerprint(root)


if __name__ == "__main__":
    out, repeats, variants = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    result = {
        v: [run(out, v, i) for i in range(repeats)]
        for v in sorted(variants, key=lambda v: v == "config")
    }
    sys.stdout.write("RESULT_JSON " + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # vLLM's in-process engine leaves threads behind
