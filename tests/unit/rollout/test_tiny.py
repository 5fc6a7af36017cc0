import json

import torch


def test_folder_reloads_with_identical_ids_and_tags_are_single_tokens(tiny_path, tiny_tokenizer):
    from ragen_lightning.models.tiny import build_tokenizer
    from tests.conftest import SMALL_CORPUS

    fresh = build_tokenizer(SMALL_CORPUS, 400)
    text = "<|im_start|>user\n######\n#_X_P#\n<|im_end|>\n<think>push</think><answer>Up || Left</answer><|im_end|>"
    # transformers re-loads a qwen2 folder with its own tokenizer class; ids must not change
    assert tiny_tokenizer.encode(text, add_special_tokens=False) == fresh.encode(
        text, add_special_tokens=False
    )
    for tag in ("<think>", "</think>", "<answer>", "</answer>"):
        assert len(tiny_tokenizer.encode(tag, add_special_tokens=False)) == 1
    ids = tiny_tokenizer.encode(
        "<think>x</think><answer>Up</answer><|im_end|>", add_special_tokens=False
    )
    # tags are not special: skip_special_tokens keeps them and removes only the chat marker
    assert (
        tiny_tokenizer.decode(ids, skip_special_tokens=True)
        == "<think>x</think><answer>Up</answer>"
    )
    assert tiny_tokenizer.eos_token == "<|im_end|>" and tiny_tokenizer.pad_token == "<|endoftext|>"


def test_build_is_deterministic_and_cached(tmp_path, tiny_path):
    from safetensors.torch import load_file

    from ragen_lightning.models.tiny import TinySpec, tiny_model_path
    from tests.conftest import SMALL_CORPUS

    spec = TinySpec(**json.loads((tiny_path / "ragen_tiny.json").read_text())["spec"])
    again = tiny_model_path(spec, cache_dir=tmp_path, corpus=SMALL_CORPUS)
    assert again.name == tiny_path.name  # same key for the same spec and corpus
    a, b = load_file(tiny_path / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tiny_path / "tokenizer.json").read_text() == (again / "tokenizer.json").read_text()
    # a second call reuses the folder, and no temporary build folder is left behind
    assert tiny_model_path(spec, cache_dir=tmp_path, corpus=SMALL_CORPUS) == again
    assert [p.name for p in tmp_path.iterdir()] == [again.name]


def test_build_does_not_touch_global_rng(tmp_path):
    from ragen_lightning.models.tiny import TinySpec, tiny_model_path
    from tests.conftest import SMALL_CORPUS

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_model_path(
        TinySpec(
            hidden_size=16,
            num_layers=1,
            num_heads=1,
            num_kv_heads=1,
            intermediate_size=16,
            vocab_size=300,
        ),
        cache_dir=tmp_path,
        corpus=SMALL_CORPUS,
    )
    assert torch.equal(torch.rand(3), expected)


def test_model_loads_and_generates(tiny_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    assert next(model.parameters()).dtype == torch.float32
    out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
    assert out.shape[1] <= 7 and out[0, :3].tolist() == [1, 2, 3]
