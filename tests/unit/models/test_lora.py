"""LoRA / QLoRA: what trains, the reference as adapters-off, the shared base's adapter switching,
adapter export."""

from __future__ import annotations

import itertools

import pytest
import torch

from ragen_lightning.errors import ConfigError
from ragen_lightning.models import lora
from ragen_lightning.models.build import build_lora_models
from ragen_lightning.starpo.scoring import critic_values

IDS = torch.tensor([[5, 17, 23, 42, 8, 99, 3, 61], [7, 7, 12, 40, 41, 2, 9, 30]])
ATT = torch.ones_like(IDS)


def settings(**kw) -> lora.LoraSettings:
    return lora.LoraSettings(**{"rank": 4, "alpha": 8.0, **kw})


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def fresh_base(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def train_steps(actor, critic, steps=1, lr=1e-2):
    """A few AdamW steps on a fixed batch: the actor maximises token log-likelihood, the critic
    regresses to 1."""
    a_params, c_params = lora.optimizer_parameters(actor, critic)
    opts = [torch.optim.AdamW(a_params, lr=lr)] + (
        [torch.optim.AdamW(c_params, lr=lr)] if critic is not None else []
    )
    losses = []
    for _ in range(steps):
        out = actor(input_ids=IDS, attention_mask=ATT).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            out.reshape(-1, out.shape[-1]), IDS[:, 1:].reshape(-1)
        )
        opts[0].zero_grad()
        loss.backward()
        opts[0].step()
        losses.append(float(loss.detach()))
        if critic is not None:
            v = critic_values(critic, IDS, ATT)
            opts[1].zero_grad()
            ((v - 1.0) ** 2).mean().backward()
            opts[1].step()
    return losses


@pytest.mark.parametrize(
    "kw, flag",
    [
        ({"rank": 0}, "--model.lora.rank"),
        ({"alpha": 0.0}, "--model.lora.alpha"),
        ({"dropout": 1.0}, "--model.lora.dropout"),
        ({"target_modules": "all"}, "--model.lora.target_modules"),
        ({"target_modules": []}, "--model.lora.target_modules"),
        ({"quantization": "int3"}, "--model.lora.quantization"),
    ],
)
def test_bad_settings_name_the_flag(kw, flag):
    with pytest.raises(ConfigError, match=flag):
        lora.as_settings(settings(**kw))


def test_settings_from_a_checkpoint_dict():
    assert lora.as_settings({"rank": 8, "quantization": "nf4"}) == lora.LoraSettings(
        rank=8, quantization="nf4"
    )
    assert lora.as_settings(None) is None


def test_only_adapters_and_value_head_train_and_a_step_changes_only_them(tiny_path):
    actor, critic, _ = build_lora_models(
        str(tiny_path), None, "float32", settings(), with_critic=True, with_reference=True
    )
    trainable = {n for n, p in actor.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    c_trainable = {n for n, p in critic.named_parameters() if p.requires_grad}
    assert {"value_head.weight", "value_head.bias"} <= c_trainable
    assert all("lora_" in n for n in c_trainable - {"value_head.weight", "value_head.bias"})
    before = {
        n: p.detach().clone() for n, p in [*actor.named_parameters(), *critic.named_parameters()]
    }
    train_steps(actor, critic)
    after = dict([*actor.named_parameters(), *critic.named_parameters()])
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    # lora_A starts random and lora_B at zero; one AdamW step moves every B (A's first gradient is 0
    # since B = 0)
    assert {n for n in trainable if "lora_B" in n} <= changed
    assert changed <= trainable | c_trainable  # the frozen base never moves
    assert "value_head.weight" in changed


def test_reference_is_the_base_with_adapters_off(tiny_path):
    actor, _, ref = build_lora_models(
        str(tiny_path), None, "float32", settings(), with_critic=False, with_reference=True
    )
    train_steps(actor, None, steps=2)
    base = logits(fresh_base(tiny_path))
    # bit-exact: the same frozen weights, no adapter
    torch.testing.assert_close(logits(ref), base, rtol=0, atol=0)
    assert (logits(actor) - base).abs().max() > 1e-3  # the trained adapters do change the policy
    assert not list(ref.parameters())  # a view: the reference owns no weights
    assert ref.__class__ is lora.AdaptersDisabled


@pytest.mark.parametrize("model", ["tiny", "qwen_standin"])
def test_exported_adapter_loads_with_peft_and_reproduces_logits(request, model, tmp_path):
    """Also on ``tiny:qwen``: the export carries Qwen2.5's tokenizer (151,665 ids, its chat
    template)."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    tiny_path, tiny_tokenizer = (
        request.getfixturevalue(f"{model}_{part}") for part in ("path", "tokenizer")
    )
    actor, _, _ = build_lora_models(
        str(tiny_path),
        None,
        "float32",
        settings(export_merged=True),
        with_critic=False,
        with_reference=False,
    )
    train_steps(actor, None, steps=2)
    lora.export_adapter(
        actor,
        tiny_tokenizer,
        tmp_path / "out",
        base_path=str(tiny_path),
        dtype=torch.float32,
        merged=True,
    )
    loaded = PeftModel.from_pretrained(fresh_base(tiny_path), tmp_path / "out")
    torch.testing.assert_close(logits(loaded), logits(actor))
    from transformers import AutoModelForCausalLM

    # plain HF weights, no peft
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "merged")
    torch.testing.assert_close(logits(merged), logits(actor), rtol=1e-4, atol=1e-4)
    assert merged.config.vocab_size == actor.get_input_embeddings().weight.shape[0]
    for folder in (tmp_path / "out", tmp_path / "out" / "merged"):
        exported = AutoTokenizer.from_pretrained(folder)
        assert exported.get_vocab() == tiny_tokenizer.get_vocab()
        assert exported.chat_template == tiny_tokenizer.chat_template
        assert (exported.eos_token_id, exported.pad_token_id) == (
            tiny_tokenizer.eos_token_id,
            tiny_tokenizer.pad_token_id,
        )
    if model == "qwen_standin":
        assert len(exported) == 151665 and merged.config.vocab_size == 151936
        assert (exported.eos_token, exported.pad_token) == ("<|im_end|>", "<|endoftext|>")


def test_shared_base_adapters_are_disjoint_and_gradients_reach_only_the_active_one(tiny_path):
    actor, critic, ref = build_lora_models(
        str(tiny_path),
        None,
        "float32",
        settings(shared_base=True),
        with_critic=True,
        with_reference=True,
    )
    assert isinstance(critic, lora.SharedBaseCritic)
    a_params, c_params = lora.optimizer_parameters(actor, critic)
    ids_a, ids_c = {id(p) for p in a_params}, {id(p) for p in c_params}
    assert not ids_a & ids_c
    all_lora = {id(p) for n, p in actor.named_parameters() if "lora_" in n}
    assert ids_a | (ids_c - {id(p) for p in critic.value_head.parameters()}) == all_lora
    for _, p in actor.named_parameters():  # give B non-zero values so A gets gradients too
        p.data.normal_(0, 0.05) if p.requires_grad else None
    critic.value_head.weight.data.normal_(0, 0.1)
    critic_values(critic, IDS, ATT).sum().backward()
    assert all(p.grad.abs().sum() > 0 for p in c_params) and all(p.grad is None for p in a_params)
    for p in c_params:
        p.grad = None
    actor(input_ids=IDS, attention_mask=ATT).logits.sum().backward()
    assert all(p.grad.abs().sum() > 0 for p in a_params) and all(p.grad is None for p in c_params)
    # the reference of a shared base is still the plain base
    torch.testing.assert_close(logits(ref), logits(fresh_base(tiny_path)), rtol=0, atol=0)


def test_shared_base_exports_the_actor_adapter(tiny_path, tiny_tokenizer, tmp_path):
    from peft import PeftModel

    actor, critic, _ = build_lora_models(
        str(tiny_path),
        None,
        "float32",
        settings(shared_base=True),
        with_critic=True,
        with_reference=False,
    )
    for _, p in actor.named_parameters():
        p.data.normal_(0, 0.05) if p.requires_grad else None
    # leaves the critic adapter active: the export must still be the actor's
    critic_values(critic, IDS, ATT)
    expected = logits(actor)
    lora.export_adapter(
        actor, tiny_tokenizer, tmp_path, base_path=str(tiny_path), dtype=torch.float32, merged=False
    )
    assert (tmp_path / "adapter_config.json").is_file() and not (tmp_path / "actor").exists()
    torch.testing.assert_close(
        logits(PeftModel.from_pretrained(fresh_base(tiny_path), tmp_path)), expected
    )


def test_shared_base_with_activation_checkpointing_gives_the_same_gradients(tiny_path):
    """Checkpointed blocks are recomputed in backward: the adapter of that backward's forward must
    be active then (the critic's forward leaves its adapter on until the actor's next forward)."""
    from ragen_lightning.models import enable_activation_checkpointing

    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        actor, critic, _ = build_lora_models(
            str(tiny_path),
            None,
            "float32",
            settings(shared_base=True),
            with_critic=True,
            with_reference=False,
        )
        for _, p in actor.named_parameters():
            p.data.normal_(0, 0.05) if p.requires_grad else None
        # a zero head would send zero gradients everywhere
        critic.value_head.weight.data.normal_(0, 0.1)
        if checkpointing:
            enable_activation_checkpointing(actor)
        a_params, c_params = lora.optimizer_parameters(actor, critic)
        critic_values(critic, IDS, ATT).square().sum().backward()
        actor(input_ids=IDS, attention_mask=ATT).logits.logsumexp(-1).sum().backward()
        grads.append([p.grad.clone() for p in a_params + c_params])
    assert all(g.abs().sum() > 0 for g in grads[0])
    for g0, g1 in zip(*grads):
        torch.testing.assert_close(g0, g1)


@pytest.mark.parametrize("which", ["session", pytest.param("embedded", marks=pytest.mark.slow)])
def test_qlora_nf4_base_trains_and_loss_decreases(which, tiny_path):
    """On the session model (hidden 32) and on the embedded tiny model (hidden 128, the CLI's
    ``model: tiny``)."""
    import bitsandbytes as bnb  # in the dev extra: QLoRA is tested on CPU

    from ragen_lightning.models import resolve_model_path

    path = str(tiny_path) if which == "session" else resolve_model_path("tiny")
    torch.manual_seed(0)  # LoRA A's random init
    actor, critic, _ = build_lora_models(
        path, None, "float32", settings(quantization="nf4"), with_critic=True, with_reference=False
    )
    n4 = [m for m in actor.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert n4 and all(m.weight.quant_type == "nf4" for m in n4)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in critic.modules())
    losses = train_steps(actor, critic, steps=4, lr=1e-2)
    # measured (seed 0): session model 5.947 -> 5.780, embedded model 6.896 -> 5.989, falling at
    # every step
    assert all(b < a for a, b in itertools.pairwise(losses)) and losses[-1] < losses[0] - 0.1, (
        losses
    )


def test_checkpoint_state_holds_trainable_weights_only(tiny_path):
    actor, critic, _ = build_lora_models(
        str(tiny_path), None, "float32", settings(), with_critic=True, with_reference=False
    )
    net = torch.nn.ModuleDict({"actor": actor, "critic": critic})
    kept = lora.trainable_state(net, net.state_dict())
    trainable = {n for n, p in net.named_parameters() if p.requires_grad}
    assert set(kept) == trainable and "critic.value_head.weight" in kept
    assert not any("base_layer" in k or "embed_tokens" in k for k in kept)  # no frozen base weights
    lora.check_trainable_state(net, kept)
    kept.pop("critic.value_head.bias")
    with pytest.raises(
        ConfigError, match="--ckpt_path: the checkpoint lacks 1 trainable LoRA weights"
    ):
        lora.check_trainable_state(net, kept)
