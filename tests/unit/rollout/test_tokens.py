import pytest

from ragen_lightning.rollout.tokens import ChatTokens


@pytest.fixture()
def ct(tiny_tokenizer):
    return ChatTokens(tiny_tokenizer)


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_stored_ids_are_what_engine_saw_and_sampled(ct, tiny_tokenizer):
    tok = tiny_tokenizer
    conv = ct.start("sys", "Turn 1")
    prompt = list(conv.input_ids)
    # the first prompt is exactly the chat template with generation prompt, plus the <think> prefix
    expected = tok.apply_chat_template(
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "Turn 1"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    ) + [tok.convert_tokens_to_ids("<think>")]
    assert prompt == expected
    sampled = _ids(tok, "go</think><answer>Up</answer>") + [tok.eos_token_id]
    text = ct.add_response(conv, sampled, logprobs=[-1.0] * len(sampled))
    assert text == "go</think><answer>Up</answer>"
    assert conv.input_ids == prompt + sampled
    # loss mask covers exactly the sampled tokens, log-probs sit on them
    assert conv.loss_mask == [0] * len(prompt) + [1] * len(sampled)
    assert conv.sampled_logprobs == [0.0] * len(prompt) + [-1.0] * len(sampled)
    assert conv.turn_spans == [(len(prompt), len(prompt) + len(sampled))]


def test_multi_turn_mask_and_roundtrip_without_drift(ct, tiny_tokenizer):
    tok = tiny_tokenizer
    conv = ct.start("sys", "Turn 1")
    s1 = _ids(tok, "a</think><answer>Up</answer>") + [tok.eos_token_id]
    ct.add_response(conv, s1)
    ct.add_user(conv, "Reward:\n-0.1\nTurn 2")
    s2 = _ids(tok, "b</think><answer>Left</answer>") + [tok.eos_token_id]
    ct.add_response(conv, s2)
    assert sum(conv.loss_mask) == len(s1) + len(s2)
    (a0, a1), (b0, b1) = conv.turn_spans
    assert conv.input_ids[a0:a1] == s1 and conv.input_ids[b0:b1] == s2
    # template + user tokens between turns are not trained
    assert all(m == 0 for m in conv.loss_mask[a1:b0])
    # canonical samples re-render to the same ids through the chat template
    assert not ct.drift(conv)
    assert conv.messages[-1] == {
        "role": "assistant",
        "content": "<think>b</think><answer>Left</answer>",
    }


def test_turn_without_eos_gets_template_close_untrained(ct, tiny_tokenizer):
    tok = tiny_tokenizer
    conv = ct.start("sys", "Turn 1")
    s1 = _ids(tok, "cut off mid")  # hit the length cap: no eos sampled
    ct.add_response(conv, s1)
    assert not conv.ended_with_eos
    n = len(conv)
    ct.add_user(conv, "Turn 2")
    glue = conv.input_ids[n:]
    assert glue[0] == tok.eos_token_id and all(m == 0 for m in conv.loss_mask[n:])
    assert not ct.drift(conv)


def test_drift_detects_non_canonical_sampled_split(ct, tiny_tokenizer):
    tok = tiny_tokenizer
    conv = ct.start("sys", "Turn 1")
    canonical = _ids(tok, "assistant")
    assert len(canonical) < len("assistant")  # the corpus taught merges for this word
    # the same text sampled one character per token: same decoded text, different ids
    chars = [tok.convert_tokens_to_ids(c) for c in "assistant"]
    ct.add_response(conv, chars + [tok.eos_token_id])
    assert ct.drift(conv)


def test_template_without_chat_template_is_rejected(tiny_tokenizer):
    class NoTemplate:
        chat_template = None
        name_or_path = "bare"

    with pytest.raises(ValueError, match="no chat template"):
        ChatTokens(NoTemplate())


def test_logprob_length_mismatch_is_an_error(ct, tiny_tokenizer):
    conv = ct.start("sys", "u")
    with pytest.raises(ValueError, match="2 logprobs for 1 sampled"):
        ct.add_response(conv, [tiny_tokenizer.eos_token_id], logprobs=[0.0, 0.0])
