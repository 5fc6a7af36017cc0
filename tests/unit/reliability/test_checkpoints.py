"""Safe checkpoints: atomic writes (a full disk leaves no partial ``.ckpt``), a digest that refuses
flipped bytes, one-line errors naming the file for empty/random/truncated files, and the model
settings a resume would change."""

from __future__ import annotations

import errno
import hashlib
import os
import pickle

import pytest
import torch
from lightning.fabric.utilities.cloud_io import _load as pl_load
from lightning.pytorch.plugins.io import TorchCheckpointIO

from ragen_lightning.errors import ConfigError
from ragen_lightning.parallel import checkpointing
from ragen_lightning.parallel.checkpointing import (
    CheckpointError,
    SafeCheckpointIO,
    changed_settings,
    check_resume_settings,
    load_verified,
    save_atomic,
    verify,
)


def _checkpoint(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "state_dict": {"critic.w": torch.randn(64, 64, generator=g)},
        "global_step": seed,
        "hyper_parameters": {"advantage": {"estimator": "gae"}},
    }


def test_saved_file_is_a_plain_torch_zip_with_its_digest_as_the_zip_comment(tmp_path):
    path = tmp_path / "last.ckpt"
    save_atomic(_checkpoint(), path)
    data = path.read_bytes()
    comment = data[-(len(checkpointing.DIGEST_PREFIX) + 64) :]
    assert comment.startswith(b"ragen-sha256:")
    # the digest is the SHA-256 of the archive as torch.save wrote it: comment length 0, no comment
    original = data[: -len(comment) - 2] + b"\0\0"
    assert comment[13:].decode() == hashlib.sha256(original).hexdigest()
    assert verify(path) is True
    for loaded in (
        torch.load(path, weights_only=True),
        pl_load(path),
        load_verified(path, weights_only=True),
    ):
        torch.testing.assert_close(
            loaded["state_dict"]["critic.w"], _checkpoint()["state_dict"]["critic.w"]
        )
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]  # no temporary file left


def test_flipped_bytes_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "epoch=0-step=2.ckpt"
    save_atomic(_checkpoint(), path)
    data = bytearray(path.read_bytes())
    # inside the tensor data: torch.load alone would load the changed values silently
    start = len(data) // 2
    data[start : start + 4096] = bytes(b ^ 0xFF for b in data[start : start + 4096])
    path.write_bytes(bytes(data))
    # the zip container is intact: the damage only shows in the digest
    torch.load(path, weights_only=True)
    with pytest.raises(CheckpointError) as info:
        SafeCheckpointIO().load_checkpoint(path)
    assert str(info.value) == (
        f"--ckpt_path {path}: corrupted checkpoint (its SHA-256 differs from the digest saved with it: the file "
        "changed after it was written); use another checkpoint"
    )
    assert isinstance(info.value, ConfigError)  # the command line prints it as one line, exit 2


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "the file is empty, not a checkpoint"),
        (
            os.urandom(3000),
            "not a checkpoint (no zip archive end: truncated, or another kind of file)",
        ),
        ("half", "not a checkpoint (no zip archive end: truncated, or another kind of file)"),
        ("bad_digest", "corrupted checkpoint (its digest record is damaged)"),
    ],
)
def test_unusable_files_are_one_line_naming_the_file(tmp_path, content, message):
    path = tmp_path / "x.ckpt"
    save_atomic(_checkpoint(), path)
    good = path.read_bytes()
    if content == "half":
        content = good[: len(good) // 2]
    elif content == "bad_digest":
        content = good[:-64] + b"z" * 64  # not hex
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        load_verified(path)
    assert str(info.value) == f"--ckpt_path {path}: {message}"


def test_missing_file_and_a_foreign_pickle(tmp_path):
    with pytest.raises(CheckpointError, match=r"^--ckpt_path .*nope\.ckpt: no such file$"):
        load_verified(tmp_path / "nope.ckpt")
    # an old-format (non-zip) torch file whose end happens to hold a zip end record: refused, not
    # unpickled
    path = tmp_path / "old.ckpt"
    path.write_bytes(pickle.dumps({"a": 1}) + b"PK\x05\x06" + b"\0" * 18)
    with (
        pytest.raises(CheckpointError) as info,
        pytest.warns(UserWarning, match="no integrity digest"),
    ):
        load_verified(path, weights_only=True)
    assert str(info.value).startswith(f"--ckpt_path {path}: not a readable checkpoint (")
    assert "\n" not in str(info.value)


def test_plain_lightning_checkpoint_without_digest_still_loads(tmp_path):
    path = tmp_path / "plain.ckpt"
    TorchCheckpointIO().save_checkpoint(_checkpoint(3), path)
    assert verify(path) is False
    with pytest.warns(UserWarning, match="has no integrity digest"):
        assert SafeCheckpointIO().load_checkpoint(path)["global_step"] == 3


def test_full_disk_leaves_no_partial_ckpt_and_the_previous_one_intact(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    io = SafeCheckpointIO()
    io.save_checkpoint(_checkpoint(1), path)
    before = path.read_bytes()

    real_write = checkpointing._HashingWriter.write
    written = {"n": 0}

    def write_until_full(self, data):  # the disk fills after 8 KB: a partial write, then ENOSPC
        if written["n"] + len(data) > 8192:
            self.f.write(bytes(data)[: 8192 - written["n"]])
            raise OSError(errno.ENOSPC, "No space left on device")
        written["n"] += len(data)
        return real_write(self, data)

    monkeypatch.setattr(checkpointing._HashingWriter, "write", write_until_full)
    # (SafeCheckpointIO stops the run with one line: test_checkpoint_faults.py)
    with pytest.raises(OSError) as info:
        save_atomic(_checkpoint(2), path)
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == (
        f"[Errno 28] No space left on device: checkpoint {path} not written (a previous file "
        "of that name is unchanged)"
    )
    # the temporary file is gone, nothing else was named
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]
    assert path.read_bytes() == before and io.load_checkpoint(path)["global_step"] == 1
    # a new name that never got written does not exist at all
    with pytest.raises(OSError):
        save_atomic(_checkpoint(2), tmp_path / "epoch=0-step=4.ckpt")
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]


def test_install_replaces_only_lightnings_default_io():
    class Strategy:
        checkpoint_io = TorchCheckpointIO()

    class Trainer:
        strategy = Strategy()

    trainer = Trainer()
    checkpointing.install(trainer)
    assert type(trainer.strategy.checkpoint_io) is SafeCheckpointIO
    custom = type("MyIO", (TorchCheckpointIO,), {})()
    trainer.strategy.checkpoint_io = custom
    checkpointing.install(trainer)
    assert trainer.strategy.checkpoint_io is custom


def test_changed_settings_names_each_differing_model_setting():
    # the settings groups are plain dicts in the hyperparameters, compared field by field
    saved = {
        "advantage": {"estimator": "gae", "gamma": 1.0},
        "model": "tiny",
        "lora": None,
        "optim": {"actor_lr": 1e-3, "max_consecutive_skips": 5},
        "temperature": 1.0,
        "export_dir": None,
        "only_in_checkpoint": 1,
        "_instantiator": "x",
    }
    current = {
        "advantage": {"estimator": "grpo", "gamma": 1.0},
        "model": "tiny",
        "lora": {"rank": 8},
        # steers the run only: not compared
        "optim": {"actor_lr": 1e-3, "max_consecutive_skips": 0},
        "temperature": 0.7,
        "export_dir": "out",
        "only_now": 2,
        "_instantiator": "y",
    }
    assert changed_settings(current, saved) == [
        "--model.advantage.estimator (checkpoint 'gae', now 'grpo')",
        "--model.lora (checkpoint None, now {'rank': 8})",
        "--data.sampling.temperature (checkpoint 1.0, now 0.7)",
    ]
    assert changed_settings(saved, saved) == []
    # exporting the merged adapter steers the run's end only: not a change of model settings
    lora = {"rank": 8, "export_merged": False}
    assert changed_settings({"lora": dict(lora, export_merged=True)}, {"lora": lora}) == []
    # a group: field by field
    assert changed_settings({"lora": dict(lora, rank=16)}, {"lora": lora}) == [
        "--model.lora.rank (checkpoint 8, now 16)"
    ]


def test_check_resume_settings_refuses_unless_allowed():
    saved = {"advantage": {"estimator": "gae", "gamma": 1.0}}
    current = {"advantage": {"estimator": "grpo", "gamma": 0.99}}
    with pytest.raises(ConfigError) as info:
        check_resume_settings(current, "out/last.ckpt", saved, allow=False)
    assert str(info.value) == (
        "--ckpt_path out/last.ckpt was trained with other model settings: --model.advantage.estimator (checkpoint 'gae', "
        "now 'grpo'); --model.advantage.gamma (checkpoint 1.0, now 0.99). Resume with the run's settings, or pass "
        "--allow_changed_settings true to continue with the new ones"
    )
    check_resume_settings(current, "out/last.ckpt", saved, allow=True)  # allowed: no error
