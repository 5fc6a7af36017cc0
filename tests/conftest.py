"""Shared fixtures: a tiny tokenizer/model built once per test session into a temporary cache."""

from __future__ import annotations

import os

import pytest
import torch

# The test models are tiny: one thread avoids per-op threading overhead (and stalls when another process holds a
# core), which makes the suite several times faster on 2-core machines.
torch.set_num_threads(1)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

# A small fixed corpus keeps the session fixture fast; tests of the default corpus build their own.
SMALL_CORPUS = [
    "You're a helpful assistant. You are solving the Sokoban puzzle. Your available actions are:\nUp, Down, Left, Right",
    "\nTurn 1:\nState:\n######\n#_O__#\n#_X__#\n#_P__#\n######\nYou have 10 actions left. Always output: "
    "<think> [Your thoughts] </think> <answer> [your answer] </answer> with no extra text.",
    "<think>I push the box up.</think><answer>Up || Left</answer> Reward:\n-0.1\n 0 1 2 3 4 5 6 7 8 9 10",
]


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    from ragen_lightning.models.tiny import TinySpec, tiny_model_path

    spec = TinySpec(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64, vocab_size=400)
    return tiny_model_path(spec, cache_dir=tmp_path_factory.mktemp("tiny-cache"), corpus=SMALL_CORPUS)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)
