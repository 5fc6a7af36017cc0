"""Sharded checkpoint folders (FSDP2's distributed checkpoint): the digest of every file, the
one-step swap into place, and what a damaged folder gives (one line naming the file). The
two-process save and resume are in tests/integration/test_distributed_checkpoints.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ragen_lightning.parallel import checkpointing
from ragen_lightning.parallel.checkpointing import FOLDER_DIGEST, CheckpointError


def _folder(root, name="step=4.ckpt", payload=b"shard"):
    folder = root / name
    folder.mkdir()
    for file, data in (
        (".metadata", b"meta" * 10),
        ("__0_0.distcp", payload * 100),
        ("__1_0.distcp", b"r1" * 99),
        ("meta.pt", b"loops"),
    ):
        (folder / file).write_bytes(data)
    checkpointing.write_folder_digest(folder)
    return folder


def test_a_digested_folder_verifies_and_every_damage_is_one_line_naming_the_file(tmp_path):
    folder = _folder(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt", FOLDER_DIGEST]
    )
    assert checkpointing.verify_folder(folder) is True
    shard = folder / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[7] ^= 0x01  # one flipped bit, same size
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        checkpointing.verify_folder(folder)
    assert str(info.value) == (
        f"--ckpt_path {folder}: corrupted checkpoint (__1_0.distcp's SHA-256 differs from the "
        "digest saved with it: the file changed after it was written); use another checkpoint"
    )
    # the quick check sees sizes only
    assert checkpointing.verify_folder(folder, hashed=False) is True
    # the ranks share the hashing: file i is hashed by rank i % world_size (sorted: .metadata,
    # __0_0, __1_0, meta.pt)
    assert checkpointing.verify_folder(folder, rank=1, world_size=2) is True
    with pytest.raises(CheckpointError, match="__1_0.distcp's SHA-256 differs"):
        checkpointing.verify_folder(folder, rank=0, world_size=2)

    shard.write_bytes(bytes(data[:-10]))  # truncated
    with pytest.raises(
        CheckpointError, match=r"__1_0\.distcp has 188 bytes, 198 were saved: truncated or changed"
    ):
        checkpointing.verify_folder(folder, hashed=False)
    shard.unlink()
    with pytest.raises(
        CheckpointError, match=r"incomplete checkpoint \(__1_0\.distcp is missing\)$"
    ):
        checkpointing.verify_folder(folder)
    (folder / FOLDER_DIGEST).write_text("{not json")
    with pytest.raises(
        CheckpointError, match="its digest file ragen-sha256.json is damaged: JSONDecodeError"
    ):
        checkpointing.verify_folder(folder)
    (folder / FOLDER_DIGEST).unlink()
    # a plain Lightning folder: loaded unverified
    assert checkpointing.verify_folder(folder) is False


def test_replace_path_swaps_the_finished_folder_in_and_removes_the_old_one(tmp_path):
    old = _folder(tmp_path, payload=b"old")
    new = _folder(tmp_path, name=".step=4.ckpt.123.tmp", payload=b"new")
    checkpointing.replace_path(new, old)
    assert not new.exists()
    assert (old / "__0_0.distcp").read_bytes() == b"new" * 100 and checkpointing.verify_folder(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step=4.ckpt"]  # nothing left behind
    # over a single-file checkpoint of the same name, and where nothing was
    single = tmp_path / "last.ckpt"
    single.write_bytes(b"file")
    checkpointing.replace_path(_folder(tmp_path, name=".last.ckpt.1.tmp"), single)
    assert single.is_dir() and checkpointing.verify_folder(single)
    checkpointing.replace_path(_folder(tmp_path, name=".fresh.1.tmp"), tmp_path / "fresh.ckpt")
    assert checkpointing.verify_folder(tmp_path / "fresh.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.ckpt", "last.ckpt", "step=4.ckpt"]


def test_a_dead_writers_temporary_folder_is_removed_a_live_ones_kept(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = _folder(tmp_path, name=f".step=4.ckpt.{int(dead.stdout)}.tmp")
    live = _folder(tmp_path, name=f".step=6.ckpt.{os.getppid()}.tmp")
    assert checkpointing.remove_stale_temps(tmp_path) == [stale]
    assert not stale.exists() and live.exists()


def test_resume_info_of_a_folder_reads_meta_pt_after_the_size_check(tmp_path):
    import torch

    folder = tmp_path / "step=2.ckpt"
    folder.mkdir()
    torch.save({"hyper_parameters": {"model": "tiny"}, "global_step": 2}, folder / "meta.pt")
    (folder / "__0_0.distcp").write_bytes(b"x" * 64)
    checkpointing.write_folder_digest(folder)
    assert checkpointing.load_resume_info(folder)["global_step"] == 2
    (folder / "__0_0.distcp").write_bytes(b"x" * 60)
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp has 60 bytes, 64 were saved"):
        checkpointing.load_resume_info(folder)
    other = tmp_path / "not_a_checkpoint"
    other.mkdir()
    with pytest.raises(
        CheckpointError, match=r"a folder that is not a sharded checkpoint \(no meta\.pt\)$"
    ):
        checkpointing.load_resume_info(other)


def test_a_remote_checkpoint_is_uploaded_whole_with_its_digest_and_verified_on_load(monkeypatch):
    """A URL (here fsspec's in-memory filesystem, as s3:// would be) gets the single-file treatment:
    digest in the archive, upload under a temporary name then a move (an upload that fails leaves
    the previous object whole and no temporary), verified on load (a flipped byte is one line naming
    the URL)."""
    import fsspec
    import torch

    from ragen_lightning.parallel.checkpointing import SafeCheckpointIO

    fs = fsspec.filesystem("memory")
    url = "memory://bucket/run/last.ckpt"
    io_ = SafeCheckpointIO()
    io_.save_checkpoint({"global_step": 3, "w": torch.arange(4.0)}, url)
    assert fs.ls("/bucket/run", detail=False) == ["/bucket/run/last.ckpt"]  # no temporary left
    loaded = io_.load_checkpoint(url)
    assert loaded["global_step"] == 3 and torch.equal(loaded["w"], torch.arange(4.0))
    # what the command line reads first
    assert checkpointing.load_resume_info(url)["global_step"] == 3

    def failing_move(*args, **kwargs):
        raise OSError("connection reset")

    monkeypatch.setattr(type(fs), "mv", failing_move)
    with pytest.raises(OSError, match="connection reset"):
        io_.save_checkpoint({"global_step": 4, "w": torch.zeros(4)}, url)
    monkeypatch.undo()
    assert fs.ls("/bucket/run", detail=False) == ["/bucket/run/last.ckpt"]
    assert io_.load_checkpoint(url)["global_step"] == 3  # the previous checkpoint, whole

    data = bytearray(fs.cat_file("/bucket/run/last.ckpt"))
    data[len(data) // 3] ^= 0x01
    fs.pipe_file("/bucket/run/last.ckpt", bytes(data))
    with pytest.raises(CheckpointError) as info:
        io_.load_checkpoint(url)
    assert str(info.value).startswith(
        f"--ckpt_path {url}: corrupted checkpoint (its SHA-256 differs"
    )
    with pytest.raises(CheckpointError, match=r"memory://bucket/run/none\.ckpt: no such file$"):
        io_.load_checkpoint("memory://bucket/run/none.ckpt")
    fs.rm("/bucket", recursive=True)
