"""Shared fixtures (a tiny tokenizer/model) and hermetic caches.

Caches: tests never write to the user's caches (``~/.cache/ragen_lightning``, wandb's and Hugging
Face's home folders). Unless already set, every cache variable points into the repo-local,
git-ignored ``.cache/tests/``, which survives between runs, so the tiny model and the warm starts
are built once, not on every run. The variables are set in ``os.environ`` at import, before any test
runs, so subprocesses started with the environment inherit them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TEST_CACHE = REPO / ".cache" / "tests"
CACHE_VARS = {
    # tiny models and warm starts (models/tiny.py)
    "RAGEN_LIGHTNING_CACHE": TEST_CACHE / "ragen_lightning",
    "HF_HOME": TEST_CACHE / "huggingface",
    "WANDB_DIR": TEST_CACHE / "wandb",
    "WANDB_CACHE_DIR": TEST_CACHE / "wandb" / "cache",
    "WANDB_CONFIG_DIR": TEST_CACHE / "wandb" / "config",
    "WANDB_DATA_DIR": TEST_CACHE / "wandb" / "data",
    "MPLCONFIGDIR": TEST_CACHE / "matplotlib",
}
for _name, _path in CACHE_VARS.items():
    if not os.environ.get(_name):
        _path.mkdir(parents=True, exist_ok=True)
        os.environ[_name] = str(_path)

# The test models are tiny: one thread avoids per-op threading overhead (and stalls when another
# process holds a core), which makes the suite several times faster on 2-core machines.
torch.set_num_threads(1)


def load_script(relative: str, name: str | None = None):
    """Import a script that is not a package module (``benchmarks/<x>.py``, ``scripts/<x>.py``) by
    its path from the repository root; registered in ``sys.modules`` under ``name`` (the dataclasses
    of a script look their module up there)."""
    import importlib.util
    import sys

    path = REPO / relative
    name = name or "script_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def pytest_configure(config):
    """The third-party warnings the command line filters as harmless (ragen_lightning/errors.py,
    each with its reason) are filtered in the tests too."""
    from ragen_lightning.errors import HARMLESS_WARNINGS

    for message, category, _why in HARMLESS_WARNINGS:
        config.addinivalue_line("filterwarnings", f"ignore:{message}:{category.__name__}")


def pytest_collection_modifyitems(config, items):
    """Deselect ``gpu`` tests unless the ``-m`` expression names them (``-m gpu``). Done here rather
    than with ``-m 'not gpu'`` in addopts so that another ``-m`` on the command line (``-m "not
    slow"``) does not bring them back: the last ``-m`` wins."""
    if "gpu" in (config.getoption("markexpr") or ""):
        return
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]


# A small fixed corpus keeps the session fixture fast; tests of the default corpus build their own.
SMALL_CORPUS = [
    "You're a helpful assistant. You are solving the Sokoban puzzle. Your available actions are:\nUp, Down, Left, Right",
    "\nTurn 1:\nState:\n######\n#_O__#\n#_X__#\n#_P__#\n######\nYou have 10 actions left. Always output: "
    "<think> [Your thoughts] </think> <answer> [your answer] </answer> with no extra text.",
    "<think>I push the box up.</think><answer>Up || Left</answer> Reward:\n-0.1\n 0 1 2 3 4 5 6 7 8 9 10",
]


@pytest.fixture(scope="session")
def tiny_path():
    """Built once into the test cache (keyed by spec and corpus, written atomically) and reused by
    later runs."""
    from ragen_lightning.models.tiny import TinySpec, cache_root, tiny_model_path

    spec = TinySpec(
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        vocab_size=400,
    )
    return tiny_model_path(spec, cache_dir=cache_root(), corpus=SMALL_CORPUS)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """Qwen2.5's tokenizer built offline (ragen_lightning/models/qwen.py) into the test cache,
    once."""
    from ragen_lightning.models.qwen import qwen25_tokenizer

    return qwen25_tokenizer()


@pytest.fixture(scope="session")
def qwen_standin_path():
    """``tiny:qwen`` (the embedded model with Qwen2.5's tokenizer and 151,936-row vocabulary), built
    once into the test cache with its tokenizer and reused by later runs."""
    from ragen_lightning.models.tiny import cache_root, spec_from_name, tiny_model_path

    return tiny_model_path(spec_from_name("tiny:qwen"), cache_dir=cache_root())


@pytest.fixture(scope="session")
def qwen_standin_tokenizer(qwen_standin_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen_standin_path)
