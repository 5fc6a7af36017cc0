"""The memory plan: parameter counts equal the real models', byte estimates computed by hand,
refusal, nf4 < bf16."""

from __future__ import annotations

import pytest

from ragen_lightning.cli import memory_check
from ragen_lightning.errors import ConfigError
from ragen_lightning.models import memory

# 2 layers, H 8, I 16, 2 heads of 4 (q_dim 8), 1 kv head (kv_dim 4), vocab 10, tied embeddings
SMALL = memory.Architecture(
    num_layers=2,
    hidden_size=8,
    intermediate_size=16,
    num_heads=2,
    num_kv_heads=1,
    vocab_size=10,
    tie_word_embeddings=True,
)


def hf_model(arch: memory.Architecture):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        num_hidden_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        vocab_size=arch.vocab_size,
        tie_word_embeddings=arch.tie_word_embeddings,
    )
    return Qwen2ForCausalLM(cfg)


def test_parameter_counts_by_hand():
    # per layer linears: q 8x8=64, k 8x4=32, v 32, o 64, gate 8x16=128, up 128, down 128 -> 576; 2
    # layers -> 1152
    assert SMALL.block_linear_weights() == 1152
    # + embeddings 10x8=80 + per layer (q/k/v biases 8+4+4, two norms 2x8) 32 x 2 + final norm 8 =
    #   1304
    assert SMALL.backbone_params() == 1304
    assert SMALL.causal_lm_params() == 1304  # tied LM head
    # rank 2: per layer 2 x [(8+8) + 2x(8+4) + (8+8) + 2x(8+16) + (16+8)] = 2 x 128 = 256; 2 layers
    # -> 512
    assert SMALL.lora_params(2) == 512
    assert SMALL.lora_params(2, ["q_proj", "v_proj"]) == 2 * 2 * ((8 + 8) + (8 + 4))  # 112


@pytest.mark.parametrize("tied", [True, False])
def test_counts_equal_the_transformers_models(tied):
    from peft import LoraConfig, get_peft_model

    arch = memory.Architecture(3, 16, 40, 4, 2, 50, tied)
    model = hf_model(arch)
    assert sum(p.numel() for p in model.parameters()) == arch.causal_lm_params()
    assert sum(p.numel() for p in model.model.parameters()) == arch.backbone_params()
    peft = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))
    assert sum(p.numel() for p in peft.parameters() if p.requires_grad) == arch.lora_params(4)


def test_published_qwen25_sizes():
    # the published parameter counts (model cards): 0.49B, 1.54B, 3.09B, 7.62B
    counts = {name: arch.causal_lm_params() for name, arch in memory.PUBLISHED.items()}
    assert counts["Qwen/Qwen2.5-0.5B-Instruct"] == 494_032_768
    assert round(counts["Qwen/Qwen2.5-1.5B-Instruct"] / 1e9, 2) == 1.54
    assert round(counts["Qwen/Qwen2.5-3B-Instruct"] / 1e9, 2) == 3.09
    assert round(counts["Qwen/Qwen2.5-7B-Instruct"] / 1e9, 2) == 7.62
    assert memory.architecture("Qwen/Qwen2.5-7B") is memory.PUBLISHED["Qwen/Qwen2.5-7B-Instruct"]


def test_full_finetune_plan_by_hand():
    p = memory.plan(
        SMALL,
        dtype="float32",
        activation_bytes=4,
        micro_batch_size=1,
        max_model_len=4,
        with_critic=True,
        max_batch_size=3,
        overhead_gib=0,
    )
    # critic: backbone + value head 8+1
    assert p.weights == {"actor": 1304 * 4, "critic": (1304 + 9) * 4}
    assert p.grads == (1304 + 1313) * 4 == 10468
    assert p.optimizer == 2 * 10468  # AdamW: two fp32 moments per trainable parameter
    # activations: 4 tokens x (10x8 + 3x4 + 4x16 = 156) elements x 4 bytes = 2496 per layer, 2
    # layers
    assert p.activations == 2 * 2496
    # logits: 2 x 4 tokens x vocab 10 x 4 bytes = 320, log-softmax 3 x 4 rows x 10 x 4 bytes = 480
    assert p.logits == 800
    # KV cache: 2 (k, v) x 2 layers x kv_dim 4 x 4 bytes x 3 sequences x 4 tokens
    assert p.engine_kv_cache == 768
    assert p.peak == 5216 + 5252 + 10468 + 20936 + max(4992 + 800, 768)
    ck = memory.plan(
        SMALL,
        dtype="float32",
        activation_bytes=4,
        micro_batch_size=1,
        max_model_len=4,
        activation_checkpointing=True,
        overhead_gib=0,
    )
    # block inputs (2 layers x 4 tokens x H 8 x 4 B) + one block
    assert ck.activations == 2 * 4 * 8 * 4 + 2496


def test_chunked_logits_and_vllm_reservation_by_hand():
    p = memory.plan(
        SMALL,
        dtype="float32",
        activation_bytes=4,
        micro_batch_size=1,
        max_model_len=4,
        logits_chunk_size=2,
        engine="vllm",
        gpu_memory_utilization=0.25,
        gpu_gib=8.0,
        overhead_gib=0,
    )
    # logits: 2 x 4 tokens x vocab 10 x 4 bytes = 320, log-softmax over a chunk of 2 rows: 3 x 2 x
    # 10 x 4 = 240
    assert p.logits == 560
    # vLLM holds no KV cache in the trainer's memory; it reserves 0.25 x 8 GiB
    assert p.engine_kv_cache == 0 and p.engine_reserved == 2 * memory.GIB
    with pytest.raises(
        ConfigError, match=r"vLLM engine needs the GPU's memory \(--gpu_memory_gb\)"
    ):
        memory.plan(SMALL, engine="vllm", gpu_memory_utilization=0.25)


def test_autocast_copies_of_fp32_trainable_matmul_weights_under_mixed_precision_only():
    """Autocast keeps a 16-bit copy of each fp32 trainable weight it casts until its outermost
    region exits (the whole training step): measured on an H100 (docs/gpu.md) and on CPU (a 256 MiB
    fp32 Linear under bf16 autocast holds +136 MiB until the region exits, +0 with
    ``cache_enabled=False``)."""
    full = memory.plan(
        SMALL, dtype="float32", with_critic=True, mixed_precision=True, overhead_gib=0
    )
    # actor: blocks' linears 1152 + the tied LM head 10x8 = 80; critic: blocks 1152 + value head 8
    # -> 2392 x 2 bytes
    assert full.autocast_copies == 2 * (1152 + 80 + 1152 + 8) == 4784
    assert (
        full.static
        == memory.plan(SMALL, dtype="float32", with_critic=True, overhead_gib=0).static + 4784
    )
    assert (
        memory.plan(SMALL, dtype="float32", with_critic=False, mixed_precision=True).autocast_copies
        == 2 * 1232
    )
    # nothing fp32 to cast
    assert memory.plan(SMALL, dtype="bfloat16", mixed_precision=True).autocast_copies == 0
    # fp32 (or *-true) precision: no autocast
    assert memory.plan(SMALL, dtype="float32").autocast_copies == 0
    lora = memory.plan(SMALL, dtype="bfloat16", lora={"rank": 2}, mixed_precision=True)
    # the fp32 adapters of actor and critic; frozen bases never cached
    assert lora.autocast_copies == 2 * 2 * 512
    assert "autocast 16-bit copies" in full.table() and "autocast" not in memory.plan(SMALL).table()
    model = {
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "dtype": "float32",
        "advantage": {"estimator": "grpo"},
    }
    planned = {
        prec: memory_check.plan_from_config(model, {}, {"precision": prec})
        for prec in ("bf16-mixed", "32-true")
    }
    assert planned["32-true"].autocast_copies == 0
    # 0.5B: per block q, o 896x896, k, v 896x128, gate, up, down 896x4864 = 14,909,440 x 24 blocks +
    # head 151936x896
    assert planned["bf16-mixed"].autocast_copies == 2 * (24 * 14_909_440 + 151_936 * 896)


def test_plan_from_config_reads_the_model_settings_groups():
    """A parsed ``model`` section holds the settings groups as nested dicts (``--model.update.*``,
    ...)."""
    name, data = "Qwen/Qwen2.5-0.5B-Instruct", {"episode": {"max_model_len": 256}}
    arch = memory.architecture(name)

    def planned(**groups):
        return memory_check.plan_from_config(
            {"model": name, "dtype": "float32", **groups}, data, {}
        )

    assert "critic" in planned().weights  # the default estimator (gae) trains a critic
    assert "critic" not in planned(advantage={"estimator": "grpo"}).weights
    assert (
        "reference (copy)" not in planned().weights
        and "reference (copy)" not in planned(loss={"kl_coef": 0.0}).weights
    )
    # a KL loss: its coefficient > 0
    assert "reference (copy)" in planned(loss={"kl_coef": 0.1}).weights
    assert "reference (copy)" in planned(advantage={"kl_in_reward_coef": 0.1}).weights
    update = {"micro_batch_size": 2, "logits_chunk_size": 64, "activation_checkpointing": True}
    assert planned(update=update) == memory.plan(
        arch,
        dtype="float32",
        activation_bytes=4,
        micro_batch_size=2,
        max_model_len=256,
        logits_chunk_size=64,
        activation_checkpointing=True,
        with_critic=True,
    )
    # a token budget: a micro-batch holds the budget (or one longer row): 600 tokens of 256-token
    # rows are 3 rows at most (rounded up), 100 tokens one row
    for tokens, rows in ((600, 3), (100, 1), (512, 2)):
        budget = {"micro_batch_size": 8, "micro_batch_tokens": tokens, "pack": True}
        assert planned(update=budget) == memory.plan(
            arch,
            dtype="float32",
            activation_bytes=4,
            micro_batch_size=rows,
            max_model_len=256,
            with_critic=True,
        )
    eight_bit = {"class_path": "bitsandbytes.optim.AdamW8bit"}
    assert (
        planned(optim={"actor_optimizer": eight_bit, "critic_optimizer": eight_bit}).optimizer
        < planned().optimizer
    )


def test_reference_costs_a_copy_only_without_lora():
    full = memory.plan(SMALL, with_reference=True)
    assert full.weights["reference (copy)"] == full.weights["actor"]
    lora = memory.plan(SMALL, with_reference=True, lora={"rank": 2})
    assert not any("reference" in k for k in lora.weights)


def test_lora_and_nf4_by_hand():
    bf16 = memory.plan(SMALL, dtype="bfloat16", with_critic=False, lora={"rank": 2}, overhead_gib=0)
    assert bf16.weights["actor base (frozen)"] == 1304 * 2
    assert bf16.weights["LoRA adapters (fp32)"] == 512 * 4
    assert bf16.grads == 512 * 4 and bf16.optimizer == 2 * 512 * 4  # only adapters train
    nf4 = memory.plan(
        SMALL, dtype="bfloat16", with_critic=False, lora={"rank": 2, "quantization": "nf4"}
    )
    # 1152 block weights x 0.5 B + 1152/64 = 18 blocks x (1 B absmax + 4 B / 256 blocks) = 594.28;
    # the other 1304 - 1152 = 152 parameters stay bf16: 304 -> 898 bytes (vs 2608 in bf16)
    assert nf4.weights["actor base (frozen, nf4)"] == 898
    no_dq = memory.plan(
        SMALL,
        dtype="bfloat16",
        with_critic=False,
        lora={"rank": 2, "quantization": "nf4", "double_quant": False},
    )
    assert no_dq.weights["actor base (frozen, nf4)"] == 576 + 18 * 4 + 304
    big = memory.PUBLISHED["Qwen/Qwen2.5-7B-Instruct"]
    assert (
        memory.plan(big, dtype="bfloat16", lora={"rank": 64, "quantization": "nf4"}).peak
        < memory.plan(big, dtype="bfloat16", lora={"rank": 64}).peak
    )


def test_shared_base_holds_one_base_and_two_adapters():
    sep = memory.plan(SMALL, dtype="bfloat16", lora={"rank": 2})
    shared = memory.plan(SMALL, dtype="bfloat16", lora={"rank": 2, "shared_base": True})
    assert "critic base (frozen)" in sep.weights and "critic base (frozen)" not in shared.weights
    assert shared.weights["LoRA adapters (fp32)"] == 2 * 512 * 4
    assert sep.peak - shared.peak == 1304 * 2  # exactly the critic's backbone in bf16


def config(update=None, **model):
    update = {"micro_batch_size": 1, **(update or {})}
    return {
        "model": {
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "dtype": "float32",
            "update": update,
            **model,
        },
        "data": {"episode": {"max_model_len": 2048}, "engine": {"max_batch_size": 32}},
        "trainer": {"precision": "bf16-mixed"},
        "gpu_memory_gb": 24.0,
    }


def test_refuses_a_config_that_does_not_fit_naming_the_flag():
    with pytest.raises(
        ConfigError, match=r"--gpu_memory_gb 24: the estimated peak .* GiB does not fit"
    ):
        # 7B full fine-tune with a critic: ~240 GiB
        memory_check.check_memory(config(), print_plan=False)
    plan = memory_check.check_memory(
        config(
            dtype="bfloat16",
            update={"activation_checkpointing": True, "logits_chunk_size": 1024},
            lora={"rank": 64, "quantization": "nf4"},
        ),
        print_plan=False,
    )
    assert plan.fits(24)


def test_memory_plan_prints_and_exits(capsys):
    with pytest.raises(SystemExit) as e:
        memory_check.check_memory(
            config(lora={"rank": 64, "quantization": "nf4"}, dtype="bfloat16"),
            print_plan=True,
            refuse=False,
        )
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "actor base (frozen, nf4)" in out and "PEAK" in out and "GPU memory" in out


def test_unknown_architecture_names_the_flag(tmp_path):
    with pytest.raises(ConfigError, match="--model.model"):
        memory.architecture(str(tmp_path))


def test_local_folder_config(tiny_path):
    import json

    cfg = json.loads((tiny_path / "config.json").read_text())
    arch = memory.architecture(str(tiny_path))
    assert (arch.hidden_size, arch.num_layers, arch.vocab_size) == (
        cfg["hidden_size"],
        cfg["num_hidden_layers"],
        cfg["vocab_size"],
    )


def test_activation_term_matches_the_tensors_autograd_saves():
    """The activation estimate against a measurement: bytes of the distinct tensors autograd keeps
    for backward in one fp32 forward of a small Qwen2 (parameters excluded). Measured here: 16.4 MiB
    saved vs 16.75 MiB planned for 2 layers (H 256, I 1408, T 256): the plan is slightly
    conservative."""
    import torch

    arch = memory.Architecture(2, 256, 1408, 4, 2, 512, True)
    model = hf_model(arch).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=torch.randint(0, 512, (1, 256)))
    planned = memory.plan(
        arch, activation_bytes=4, micro_batch_size=1, max_model_len=256
    ).activations
    assert 0.9 * planned <= sum(saved.values()) <= planned


def test_phases_with_vllm_by_hand():
    """vLLM colocated: the rollout holds the training state plus its reservation; at sleep_level >=
    1 the update holds none of it, at sleep_level 0 all of it; the peak is the larger phase."""
    kw = {
        "dtype": "float32",
        "activation_bytes": 4,
        "micro_batch_size": 1,
        "max_model_len": 4,
        "with_critic": True,
        "engine": "vllm",
        "gpu_memory_utilization": 0.25,
        "gpu_gib": 8.0,
        "overhead_gib": 0,
    }
    static = 5216 + 5252 + 10468 + 20936  # test_full_finetune_plan_by_hand's weights, grads, AdamW
    asleep = memory.plan(SMALL, sleep_level=1, **kw)
    assert (
        asleep.engine_reserved == 2 * memory.GIB
        and asleep.engine_kv_cache == 0
        and asleep.engine_asleep == 0
    )
    assert asleep.rollout == static + 2 * memory.GIB
    assert asleep.update == static + 4992 + 800  # activations + logits, vLLM asleep
    assert asleep.peak == asleep.rollout
    awake = memory.plan(SMALL, sleep_level=0, **kw)
    assert awake.update == static + 4992 + 800 + 2 * memory.GIB and awake.peak == awake.update
    assert memory.plan(SMALL, sleep_level=2, **kw).peak == asleep.peak
    table = asleep.table(8.0)
    assert "rollout engine: vllm" in table and "phase rollout" in table and "phase update" in table
    with pytest.raises(ConfigError, match="resolved rollout engine .* got 'auto'"):
        memory.plan(SMALL, engine="auto")


def test_phases_with_the_hf_engine_by_hand():
    p = memory.plan(
        SMALL,
        dtype="float32",
        activation_bytes=4,
        micro_batch_size=1,
        max_model_len=4,
        max_batch_size=3000,
        overhead_gib=0.5,
    )
    static = 5216 + 5252 + 10468 + 20936
    # (k, v) x layers x kv_dim x 4 bytes x 3000 sequences x 4 tokens = 768,000
    kv = 2 * 2 * 4 * 4 * 3000 * 4
    assert p.engine_kv_cache == kv and p.engine_reserved == 0
    assert (
        p.rollout == static + kv + memory.GIB // 2
        and p.update == static + 4992 + 800 + memory.GIB // 2
    )
    # the KV cache of 3000 sequences outweighs one micro-batch's activations
    assert p.peak == p.rollout


QWEN05 = {
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "dtype": "float32",
    "advantage": {"estimator": "grpo"},
}
DATA = {"episode": {"max_model_len": 2048}}


def engine_data(name: str, **vllm) -> dict:
    """A config's data section with engine ``name`` (64 sequences a batch) and ``vllm`` settings."""
    return {**DATA, "engine": {"name": name, "max_batch_size": 64, "vllm": vllm}}


def test_plan_resolves_auto_as_the_fit_does(monkeypatch):
    """``auto`` goes through resolve_engine: vLLM when installed and the actor is not nf4, else
    HF."""
    from ragen_lightning.rollout import engines

    monkeypatch.setattr(engines, "vllm_installed", lambda: True)
    data = engine_data("auto", gpu_memory_utilization=0.3, sleep_level=1)
    p = memory_check.plan_from_config(QWEN05, data, {"precision": "bf16-mixed"}, gpu_gib=24.0)
    assert (
        p.engine == "vllm"
        and p.engine_reserved == int(0.3 * 24 * memory.GIB)
        and p.engine_kv_cache == 0
    )
    assert p.rollout == p.static + p.engine_reserved + memory.GIB
    assert any("gpu_memory_utilization 0.3 x 24 GiB from --gpu_memory_gb" in n for n in p.notes)
    nf4 = memory_check.plan_from_config(
        {**QWEN05, "dtype": "bfloat16", "lora": {"rank": 8, "quantization": "nf4"}},
        data,
        {"precision": "bf16-mixed"},
        gpu_gib=24.0,
    )
    assert nf4.engine == "hf" and nf4.engine_reserved == 0
    # HF KV cache: 2 (k, v) x 24 layers x kv_dim 128 x 2 bytes (bf16) x 64 sequences x 2048 tokens =
    # 1.5 GiB
    assert nf4.engine_kv_cache == 2 * 24 * 128 * 2 * 64 * 2048 == int(1.5 * memory.GIB)
    monkeypatch.setattr(engines, "vllm_installed", lambda: False)
    assert memory_check.plan_from_config(QWEN05, data, {}, gpu_gib=24.0).engine == "hf"
    assert (
        memory_check.plan_from_config(QWEN05, engine_data("vllm"), {}, gpu_gib=24.0).engine
        == "vllm"
    )


def test_vllm_fraction_defaults_and_gpu_memory_source(monkeypatch):
    data = engine_data("vllm")  # no --data.engine.vllm: VLLMSettings' default fraction 0.5
    assert (
        memory_check.plan_from_config(QWEN05, data, {}, gpu_gib=24.0).engine_reserved
        == 12 * memory.GIB
    )
    monkeypatch.setattr(memory_check, "device_memory_gib", lambda: 80.0)
    p = memory_check.plan_from_config(QWEN05, engine_data("vllm", gpu_memory_utilization=0.25), {})
    assert p.engine_reserved == 20 * memory.GIB and any(
        "80 GiB from this machine's CUDA device 0" in n for n in p.notes
    )
    monkeypatch.setattr(memory_check, "device_memory_gib", lambda: None)
    with pytest.raises(
        ConfigError, match="vLLM engine needs the GPU's memory: pass --gpu_memory_gb"
    ):
        memory_check.plan_from_config(QWEN05, data, {})


def test_refusal_counts_the_vllm_reservation():
    """The --gpu_memory_gb refusal uses the same peak: a config that fits with the HF engine is
    refused once vLLM reserves 0.9 of the GPU, and fits again at a fraction that leaves room for the
    training state."""
    update = {"micro_batch_size": 1, "logits_chunk_size": 256, "activation_checkpointing": True}
    cfg = {
        "model": {**QWEN05, "lora": {"rank": 8}, "dtype": "bfloat16", "update": update},
        "data": engine_data("hf"),
        "trainer": {"precision": "bf16-mixed"},
        "gpu_memory_gb": 8.0,
    }
    fits = memory_check.check_memory(cfg, print_plan=False)
    assert fits.fits(8.0) and fits.engine_kv_cache > 0
    vllm = {**cfg, "data": engine_data("vllm", gpu_memory_utilization=0.9)}
    with pytest.raises(ConfigError, match=r"--gpu_memory_gb 8: the estimated peak .* does not fit"):
        memory_check.check_memory(vllm, print_plan=False)
    low = {**cfg, "data": engine_data("vllm", gpu_memory_utilization=0.3)}
    assert (
        memory_check.check_memory(low, print_plan=False).peak
        == fits.static + int(0.3 * 8 * memory.GIB) + memory.GIB
    )
    note = memory.plan(
        memory.PUBLISHED["Qwen/Qwen2.5-7B-Instruct"],
        engine="vllm",
        gpu_memory_utilization=0.5,
        gpu_gib=24.0,
    ).notes
    assert any("below its own weights" in n for n in note)  # 12 GiB < 7.6e9 x 2 bytes


def _merged(*paths):
    """The YAML files deep-merged in order (a later file's keys win), as the CLI composes --config
    files."""
    import yaml

    def merge(a, b):
        return {
            **a,
            **{
                k: merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
                for k, v in b.items()
            },
        }

    out: dict = {}
    for path in paths:
        out = merge(out, yaml.safe_load(path.read_text()) or {})
    return out


def test_logits_term_of_the_qwen_standin_uses_its_151936_rows(qwen_standin_path):
    # --model.model tiny:qwen, micro-batch 2 x max_model_len 1024 = 2,048 tokens, fp32 (32-true), no
    # chunking: logits value + gradient 2 x 2048 x 151936 x 4 B = 2,489,319,424; log-softmax 3 x
    # 2048 x 151936 x 4 B = 3,733,979,136; together 6,223,298,560 B (5.80 GiB)
    p = memory_check.plan_from_config(
        {"model": "tiny:qwen", "update": {"micro_batch_size": 2}},
        {"engine": {"name": "hf"}, "episode": {"max_model_len": 1024}},
        {"precision": "32-true"},
    )
    assert memory.architecture("tiny:qwen").vocab_size == 151936
    assert p.logits == 6_223_298_560
    # with 1,024-row chunks (what the Qwen2.5 overlays set) the log-softmax term is 3 x 1024 x
    # 151936 x 4 B
    chunked = memory_check.plan_from_config(
        {"model": "tiny:qwen", "update": {"micro_batch_size": 2, "logits_chunk_size": 1024}},
        {"engine": {"name": "hf"}, "episode": {"max_model_len": 1024}},
        {"precision": "32-true"},
    )
    assert chunked.logits == 2_489_319_424 + 1_866_989_568


def test_the_qwen25_05b_overlay_plan_uses_the_same_formula():
    from tests.unit.test_config_overlays import CONFIGS

    cfg = _merged(
        CONFIGS / "sokoban_starpo_s.yaml", CONFIGS / "models" / "qwen2.5-0.5b-instruct.yaml"
    )
    p = memory_check.plan_from_config(cfg["model"], cfg["data"], cfg["trainer"], gpu_gib=80.0)
    # the overlay: micro-batch 4 x max_model_len 3600 = 14,400 tokens, bf16-mixed (2-byte
    # activations), 1,024-row chunks: 2 x 14400 x 151936 x 2 B = 8,751,513,600 + 3 x 1024 x 151936 x
    # 4 B = 1,866,989,568
    assert memory.architecture("Qwen/Qwen2.5-0.5B-Instruct").vocab_size == 151936
    assert p.logits == 8_751_513_600 + 1_866_989_568


def test_async_rollouts_hold_the_engine_through_the_update_and_the_hf_engine_a_copy_of_the_actor():
    """--data.training.async_level 1: the next rollout is generated during the update."""
    kw = {
        "dtype": "float32",
        "activation_bytes": 4,
        "micro_batch_size": 1,
        "max_model_len": 4,
        "with_critic": True,
        "overhead_gib": 0,
    }
    static = 5216 + 5252 + 10468 + 20936
    vllm = {**kw, "engine": "vllm", "gpu_memory_utilization": 0.25, "gpu_gib": 8.0}
    for level in (0, 1, 2):  # vLLM's whole reservation, whatever the sleep level, and counted once
        p = memory.plan(SMALL, sleep_level=level, async_rollouts=True, **vllm)
        assert (
            p.update == static + 4992 + 800 + 2 * memory.GIB
            and p.rollout == static + 2 * memory.GIB
        )
        assert "engine generating during the update (async)" in p.table() or level == 0
    # HF engine: its KV cache in both phases, and a frozen copy of the actor (1304 fp32 parameters)
    # in the static part
    sync = memory.plan(SMALL, max_batch_size=3000, **kw)
    hf = memory.plan(SMALL, max_batch_size=3000, async_rollouts=True, **kw)
    kv = 768_000  # test_phases_with_the_hf_engine_by_hand
    assert hf.weights["actor copy (async HF engine)"] == 1304 * 4 == hf.weights["actor"]
    assert hf.update == sync.update + 1304 * 4 + kv and hf.rollout == sync.rollout + 1304 * 4
    # LoRA: the copy is the whole actor, base and its adapters (one of the two: the critic's stays
    # home)
    lora = memory.plan(SMALL, lora={"rank": 2}, async_rollouts=True, **{**kw, "dtype": "bfloat16"})
    assert lora.weights["actor copy (async HF engine)"] == 1304 * 2 + 512 * 4
    shared = memory.plan(
        SMALL,
        lora={"rank": 2, "shared_base": True},
        async_rollouts=True,
        **{**kw, "dtype": "bfloat16"},
    )
    # one model, both adapters
    assert shared.weights["actor copy (async HF engine)"] == 1304 * 2 + 2 * 512 * 4


def test_a_refusal_under_async_names_the_async_level():
    fits = config(
        dtype="bfloat16",
        update={"activation_checkpointing": True, "logits_chunk_size": 1024},
        lora={"rank": 64},
    )
    fits["data"]["engine"] = {"name": "hf", "max_batch_size": 32}
    assert "async_level" not in str(
        pytest.raises(
            ConfigError, memory_check.check_memory, {**fits, "gpu_memory_gb": 1.0}, print_plan=False
        ).value
    )
    with pytest.raises(
        ConfigError,
        match=r"; --data.training.async_level 0: the engine's rollout memory then leaves the update "
        r"phase; docs/memory.md$",
    ):
        memory_check.check_memory(
            {
                **fits,
                "data": {**fits["data"], "training": {"async_level": 1}},
                "gpu_memory_gb": 1.0,
            },
            print_plan=False,
        )


def test_plan_from_config_reads_the_async_level():
    model = {
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "dtype": "bfloat16",
        "advantage": {"estimator": "grpo"},
    }
    data = engine_data("hf")
    sync = memory_check.plan_from_config(model, data, {"precision": "bf16-true"})
    ahead = memory_check.plan_from_config(
        model, {**data, "training": {"async_level": 1}}, {"precision": "bf16-true"}
    )
    assert (
        ahead.update - sync.update
        == ahead.engine_async + ahead.weights["actor copy (async HF engine)"]
    )
    assert ahead.engine_async == sync.engine_kv_cache > 0
