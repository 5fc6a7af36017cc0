import pytest
import torch

from ragen_lightning.rollout.engine import (
    Generation,
    HFEngine,
    SamplingParams,
    process_logits,
)


@pytest.fixture(scope="module")
def model(tiny_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(tiny_path)
    # random init gives near-uniform logits; sharpen them so greedy is well separated from ties
    with torch.no_grad():
        m.model.embed_tokens.weight.mul_(8.0)
    return m.train()


@pytest.fixture(scope="module")
def engine(model, tiny_tokenizer):
    return HFEngine(
        model,
        stop_token_ids=[tiny_tokenizer.eos_token_id],
        pad_token_id=tiny_tokenizer.pad_token_id,
    )


PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]


def test_greedy_matches_transformers_generate(engine, model):
    params = SamplingParams(temperature=0, max_new_tokens=6)
    model.train()
    outs = engine.generate(PROMPTS, params)
    assert model.training  # the engine restores train mode
    model.eval()
    for prompt, out in zip(PROMPTS, outs):
        ref = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=6,
            do_sample=False,
            eos_token_id=engine.stop_token_ids,
            pad_token_id=engine.pad_token_id,
        )[0, len(prompt) :]
        assert out.token_ids == ref.tolist()[: len(out.token_ids)]


def test_logprobs_are_raw_teacher_forced_logprobs(engine, model):
    out = engine.generate(
        PROMPTS[:1], SamplingParams(temperature=1.3, top_k=20, max_new_tokens=5), seeds=[3]
    )[0]
    seq = torch.tensor([PROMPTS[0] + out.token_ids])
    model.eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(seq).logits[0, :-1], -1)
    n = len(PROMPTS[0])
    expected = (
        logp[n - 1 : n - 1 + len(out.token_ids)]
        .gather(-1, torch.tensor(out.token_ids)[:, None])
        .squeeze(-1)
    )
    torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-5, rtol=0)


def test_bf16_default_dtype_keeps_fp32_logprobs(model, tiny_tokenizer):
    # Lightning's bf16-true precision makes bf16 the default dtype around the training step, where
    # rollouts run: the engine's buffers must not follow it (a bf16 log-prob buffer failed to take
    # the fp32 values)
    import copy

    bf16 = HFEngine(
        copy.deepcopy(model).to(torch.bfloat16),
        [tiny_tokenizer.eos_token_id],
        tiny_tokenizer.pad_token_id,
    )
    params = SamplingParams(temperature=0, max_new_tokens=4)
    plain = bf16.generate(PROMPTS, params)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        under_bf16 = bf16.generate(PROMPTS, params)
    finally:
        torch.set_default_dtype(previous)
    assert [g.token_ids for g in under_bf16] == [g.token_ids for g in plain]
    assert [g.logprobs for g in under_bf16] == [g.logprobs for g in plain]


def test_request_seed_gives_same_sample_whatever_the_batch(engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    alone = engine.generate([PROMPTS[2]], params, seeds=[42])[0]
    batched = engine.generate([PROMPTS[1], PROMPTS[2], PROMPTS[0]], params, seeds=[7, 42, 9])[1]
    assert alone.token_ids == batched.token_ids
    other = engine.generate([PROMPTS[2]] * 4, params, seeds=[1, 2, 3, 4])
    assert len({tuple(o.token_ids) for o in other}) > 1  # different seeds sample differently


def test_stop_token_ends_turn_and_length_cap(tiny_tokenizer, model):
    prompt = [5, 6, 7]
    model.eval()
    with torch.no_grad():
        first = int(model(torch.tensor([prompt])).logits[0, -1].argmax())
    eng = HFEngine(model, stop_token_ids=[first], pad_token_id=tiny_tokenizer.pad_token_id)
    out = eng.generate([prompt], SamplingParams(temperature=0, max_new_tokens=5))[0]
    assert out.token_ids == [first] and out.finish_reason == "stop"
    eng2 = HFEngine(model, stop_token_ids=[tiny_tokenizer.pad_token_id + 10_000], pad_token_id=0)
    out2 = eng2.generate([prompt], SamplingParams(temperature=0, max_new_tokens=3))[0]
    assert len(out2.token_ids) == 3 and out2.finish_reason == "length"


def test_process_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    k2 = process_logits(logits, SamplingParams(top_k=2))
    assert torch.isinf(k2[0, 2:]).all() and torch.isfinite(k2[0, :2]).all()
    # top_p 0.7: 0.5 alone < 0.7, 0.5+0.3 >= 0.7 -> keep the first two
    p = process_logits(logits, SamplingParams(top_p=0.7))
    assert torch.isfinite(p[0, :2]).all() and torch.isinf(p[0, 2:]).all()
    # top_p 0.5 keeps exactly the top token (its own mass reaches 0.5)
    assert torch.isfinite(process_logits(logits, SamplingParams(top_p=0.5))).sum() == 1


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_bad_sampling_params(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kwargs)


def test_bad_requests(engine):
    with pytest.raises(ValueError, match="2 seeds for 1 prompts"):
        engine.generate([[1]], SamplingParams(), seeds=[1, 2])
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], SamplingParams())
    assert isinstance(engine.generate([[1, 2]], SamplingParams(max_new_tokens=1))[0], Generation)
