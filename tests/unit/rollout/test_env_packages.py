"""Env packages are found through the ``ragen_lightning.envs`` entry points, never by name in the
library: the CLIs' default ``--import``, and the tiny model's tokenizer corpus."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import gymnasium as gym
import pytest
import tomllib

from ragen_lightning.rollout import env_packages
from ragen_lightning.rollout.env_packages import ENTRY_POINT_GROUP, import_env_packages

ROOT = Path(__file__).resolve().parents[3]


def _points(*pairs: tuple[str, str]) -> list[metadata.EntryPoint]:
    return [metadata.EntryPoint(name=n, value=v, group=ENTRY_POINT_GROUP) for n, v in pairs]


@pytest.fixture
def fake_points(monkeypatch):
    """Replace the installed entry points of the group with the given ones."""

    def use(*pairs: tuple[str, str]) -> None:
        points = _points(*pairs)
        monkeypatch.setattr(
            env_packages.metadata,
            "entry_points",
            lambda group=None: [p for p in points if p.group == group],
        )

    return use


def _env_module(folder: Path, name: str, env_id: str) -> None:
    (folder / f"{name}.py").write_text(
        "import gymnasium as gym\n"
        f"if {env_id!r} not in gym.registry:\n"
        f"    gym.register(id={env_id!r}, entry_point='gymnasium.envs.toy_text.frozen_lake:FrozenLakeEnv')\n"
    )


def test_the_project_declares_its_envs_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][ENTRY_POINT_GROUP] == {"envs": "envs"}


def test_every_declared_package_is_imported_once_in_name_order(fake_points, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _env_module(tmp_path, "probe_envs_b", "probe/B-v0")
    _env_module(tmp_path, "probe_envs_a", "probe/A-v0")
    fake_points(("b", "probe_envs_b"), ("a", "probe_envs_a"), ("a2", "probe_envs_a:something"))
    try:
        assert env_packages.env_packages() == ["probe_envs_a", "probe_envs_b"]
        assert import_env_packages() == ["probe_envs_a", "probe_envs_b"]
        assert "probe/A-v0" in gym.registry and "probe/B-v0" in gym.registry
    finally:
        for env_id in ("probe/A-v0", "probe/B-v0"):
            gym.registry.pop(env_id, None)
        for name in ("probe_envs_a", "probe_envs_b"):
            sys.modules.pop(name, None)


def test_given_modules_replace_the_entry_points(fake_points):
    fake_points(("missing", "no_such_env_package"))
    assert import_env_packages(["json"]) == ["json"]  # the entry points are not read
    assert import_env_packages([]) == []


def test_a_package_that_cannot_be_imported_is_named(fake_points):
    fake_points(("broken", "no_such_env_package"))
    with pytest.raises(
        ImportError,
        match=r"env package 'no_such_env_package' cannot be imported \(an installed "
        r"'ragen_lightning.envs' entry point names it\)",
    ):
        import_env_packages()
    with pytest.raises(ImportError, match="env package 'no_such_env_package' cannot be imported: "):
        import_env_packages(["no_such_env_package"])


def test_installed_metadata_declares_the_envs_package():
    """Holds for an install of this tree (CI installs fresh); an editable install made before the
    entry point was added to pyproject.toml does not see it until ``pip install -e .`` runs
    again."""
    if "envs" not in env_packages.env_packages():
        pytest.skip(
            "the installed metadata predates the ragen_lightning.envs entry point: run pip install -e . again"
        )
    assert "envs" in import_env_packages()


def _fresh_python(code: str, tmp_path: Path) -> dict:
    """Run ``code`` in a fresh interpreter on this tree, with a distribution on the path that
    declares ``envs`` in the group (as an install of this tree does), so the result does not depend
    on how this tree was installed."""
    dist = tmp_path / "site" / "ragen_probe-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ragen-probe\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nenvs = envs\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(dist.parent)])}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_tiny_corpus_finds_the_envs_through_the_entry_point(tmp_path):
    """Nothing imports ``envs`` first: the library imports it through the entry point, and the
    corpus is the frozen list (the tiny model's cache key, hence every cached model and warm start,
    is unchanged)."""
    result = _fresh_python(
        "import json, sys\n"
        "from ragen_lightning.models import tiny\n"
        "before = 'envs' in sys.modules\n"
        "ids = tiny.corpus_env_ids()\n"
        "print(json.dumps({'before': before, 'after': 'envs' in sys.modules, 'ids': ids,"
        " 'file': sys.modules['envs'].__file__}))\n",
        tmp_path,
    )
    assert result["before"] is False and result["after"] is True
    assert result["file"] == str(ROOT / "envs" / "__init__.py")
    assert result["ids"] == list(
        __import__("ragen_lightning.models.tiny", fromlist=["x"]).CORPUS_ENV_IDS
    )


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        (
            "ragen_lightning.evaluate",
            ["--entry", "{env_id: ragen/Bandit-v0}", "--chunk_seeds", "0"],
        ),
        ("ragen_lightning.sft.warm_start", ["--skip_base", "true"]),
    ],
)
def test_the_command_lines_import_the_installed_env_packages_by_default(module, argv, monkeypatch):
    import importlib

    cli = importlib.import_module(module)
    calls = []

    def record(modules=None):
        calls.append(modules)
        raise KeyboardInterrupt  # stop right after the import: nothing else runs

    monkeypatch.setattr(env_packages, "import_env_packages", record)
    monkeypatch.setattr(cli, "import_env_packages", record, raising=False)
    for extra, expected in (
        ([], None),
        (["--imports", "[json, csv]"], ["json", "csv"]),
        (["--imports", "json"], ["json"]),
    ):
        with pytest.raises(KeyboardInterrupt):
            cli.main(argv + extra)
        assert calls.pop() == expected
