"""HFEngine's prefix reuse across turns and finished-row dropping change no request's output."""

import pytest
import torch

from ragen_lightning.rollout.engine import HFEngine, SamplingParams


@pytest.fixture(scope="module")
def model(tiny_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(tiny_path)
    with torch.no_grad():  # sharpen the near-uniform random logits so samples are far from ties
        m.model.embed_tokens.weight.mul_(8.0)
    return m.eval()


def engines(model, tok, **kw):
    stop, pad = [tok.eos_token_id], tok.pad_token_id
    return HFEngine(model, stop, pad, **kw), HFEngine(model, stop, pad, prefix_cache_tokens=0, **kw)


def conversation(engine, params, turns=3, seed=0):
    """Four append-only conversations of different lengths: prompt -> sample -> append sample + a
    user block."""
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15] * 9]
    history = []
    for turn in range(turns):
        seeds = [seed + 100 * turn + i for i in range(len(prompts))]
        outs = engine.generate(prompts, params, seeds)
        history.append(outs)
        prompts = [
            p + o.token_ids + [20 + turn, 21, 22 + i] for i, (p, o) in enumerate(zip(prompts, outs))
        ]
    return history


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_reuse_gives_the_same_tokens_and_logprobs(model, tiny_tokenizer, temperature):
    reuse, plain = engines(model, tiny_tokenizer)
    params = SamplingParams(temperature=temperature, max_new_tokens=6)
    with_cache, without = conversation(reuse, params), conversation(plain, params)
    for a_turn, b_turn in zip(with_cache, without):
        for a, b in zip(a_turn, b_turn):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            torch.testing.assert_close(
                torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0
            )
    # turns 2 and 3 prefilled only the new suffix: the whole previous prompt + all sampled ids but
    # the last
    assert reuse.stats["reused_tokens"] > 0
    assert reuse.stats["prefill_tokens"] < plain.stats["prefill_tokens"]
    assert (
        reuse.stats["reused_tokens"] + reuse.stats["prefill_tokens"]
        == plain.stats["prefill_tokens"]
    )


def test_reused_prefix_is_exactly_the_previous_prompt_and_sample(model, tiny_tokenizer):
    reuse, _ = engines(model, tiny_tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    first = reuse.generate([[5, 6, 7]], params, [1])[0]
    # the last sampled id was never fed back
    assert reuse.cached_tokens == 3 + len(first.token_ids) - 1
    before = dict(reuse.stats)
    reuse.generate([[5, 6, 7] + first.token_ids + [30, 31]], params, [2])
    assert reuse.stats["reused_tokens"] - before["reused_tokens"] == 3 + len(first.token_ids) - 1
    assert reuse.stats["prefill_tokens"] - before["prefill_tokens"] == 1 + 2


def test_dropping_finished_rows_changes_no_request(model, tiny_tokenizer):
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    prompts = [[5, 6, 7], [5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15], [5, 6, 7]]
    seeds = [11, 12, 13, 14, 15]
    pad = tiny_tokenizer.pad_token_id
    never = HFEngine(model, [10_000], pad, prefix_cache_tokens=0).generate(prompts, params, seeds)
    # stop ids taken from the unstopped samples at different steps, so rows finish at different
    # steps
    stop = [never[0].token_ids[1], never[3].token_ids[6]]
    eng = HFEngine(model, stop, pad, prefix_cache_tokens=0)
    together = eng.generate(prompts, params, seeds)
    assert len({len(o.token_ids) for o in together}) > 1
    for p, s, out, full in zip(prompts, seeds, together, never):
        # a row is its unstopped sample cut at its first stop id ...
        cut = next((k + 1 for k, t in enumerate(full.token_ids) if t in stop), len(full.token_ids))
        assert out.token_ids == full.token_ids[:cut]
        assert out.finish_reason == ("stop" if out.token_ids[-1] in stop else "length")
        # ... and the same as when decoded alone
        alone = eng.generate([p], params, [s])[0]
        assert alone.token_ids == out.token_ids
        torch.testing.assert_close(
            torch.tensor(alone.logprobs), torch.tensor(out.logprobs), atol=1e-5, rtol=0
        )
        torch.testing.assert_close(
            torch.tensor(full.logprobs[:cut]), torch.tensor(out.logprobs), atol=1e-5, rtol=0
        )
    # finished rows ran no further decode steps: one row-step per sampled token, together and alone
    assert eng.stats["decode_row_steps"] == sum(len(o.token_ids) for o in together) * 2


def test_cache_eviction(model, tiny_tokenizer):
    params = SamplingParams(temperature=1.0, max_new_tokens=3)
    eng = HFEngine(
        model, [tiny_tokenizer.eos_token_id], tiny_tokenizer.pad_token_id, prefix_cache_tokens=20
    )
    a = eng.generate([[5] * 8], params, [1])[0]
    assert len(eng._cache) == 1
    # extending a request replaces its entry
    eng.generate([[5] * 8 + a.token_ids + [6]], params, [2])
    assert len(eng._cache) == 1 and eng.stats["reused_tokens"] == 8 + len(a.token_ids) - 1
    # over the token budget the oldest entries go first, and an entry alone above the budget is not
    # kept
    eng.generate([[7] * 9, [8] * 9], params, [3, 4])
    assert eng.cached_tokens <= 20
    eng.generate([[9] * 30], params, [5])
    assert eng.cached_tokens <= 20 and all(len(e.ids) < 30 for e in eng._cache.values())
    # sync_weights / clear_cache forget everything
    eng.generate([[5, 6]], params, [6])
    eng.sync_weights()
    assert eng.cached_tokens == 0
    eng.generate([[5, 6]], params, [6])
    eng.clear_cache()
    assert eng.cached_tokens == 0


def test_weight_change_invalidates_the_cache(tiny_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    eng = HFEngine(m, [tiny_tokenizer.eos_token_id], tiny_tokenizer.pad_token_id)
    params = SamplingParams(temperature=0, max_new_tokens=3)
    out = eng.generate([[5, 6, 7]], params)[0]
    assert eng.cached_tokens > 0
    with torch.no_grad():
        m.model.embed_tokens.weight.mul_(3.0)  # an optimizer step is an in-place update too
    before = eng.stats["reused_tokens"]
    eng.generate([[5, 6, 7] + out.token_ids + [8]], params)
    assert eng.stats["reused_tokens"] == before  # stale keys/values were not reused


def test_runner_clears_the_cache_around_a_rollout(tiny_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    import envs  # noqa: F401  (registers the project's envs)
    from ragen_lightning.rollout.runner import RolloutRunner
    from ragen_lightning.rollout.settings import EpisodeSettings
    from ragen_lightning.rollout.tokens import ChatTokens

    m = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    eng = HFEngine(m, [tiny_tokenizer.eos_token_id], tiny_tokenizer.pad_token_id)
    runner = RolloutRunner(
        "ragen/SimpleSokoban-v0",
        None,
        ChatTokens(tiny_tokenizer),
        eng,
        EpisodeSettings(max_turns=3, max_model_len=4096),
    )
    trajs = runner.run([0, 1], 2, SamplingParams(temperature=1.0, max_new_tokens=8), seed=3)
    assert len(trajs) == 4 and eng.cached_tokens == 0
    assert sum(t.num_turns for t in trajs) <= 4 or eng.stats["reused_tokens"] > 0


def test_reuse_on_the_qwen_standin_gives_the_same_tokens_and_logprobs(
    qwen_standin_path, qwen_standin_tokenizer
):
    """The same multi-turn equivalence on ``tiny:qwen``: Qwen2.5's chat-template ids, its
    151,936-row vocabulary, and turns ended by ``<|im_end|>`` or the length cap."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(qwen_standin_path).eval()
    tok = qwen_standin_tokenizer
    reuse, plain = engines(model, tok)
    params = SamplingParams(temperature=1.0, max_new_tokens=5)
    user = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
        )
        for text in ("hi", "Push the box left.", "你好", "#_OX__#")
    ]
    runs = []
    for engine in (reuse, plain):
        prompts, history = [list(u) for u in user], []
        for turn in range(3):
            outs = engine.generate(prompts, params, [100 * turn + i for i in range(len(prompts))])
            history.append(outs)
            follow = tok.encode(
                f"<|im_end|>\n<|im_start|>user\nturn {turn}<|im_end|>\n<|im_start|>assistant\n"
            )
            prompts = [p + o.token_ids + follow for p, o in zip(prompts, outs)]
        runs.append(history)
    for a_turn, b_turn in zip(*runs):
        for a, b in zip(a_turn, b_turn):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            torch.testing.assert_close(
                torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0
            )
    # ids beyond the tiny vocabulary
    assert max(t for turn in runs[0] for o in turn for t in o.token_ids) > 1024
    assert reuse.stats["reused_tokens"] > 0
    assert (
        reuse.stats["reused_tokens"] + reuse.stats["prefill_tokens"]
        == plain.stats["prefill_tokens"]
    )
