"""Safe checkpoints: atomic writes, a digest checked on load, one-line errors, and resumes that keep
the settings.

* **Atomic**: :func:`save_atomic` writes ``.<name>.<pid>.tmp`` in the checkpoint's folder, fsyncs
  it, then renames it over the real name (and fsyncs the folder), so a crash or a full disk never
  leaves a truncated file under a ``.ckpt`` name: the previous file of that name, if any, stays
  whole.
* **Digest**: the file is the ordinary ``torch.save`` zip archive (``torch.load`` and Lightning read
  it unchanged) whose zip comment holds ``ragen-sha256:<hex>``, the SHA-256 of the archive as
  ``torch.save`` wrote it (comment empty). :func:`verify` recomputes it; a file whose bytes changed
  after saving is refused, naming the file. A checkpoint without a digest (written by plain
  Lightning) loads unverified.
* **One line**: an empty, truncated or foreign file is a :class:`CheckpointError` naming the file,
  not a bare ``EOFError`` / ``UnpicklingError``.
* **Same settings**: :func:`changed_settings` lists the model settings a resume would change; the
  command line refuses them unless ``--allow_changed_settings true`` (LightningCLI's default instead
  loads the checkpoint's hyperparameters over the given flags, silently).

:class:`SafeCheckpointIO` puts the first three under Lightning's ``ModelCheckpoint`` and ``--ckpt_path`` loading;
:func:`install` makes it a trainer's checkpoint IO (the StarPO module does so in ``setup``).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import json
import math
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import _load as pl_load
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_warn

from ragen_lightning.errors import ConfigError, TrainingStopped

DIGEST_PREFIX = b"ragen-sha256:"
_EOCD = b"PK\x05\x06"  # the zip "end of central directory" record: 22 bytes, then the comment
_EOCD_SIZE = 22
_DIGEST_RE = re.compile(rb"ragen-sha256:([0-9a-f]{64})")
_CHUNK = 1 << 20
# module settings that only steer the run around the training (changing them on resume changes no
# math)
RUN_CONTROL_SETTINGS = (
    "export_dir",
    "optim.max_consecutive_skips",
    "early_stop",
    "lora.export_merged",
)
_WHOLE = ("warm_start",)  # compared as one value: its keys are one cached warm start
# settings linked from another flag (the message names the flag the user sets)
_FLAG_OF = {"temperature": "--data.sampling.temperature"}


class CheckpointError(ConfigError):
    """A checkpoint file that cannot be used (empty, truncated, corrupted, foreign); the message
    names the file."""


class _HashingWriter:
    """A write-only file wrapper that hashes what ``torch.save`` writes and keeps the last bytes
    (the zip end)."""

    def __init__(self, f):
        self.f, self.sha, self.tail = f, hashlib.sha256(), b""

    def write(self, data) -> int:
        data = bytes(data)
        self.sha.update(data)
        self.tail = (self.tail + data)[-_EOCD_SIZE:]
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def _save_digested(checkpoint: Mapping[str, Any], f, name: str) -> None:
    """``torch.save(checkpoint)`` into the seekable binary file ``f``, its SHA-256 put in the zip
    comment."""
    writer = _HashingWriter(f)
    torch.save(checkpoint, writer)
    if not (writer.tail.startswith(_EOCD) and writer.tail[-2:] == b"\0\0"):
        raise RuntimeError(
            f"torch.save did not write a zip archive with an empty comment to {name}"
        )
    comment = DIGEST_PREFIX + writer.sha.hexdigest().encode()
    f.seek(-2, os.SEEK_END)  # the comment length, the archive's last field
    f.write(len(comment).to_bytes(2, "little") + comment)
    f.flush()


def save_atomic(checkpoint: Mapping[str, Any], path: str | os.PathLike) -> None:
    """``torch.save(checkpoint)`` to ``path`` with its digest, atomically (temporary file, fsync,
    rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            _save_digested(checkpoint, f, str(tmp))
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        # torch's zip writer replaces the OSError
        disk = exc if isinstance(exc, OSError) else exc.__context__
        if isinstance(disk, OSError) and disk.errno is not None:
            raise OSError(
                disk.errno,
                f"{disk.strerror}: checkpoint {path} not written (a previous file of that "
                "name is unchanged)",
            ) from exc
        raise
    _fsync_dir(path.parent)


_TEMP_RE = re.compile(r"^\..+\.(\d+)\.tmp$")


def remove_stale_temps(folder: str | os.PathLike) -> list[Path]:
    """Remove the ``.<name>.<pid>.tmp`` files of :func:`save_atomic` (and folders of a sharded save)
    left in ``folder`` by a process that died mid-write (its pid no longer runs); another live
    process's file is its write in progress and stays. Returns the removed paths."""
    removed = []
    for tmp in Path(folder).glob(".*.tmp"):
        match = _TEMP_RE.match(tmp.name)
        if match is None or int(match.group(1)) == os.getpid() or _pid_alive(int(match.group(1))):
            continue
        _remove(tmp)  # a file, or a sharded checkpoint's folder
        removed.append(tmp)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # another user's process (alive), or not a pid at all (kept)
    except (PermissionError, OverflowError):
        return True
    return True


# --------------------------------------------------------------------------------------------------
# Sharded checkpoints (a folder: FSDP2's distributed checkpoint, one file per rank plus metadata)
# --------------------------------------------------------------------------------------------------

# {file name: {"size": bytes, "sha256": hex}} of every other file in the folder
FOLDER_DIGEST = "ragen-sha256.json"


def _file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def write_folder_digest(folder: str | os.PathLike) -> None:
    """Fsync every file of a finished sharded checkpoint ``folder`` and record its size and SHA-256
    in
    :data:`FOLDER_DIGEST` (written last, fsynced). Called once (rank 0) after every rank wrote its
    files."""
    folder = Path(folder)
    record = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.name != FOLDER_DIGEST):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        record[path.name] = {"size": path.stat().st_size, "sha256": _file_sha256(path)}
    with open(folder / FOLDER_DIGEST, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(folder)


def verify_folder(
    folder: str | os.PathLike, rank: int = 0, world_size: int = 1, hashed: bool = True
) -> bool:
    """Check a sharded checkpoint ``folder`` against its :data:`FOLDER_DIGEST`: True when it
    matches, False when it has none (written by plain Lightning). Every file's presence and size is
    checked; the SHA-256 of the files ``i`` with ``i % world_size == rank`` (so the ranks of a
    resume share the hashing, whatever their number; ``hashed=False``: sizes only, a quick check
    before the strategy's load hashes).

    Raises :class:`CheckpointError` naming the folder and the file that is missing, truncated or
    changed."""
    folder = Path(folder)
    digest = folder / FOLDER_DIGEST
    if not digest.is_file():
        return False
    try:
        record = json.loads(digest.read_text())
        entries = sorted(
            (str(name), int(e["size"]), str(e["sha256"])) for name, e in record.items()
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CheckpointError(
            f"--ckpt_path {folder}: corrupted checkpoint (its digest file {FOLDER_DIGEST} is "
            f"damaged: {type(exc).__name__})"
        ) from None
    for i, (name, size, sha) in enumerate(entries):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(
                f"--ckpt_path {folder}: incomplete checkpoint ({name} is missing)"
            )
        if path.stat().st_size != size:
            raise CheckpointError(
                f"--ckpt_path {folder}: corrupted checkpoint ({name} has {path.stat().st_size} "
                f"bytes, {size} were saved: truncated or changed); use another checkpoint"
            )
        if hashed and i % world_size == rank and _file_sha256(path) != sha:
            raise CheckpointError(
                f"--ckpt_path {folder}: corrupted checkpoint ({name}'s SHA-256 differs from the "
                "digest saved with it: the file changed after it was written); use another checkpoint"
            )
    return True


_RENAME_EXCHANGE = 2  # renameat2's flag (Linux >= 3.15): swap two paths in one step


def replace_path(new: str | os.PathLike, path: str | os.PathLike) -> None:
    """Put ``new`` (a finished folder or file) at ``path`` in one step and remove what was there: a
    crash leaves either the old or the new checkpoint under ``path``, never a mix. Where ``path``
    exists, the two are swapped with ``renameat2(RENAME_EXCHANGE)``; a filesystem without it gets
    two renames (the old one kept as ``.<name>.old`` between them)."""
    new, path = Path(new), Path(path)
    if not path.exists() and not path.is_symlink():
        os.replace(new, path)
    elif not _exchange(new, path):
        old = path.with_name(f".{path.name}.old")
        _remove(old)
        os.replace(path, old)
        os.replace(new, path)
        new = old
    _remove(new)  # the previous checkpoint (swapped to the temporary name)
    _fsync_dir(path.parent)


def _exchange(a: Path, b: Path) -> bool:
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_cwd = -100
    return renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), _RENAME_EXCHANGE) == 0


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open a folder; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def verify(path: str | os.PathLike) -> bool:
    """Check ``path``'s digest: True when it matches, False when the file has none (a plain
    Lightning checkpoint).

    Raises :class:`CheckpointError` naming the file when it is missing, empty, not a zip archive
    (truncated or another kind of file) or its bytes differ from what was saved.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"--ckpt_path {path}: no such file")
    with open(path, "rb") as f:
        return _verify_stream(f, path.stat().st_size, path)


def _verify_stream(f, size: int, path: Any) -> bool:
    """:func:`verify` of the seekable binary file ``f`` of ``size`` bytes (``path`` names it in
    errors)."""
    if size == 0:
        raise CheckpointError(f"--ckpt_path {path}: the file is empty, not a checkpoint")
    f.seek(max(0, size - _EOCD_SIZE - 0xFFFF))
    tail = f.read()
    end = tail.rfind(_EOCD)
    if end < 0 or len(tail) - end < _EOCD_SIZE:
        raise CheckpointError(
            f"--ckpt_path {path}: not a checkpoint (no zip archive end: truncated, or another "
            "kind of file)"
        )
    comment = tail[end + _EOCD_SIZE :]
    if int.from_bytes(tail[end + 20 : end + 22], "little") != len(comment):
        raise CheckpointError(
            f"--ckpt_path {path}: not a checkpoint (the zip archive end is damaged)"
        )
    if not comment:
        return False
    match = _DIGEST_RE.fullmatch(comment)
    if match is None:
        raise CheckpointError(
            f"--ckpt_path {path}: corrupted checkpoint (its digest record is damaged)"
        )
    sha, remaining = hashlib.sha256(), size - len(comment) - 2
    f.seek(0)
    while remaining > 0:
        chunk = f.read(min(_CHUNK, remaining))
        if not chunk:
            break
        sha.update(chunk)
        remaining -= len(chunk)
    sha.update(b"\0\0")  # the comment length as torch.save wrote it
    if sha.hexdigest() != match.group(1).decode():
        raise CheckpointError(
            f"--ckpt_path {path}: corrupted checkpoint (its SHA-256 differs from the digest saved "
            "with it: the file changed after it was written); use another checkpoint"
        )
    return True


def load_verified(
    path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None
) -> Any:
    """:func:`verify`, then load; an unreadable file is a :class:`CheckpointError` naming it (one
    line)."""
    if not verify(path):
        rank_zero_warn(
            f"{path} has no integrity digest (not written by ragen_lightning); loading it unverified"
        )
    try:
        return pl_load(path, map_location=map_location, weights_only=weights_only)
    except (CheckpointError, FileNotFoundError, MemoryError):
        raise
    # EOFError, UnpicklingError, zip and unpickling RuntimeErrors: a damaged file
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        kind = type(exc).__name__
        raise CheckpointError(
            f"--ckpt_path {path}: not a readable checkpoint ({kind}: {first})"
        ) from None


def load_resume_info(path: str | os.PathLike) -> dict[str, Any]:
    """What the command line reads from ``--ckpt_path`` before the run is built (settings,
    progress): a file or a URL is loaded verified (:func:`load_verified`, :func:`load_remote`); a
    sharded folder is checked against its digest's sizes (the strategy hashes its files when it
    loads them) and its ``meta.pt`` (everything but weights and optimizer states) loaded."""
    if "://" in str(path):
        return load_remote(str(path), map_location="cpu", weights_only=True)
    path = Path(path)
    if not path.is_dir():
        return load_verified(path, map_location="cpu", weights_only=True)
    if not verify_folder(path, hashed=False):
        rank_zero_warn(
            f"{path} has no integrity digest (not written by ragen_lightning); loading it unverified"
        )
    meta = path / "meta.pt"
    if not meta.is_file():
        raise CheckpointError(
            f"--ckpt_path {path}: a folder that is not a sharded checkpoint (no meta.pt)"
        )
    try:
        return pl_load(meta, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged file, one line
        raise CheckpointError(
            f"--ckpt_path {path}: not a readable checkpoint ({type(exc).__name__} in meta.pt)"
        ) from None


def _remote(url: str):
    """``(filesystem, path)`` of a URL (``s3://bucket/key``, ``gs://``, ``memory://``...) through
    fsspec."""
    import fsspec

    return fsspec.core.url_to_fs(str(url))


def save_remote(checkpoint: Mapping[str, Any], url: str) -> None:
    """:func:`save_atomic` for a URL: the digested archive is built in memory, uploaded under a
    temporary name in the same folder, then moved to ``url`` (on an object store an object appears
    whole or not at all; the move is a server-side copy), so a crash mid-upload leaves a previous
    checkpoint of that name whole."""
    fs, path = _remote(url)
    buffer = io.BytesIO()
    _save_digested(checkpoint, buffer, str(url))
    folder, name = path.rsplit("/", 1) if "/" in path else ("", path)
    tmp = f"{folder}/.{name}.{os.getpid()}.tmp" if folder else f".{name}.{os.getpid()}.tmp"
    try:
        if folder:
            fs.makedirs(folder, exist_ok=True)
        fs.pipe_file(tmp, buffer.getvalue())
        fs.mv(tmp, path)
    finally:
        if fs.exists(tmp):
            fs.rm(tmp)


def load_remote(url: str, map_location: Any = None, weights_only: bool | None = None) -> Any:
    """:func:`load_verified` for a URL: downloaded once, its digest checked, then loaded from
    memory."""
    fs, path = _remote(url)
    if not fs.exists(path):
        raise CheckpointError(f"--ckpt_path {url}: no such file")
    data = io.BytesIO(fs.cat_file(path))
    if not _verify_stream(data, len(data.getbuffer()), url):
        rank_zero_warn(
            f"{url} has no integrity digest (not written by ragen_lightning); loading it unverified"
        )
    data.seek(0)
    try:
        return torch.load(data, map_location=map_location, weights_only=weights_only)
    except Exception as exc:  # noqa: BLE001 - a damaged file, one line
        raise CheckpointError(
            f"--ckpt_path {url}: not a readable checkpoint ({type(exc).__name__})"
        ) from None


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` with atomic, digested writes and verified loads, for local
    paths and URLs (``s3://...`` through fsspec: :func:`save_remote`, :func:`load_remote`)."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            return super().save_checkpoint(checkpoint, path, storage_options)
        if "://" in str(path):
            return save_remote(checkpoint, str(path))
        try:
            save_atomic(checkpoint, path)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise disk_full_error(path) from None
            raise
        return None

    def load_checkpoint(
        self,
        path,
        map_location: Any = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        if "://" in str(path):
            return load_remote(str(path), map_location=map_location, weights_only=weights_only)
        return load_verified(path, map_location=map_location, weights_only=weights_only)


def disk_full_error(path: str | os.PathLike) -> TrainingStopped:
    """The one line that stops a run whose checkpoint ``path`` did not fit on its disk: the path,
    the free space, and that the previous checkpoint of that name is whole (:func:`save_atomic`
    wrote to a temporary file)."""
    folder = Path(path).parent
    try:
        free = f"{shutil.disk_usage(folder).free / 2**20:.0f} MiB free"
    except OSError:
        free = "free space unknown"
    return TrainingStopped(
        f"no space left on the device for checkpoint {path} ({free} in {folder}): the run stops; "
        "a previous checkpoint of that name is unchanged. Free space, then resume with --ckpt_path"
    )


def drop_critic_state(checkpoint: dict[str, Any]) -> bool:
    """Remove the critic from ``checkpoint`` (a run with a critic resumed by an estimator without
    one): its ``critic.*`` weights and the critic's optimizer and schedule (saved after the
    actor's). True when there was one."""
    state = checkpoint.get("state_dict") or {}
    keys = [k for k in state if k.startswith("critic.")]
    for key in keys:
        del state[key]
    if keys:
        for name in ("optimizer_states", "lr_schedulers"):
            if isinstance(checkpoint.get(name), list):
                checkpoint[name] = checkpoint[name][:1]  # [actor, critic]: build_optimizers' order
    return bool(keys)


def install(trainer) -> None:
    """Make :class:`SafeCheckpointIO` the trainer's checkpoint IO unless another than Lightning's
    default is set (a user plugin, or a sharded strategy's own)."""
    strategy = trainer.strategy
    if type(strategy.checkpoint_io) is TorchCheckpointIO:
        strategy.checkpoint_io = SafeCheckpointIO()


# --------------------------------------------------------------------------------------------------
# Settings on resume
# --------------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if hasattr(value, "as_dict"):  # a jsonargparse Namespace
        value = value.as_dict()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _differences(
    now: Any, before: Any, key: str, ignore: tuple[str, ...]
) -> list[tuple[str, Any, Any]]:
    """``(flag name, before, now)`` of every differing setting under ``key``: a settings group (a
    dict on both sides) field by field, anything else (a group on one side only, e.g. LoRA on vs
    off) as one value."""
    if key in ignore:
        return []
    now, before = _plain(now), _plain(before)
    if isinstance(now, dict) and isinstance(before, dict) and key not in _WHOLE:
        return [
            d
            for k in sorted(set(now) | set(before))
            for d in _differences(now.get(k), before.get(k), f"{key}.{k}", ignore)
        ]
    return [] if _same(before, now) else [(key, before, now)]


def changed_settings(
    current: Mapping[str, Any],
    saved: Mapping[str, Any],
    ignore: tuple[str, ...] = RUN_CONTROL_SETTINGS,
) -> list[str]:
    """``"--model.advantage.estimator (checkpoint 'gae', now 'grpo')"`` for every model setting
    present in both the checkpoint's hyperparameters ``saved`` and the module's ``current`` ones
    whose values differ (settings that only steer the run, :data:`RUN_CONTROL_SETTINGS`, are not
    compared; a settings group's fields one by one)."""
    out = []
    for key in sorted(set(current) & set(saved)):
        if not key.startswith("_"):
            out += [
                f"{_FLAG_OF.get(k, '--model.' + k)} (checkpoint {old!r}, now {new!r})"
                for k, old, new in _differences(current[key], saved[key], key, ignore)
            ]
    return out


def check_resume_settings(
    current: Mapping[str, Any],
    checkpoint_path: str | os.PathLike,
    saved: Mapping[str, Any],
    allow: bool,
) -> None:
    """Refuse (:class:`~ragen_lightning.errors.ConfigError`, one line) a resume whose model settings
    differ from the checkpoint's, naming them, unless ``allow``."""
    changed = changed_settings(current, saved)
    if changed and not allow:
        raise ConfigError(
            f"--ckpt_path {checkpoint_path} was trained with other model settings: {'; '.join(changed)}. "
            "Resume with the run's settings, or pass --allow_changed_settings true to continue with "
            "the new ones"
        )
