"""Checkpoint faults end in one line: a full disk stops the run naming the path and the free space
(the previous checkpoint stays whole), a write killed mid-way leaves no temporary file behind for
good, and a run with a critic resumed by an estimator without one drops the critic's state instead
of failing on unexpected keys."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

import pytest
import torch

from ragen_lightning.errors import TrainingStopped
from ragen_lightning.parallel import checkpointing
from ragen_lightning.parallel.checkpointing import (
    SafeCheckpointIO,
    drop_critic_state,
    remove_stale_temps,
)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_full_disk_stops_the_run_in_one_line_naming_the_path_and_the_free_space(
    tmp_path, monkeypatch
):
    path = tmp_path / "last.ckpt"
    io = SafeCheckpointIO()
    io.save_checkpoint({"global_step": 1}, path)

    def full(obj, f, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpointing.torch, "save", full)
    monkeypatch.setattr(
        checkpointing.shutil, "disk_usage", lambda folder: shutil._ntuple_diskusage(0, 0, 3 << 20)
    )
    with pytest.raises(TrainingStopped) as err:
        io.save_checkpoint({"global_step": 2}, path)
    assert str(err.value) == (
        f"no space left on the device for checkpoint {path} (3 MiB free in {tmp_path}): the run "
        "stops; a previous checkpoint of that name is unchanged. Free space, then resume with "
        "--ckpt_path"
    )
    assert (
        sorted(os.listdir(tmp_path)) == ["last.ckpt"]
        and io.load_checkpoint(path)["global_step"] == 1
    )

    def denied(obj, f, *args, **kwargs):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(checkpointing.torch, "save", denied)
    with pytest.raises(OSError) as other:  # other write errors are not a full disk
        io.save_checkpoint({"global_step": 2}, path)
    assert other.value.errno == errno.EACCES


def test_temporary_files_of_dead_writers_are_removed_at_the_next_save(tmp_path):
    dead, alive = _dead_pid(), os.getppid()
    stale, busy = tmp_path / f".last.ckpt.{dead}.tmp", tmp_path / f".last.ckpt.{alive}.tmp"
    other = tmp_path / ".notes.tmp"  # not a save's temporary file
    for f in (stale, busy, other):
        f.write_bytes(b"partial")
    assert remove_stale_temps(tmp_path) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([busy.name, other.name])
    stale.write_bytes(b"partial")
    SafeCheckpointIO().save_checkpoint({"global_step": 1}, tmp_path / "epoch=0.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [busy.name, other.name, "epoch=0.ckpt"]
    )


def test_a_critic_checkpoint_loses_its_critic_for_an_estimator_without_one():
    actor_w, critic_w = torch.ones(2), torch.zeros(2)
    checkpoint = {
        "state_dict": {"actor.w": actor_w, "critic.w": critic_w, "critic.v": critic_w},
        "optimizer_states": [{"actor": 1}, {"critic": 2}],
        "lr_schedulers": [{"a": 1}, {"c": 2}],
    }
    assert drop_critic_state(checkpoint) is True
    assert checkpoint == {
        "state_dict": {"actor.w": actor_w},
        "optimizer_states": [{"actor": 1}],
        "lr_schedulers": [{"a": 1}],
    }
    assert drop_critic_state(checkpoint) is False  # nothing left to drop: unchanged
    assert checkpoint["optimizer_states"] == [{"actor": 1}]
