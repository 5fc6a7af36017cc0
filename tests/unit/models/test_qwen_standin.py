"""``tiny:qwen``: the embedded model with Qwen2.5's own tokenizer, chat template and vocabulary
(random weights), the stand-in for Qwen2.5 in tests (no hub weights can be downloaded)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ragen_lightning.models.loading import check_model_name
from ragen_lightning.models.qwen import DEFAULT_SYSTEM
from ragen_lightning.models.tiny import PRESETS, TinySpec, spec_from_name, tiny_model_path


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return tiny_model_path(
        spec_from_name("tiny:qwen"), cache_dir=tmp_path_factory.mktemp("standin")
    )


def test_names_select_the_qwen_tokenizer_and_refuse_it_with_grid_cells():
    assert spec_from_name("tiny:qwen") == TinySpec(qwen=True)
    assert spec_from_name("tiny:small+qwen") == TinySpec(
        **{**PRESETS["small"].__dict__, "qwen": True}
    )
    with pytest.raises(ValueError, match="one of 'cells' .* or 'qwen'"):
        spec_from_name("tiny:qwen+cells")
    check_model_name("--model.model", "tiny:qwen")  # accepted by the settings check


def test_the_standin_has_qwen25s_vocabulary_special_ids_and_template(standin):
    tok, model = (
        AutoTokenizer.from_pretrained(standin),
        AutoModelForCausalLM.from_pretrained(standin),
    )
    config = json.loads((standin / "config.json").read_text())
    # Qwen2.5's published config: 151,936 embedding rows for the tokenizer's 151,665 ids; eos
    # <|im_end|>, pad <|endoftext|>
    assert (config["vocab_size"], len(tok)) == (151936, 151665)
    assert (config["eos_token_id"], config["pad_token_id"]) == (151645, 151643)
    assert model.get_input_embeddings().weight.shape == (151936, 128)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert (
        text
        == f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok(text, add_special_tokens=False).input_ids
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 151936) and torch.isfinite(logits).all()
