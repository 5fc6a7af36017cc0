"""The layout of ``envs/``: a small root (``__init__.py``, ``base.py`` and family folders), families
that share only public names and ``envs.base``, and registration that does not depend on where a
line stands."""

from __future__ import annotations

import ast
from pathlib import Path

import gymnasium as gym
import pytest

import envs

ROOT = Path(envs.__file__).parent
GROUPS = ("tools",)  # folders of families, not a family: envs/tools/search, envs/tools/code, ...


def family(module: str) -> str | None:
    """The family folder of a dotted module under ``envs`` (``envs.tools.search.env`` ->
    ``tools.search``); None for the root modules (``envs``, ``envs.base``)."""
    parts = module.split(".")[1:]
    depth = 2 if parts and parts[0] in GROUPS else 1
    return ".".join(parts[:depth]) if len(parts) > depth else None


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_imports(path: Path) -> list[str]:
    """``module:name`` of every private name (or module) ``path`` takes from another family."""
    source = module_name(path)
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and not node.level:
            targets = [(f"{node.module}.{a.name}", a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [(a.name, a.name.rpartition(".")[2]) for a in node.names]
        else:
            continue
        for target, name in targets:
            if target.split(".")[0] != "envs":
                continue
            other = family(target)
            folders = target.split(".")[1:-1]
            private = name.startswith("_") or any(p.startswith("_") for p in folders)
            if other is not None and other != family(source) and private:
                out.append(f"{source} -> {target}")
    return out


def test_family_names_the_folder():
    assert family("envs.tools.search.env") == "tools.search"
    assert family("envs.tools.code._seccomp") == "tools.code"
    assert family("envs.grid.sokoban.generate") == "grid"
    assert family("envs.base") is None and family("envs") is None


def test_private_imports_are_found(tmp_path, monkeypatch):
    fake = tmp_path / "envs"
    (fake / "grid").mkdir(parents=True)
    (fake / "grid" / "x.py").write_text(
        "from envs.tools.code import _seccomp\n"
        "from envs.tools.search.retrieval import _load, MAX_TOP_K\n"
        "from envs.grid.sokoban import _own\nfrom envs.base import bounded_int\n"
    )
    monkeypatch.setattr(f"{__name__}.ROOT", fake)
    assert private_imports(fake / "grid" / "x.py") == [
        "envs.grid.x -> envs.tools.code._seccomp",
        "envs.grid.x -> envs.tools.search.retrieval._load",
    ]


def test_the_root_holds_init_base_and_family_folders_only():
    entries = sorted(p.name for p in ROOT.iterdir() if p.name != "__pycache__")
    assert len(entries) <= 10, entries
    assert [e for e in entries if (ROOT / e).is_file()] == ["__init__.py", "base.py"]
    for folder in (ROOT / e for e in entries if (ROOT / e).is_dir()):
        assert (folder / "__init__.py").is_file(), folder


def test_no_family_imports_another_familys_private_helpers():
    assert [hit for path in sorted(ROOT.rglob("*.py")) for hit in private_imports(path)] == []


def test_every_entry_point_lives_in_a_family_folder():
    for env_id in [*envs.ENV_IDS, envs.REMOTE_ID]:
        module = gym.spec(env_id).entry_point.split(":")[0]
        assert family(module) is not None, (env_id, module)


@pytest.mark.parametrize("how", ["assign", "update"])
def test_an_env_ids_line_registers_wherever_it_stands(how):
    """``ENV_IDS[...] = ...`` after ``import envs`` (the table's loop long done) still registers the
    id."""
    env_id = f"test/LateBandit{how.title()}-v0"
    entry = ("envs.text.bandit:BanditEnv", {"split": "test"})
    try:
        if how == "assign":
            envs.ENV_IDS[env_id] = entry
        else:
            envs.ENV_IDS.update({env_id: entry})
        assert gym.spec(env_id).kwargs == {"split": "test"}
        assert gym.make(env_id).unwrapped.split == "test"
    finally:
        envs.ENV_IDS.pop(env_id, None)
        gym.registry.pop(env_id, None)
