"""The tiny tokenizer reads a grid one cell per token, rows separated by a newline token, after
save/reload."""

import dataclasses
import re

import gymnasium as gym
import pytest

import envs  # noqa: F401  (registers the env ids)

GRID_ENVS = (
    "ragen/SimpleSokoban-v0",
    "ragen/LargerSokoban-v0",
    "ragen/SokobanDifferentGridVocab-v0",
    "ragen/FrozenLake-v0",
)


def renderings(env_id: str, seeds: int = 6, steps: int = 6) -> list[str]:
    env = gym.make(env_id)
    out = []
    for seed in range(seeds):
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        out.append(obs)
        for _ in range(steps):
            obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
            out.append(obs)
            if terminated or truncated:
                break
    env.close()
    return out


@pytest.fixture(scope="module")
def grid_folder(tmp_path_factory):
    from ragen_lightning.models.tiny import TinySpec, tiny_model_path
    from tests.conftest import SMALL_CORPUS

    # grid runs in the corpus: plain BPE would learn merges such as "____" and "#_" from them
    corpus = [*SMALL_CORPUS, *(obs for env_id in GRID_ENVS for obs in renderings(env_id))]
    spec = TinySpec(
        hidden_size=16,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        intermediate_size=16,
        vocab_size=500,
        grid_cells=True,
    )
    return tiny_model_path(
        spec, cache_dir=tmp_path_factory.mktemp("tiny-grid"), corpus=corpus
    ), corpus


def test_grid_symbols_come_from_the_envs_prompt_specs():
    from ragen_lightning.models.tiny import grid_symbols

    chars = grid_symbols()
    assert "\n" in chars
    for env_id in GRID_ENVS:
        for symbol, _ in gym.make(env_id).unwrapped.prompt_spec().symbols:
            assert symbol in chars


@pytest.mark.parametrize("env_id", GRID_ENVS)
def test_each_cell_is_one_token_and_rows_end_in_a_newline_token_after_reload(grid_folder, env_id):
    from transformers import AutoTokenizer

    folder, _ = grid_folder
    # transformers re-loads a qwen2 folder with Qwen2Tokenizer (its own pre-tokenizer); the cells
    # must survive that
    tok = AutoTokenizer.from_pretrained(folder)
    assert type(tok).__name__ in ("Qwen2Tokenizer", "Qwen2TokenizerFast")
    newline = tok.convert_tokens_to_ids(tok.tokenize("\n"))
    assert len(newline) == 1
    for obs in renderings(env_id):
        ids = tok.encode(obs, add_special_tokens=False)
        assert [tok.decode([i]) for i in ids] == list(obs)  # one token per cell and per newline
        rows = obs.split("\n")
        assert ids.count(newline[0]) == len(rows) - 1
        # inside a prompt the grid still starts on a token boundary and keeps one token per cell
        block = f"\nTurn 1:\nState:\n{obs}\nYou have 10 actions left."
        inner = tok.encode(block, add_special_tokens=False)
        assert any(inner[k : k + len(ids)] == ids for k in range(len(inner) - len(ids) + 1))


def test_ids_survive_save_and_reload(grid_folder):
    from transformers import AutoTokenizer

    from ragen_lightning.models.tiny import build_tokenizer, grid_symbols

    folder, corpus = grid_folder
    fresh = build_tokenizer(corpus, 500, grid_symbols())
    reloaded = AutoTokenizer.from_pretrained(folder)
    text = (
        "<|im_start|>user\n" + renderings("ragen/SimpleSokoban-v0")[0] + "\nS√@WX.<|im_end|>\n"
        "<think>Sokoban: push the box</think><answer>Up || Left</answer><|im_end|>"
    )
    assert reloaded.encode(text, add_special_tokens=False) == fresh.encode(
        text, add_special_tokens=False
    )


def test_plain_bpe_merges_grid_runs(grid_folder, tmp_path):
    """The contrast the option exists for: without ``grid_cells`` the same corpus merges runs of
    cells."""
    from ragen_lightning.models.tiny import build_tokenizer

    _, corpus = grid_folder
    bpe = build_tokenizer(corpus, 500)
    obs = renderings("ragen/SimpleSokoban-v0")[0]
    assert len(bpe.encode(obs, add_special_tokens=False)) < len(obs)


def test_a_rare_multibyte_symbol_is_still_one_token():
    from ragen_lightning.models.tiny import build_tokenizer

    # a 3-byte symbol that never occurs is still merged (the build adds it), so it stays one token
    tok = build_tokenizer(["plain text only"], 300, "√\n")
    assert len(tok.encode("√", add_special_tokens=False)) == 1


def test_the_plain_default_keeps_the_cache_key_of_builds_before_the_option(tmp_path):
    """``grid_cells=False`` (and ``qwen=False``) hashes exactly what version 1 hashed, so existing
    cached folders and warm starts stay."""
    import hashlib
    import json
    from dataclasses import asdict

    from ragen_lightning.models.tiny import TinySpec, _key

    spec = TinySpec()
    # version 1's fields
    old = {k: v for k, v in asdict(spec).items() if k not in ("grid_cells", "qwen")}
    h = hashlib.sha256()
    h.update(json.dumps({"spec": old, "version": 1}, sort_keys=True).encode())
    h.update(b"text")
    h.update(b"\x00")
    assert _key(spec, ["text"], "") == h.hexdigest()[:16]
    assert _key(TinySpec(grid_cells=True), ["text"], "\n#") != _key(spec, ["text"], "")
    # a new option must join the exclusions
    assert sorted(asdict(spec)) == sorted([*old, "grid_cells", "qwen"])


def test_model_names_select_tiny_variants():
    from ragen_lightning.models.loading import is_tiny
    from ragen_lightning.models.tiny import PRESETS, spec_from_name

    assert spec_from_name("tiny") == PRESETS["tiny"] and not PRESETS["tiny"].grid_cells
    assert spec_from_name("tiny:cells") == dataclasses.replace(PRESETS["tiny"], grid_cells=True)
    small = spec_from_name("tiny:small+cells")
    assert (small.hidden_size, small.num_layers, small.grid_cells) == (192, 6, True)
    assert spec_from_name("tiny:cells+wide") == dataclasses.replace(
        PRESETS["wide"], grid_cells=True
    )
    for bad in ("tiny:", "tiny:big", "tiny:cells+cells", "tiny:small+wide", "tinyx:cells"):
        with pytest.raises(
            ValueError, match=rf"^model '{re.escape(bad)}': the embedded model is 'tiny' or"
        ):
            spec_from_name(bad)
    assert (
        is_tiny("tiny")
        and is_tiny("tiny:cells")
        and not is_tiny("tinyllama/x")
        and not is_tiny("./tiny")
    )
