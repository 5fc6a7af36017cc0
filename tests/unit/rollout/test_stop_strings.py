"""Stop strings: the HF engine ends a request with the token that completes one (token-exact, the
same tokens as without the stop string up to there), the runner adds the episode's stop strings, and
a turn that ended on a stop string instead of the end-of-turn token still gives a drift-free
conversation."""

from __future__ import annotations

import pytest
import torch

from ragen_lightning.rollout.engine import Generation, HFEngine, SamplingParams
from ragen_lightning.rollout.runner import RolloutRunner
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.tokens import ChatTokens

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]


@pytest.fixture(scope="module")
def engine(tiny_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    with torch.no_grad():  # sharpen the random model's logits so greedy is well separated from ties
        model.model.embed_tokens.weight.mul_(8.0)
    # eos never ends a request here: the stop strings alone must
    return HFEngine(
        model,
        stop_token_ids=[-1],
        pad_token_id=tiny_tokenizer.pad_token_id,
        tokenizer=tiny_tokenizer,
    )


def first_completion(tok, ids, stop):
    """Reference: the shortest prefix of ``ids`` whose full decoded text contains a stop string
    (None: none)."""
    for k in range(1, len(ids) + 1):
        if any(s in tok.decode(ids[:k], skip_special_tokens=False) for s in stop):
            return k
    return None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_ends_with_the_token_that_completes_the_stop_string(
    engine, tiny_tokenizer, temperature
):
    tok = tiny_tokenizer
    free = engine.generate(
        PROMPTS, SamplingParams(temperature=temperature, max_new_tokens=16), seeds=[1, 2, 3]
    )
    stops = []
    # a stop string the free run completes inside its 4th..6th token, ending mid-token if it can
    for out in free:
        text5 = tok.decode(out.token_ids[:5], skip_special_tokens=False)
        text4 = tok.decode(out.token_ids[:4], skip_special_tokens=False)
        stops.append(
            text5[len(text4) - 2 : len(text4) + 1] if len(text5) > len(text4) else text5[-3:]
        )
    for out, stop in zip(free, stops):
        assert stop and len(out.token_ids) == 16 and out.finish_reason == "length"
    cut = engine.generate(
        PROMPTS,
        SamplingParams(temperature=temperature, max_new_tokens=16, stop=tuple(stops)),
        seeds=[1, 2, 3],
    )
    for f, c in zip(free, cut):
        k = first_completion(tok, f.token_ids, stops)
        assert k is not None and k <= 5
        # the same sampled tokens (and log-probs) up to and including the completing token, and
        # nothing after
        assert c.token_ids == f.token_ids[:k] and c.logprobs == pytest.approx(
            f.logprobs[:k], abs=1e-5
        )
        assert c.finish_reason == "stop"


def test_a_stop_string_never_sampled_changes_nothing(engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    free = engine.generate(PROMPTS, params, seeds=[4, 5, 6])
    same = engine.generate(
        PROMPTS,
        SamplingParams(temperature=1.0, max_new_tokens=8, stop=("\x01never\x01",)),
        seeds=[4, 5, 6],
    )
    assert [o.token_ids for o in same] == [o.token_ids for o in free]
    assert [o.finish_reason for o in same] == ["length"] * 3


def test_stop_strings_need_a_tokenizer_and_are_validated(engine, tiny_tokenizer):
    bare = HFEngine(engine.model, stop_token_ids=[tiny_tokenizer.eos_token_id], pad_token_id=0)
    with pytest.raises(ValueError, match="stop strings need the engine's tokenizer"):
        bare.generate([[1, 2]], SamplingParams(stop=("x",)))
    for bad in ("</answer>", ("",), (1,)):
        with pytest.raises(ValueError, match="stop must be a sequence of non-empty strings"):
            SamplingParams(stop=bad)  # type: ignore[arg-type]
    assert SamplingParams(stop=["a"]).stop == ("a",)


class StopAtAnswer:
    """Scripted engine: answers ``text`` (``x</think><answer>Left</answer>``), cut after the stop
    string the way an engine does (no end-of-turn token); records the params it got."""

    def __init__(self, tok, text="x</think><answer>Left</answer>"):
        self.tok, self.text, self.params = tok, text, []

    def generate(self, prompts, params, seeds=None):
        self.params.append(params)
        ids = self.tok.encode(self.text, add_special_tokens=False)
        return [Generation(list(ids), [-0.25] * len(ids), "stop") for _ in prompts]

    def sync_weights(self):
        pass


# Qwen2.5's BPE joins a letter to the ">" before it: after the primed "<think>", re-encoding
# "<think>x" gives ">x", not the sampled "x" (drift, which rollout/token_drift_rate counts; the
# trained ids are the sampled ones all the same), while " x" starts a token of its own
@pytest.mark.parametrize(
    ("tokenizer", "answer", "drifts"),
    [
        ("tiny_tokenizer", "x</think><answer>Left</answer>", False),
        ("qwen_standin_tokenizer", " x</think><answer>Left</answer>", False),
        ("qwen_standin_tokenizer", "x</think><answer>Left</answer>", True),
    ],
)
def test_runner_adds_the_episode_stop_strings_and_keeps_the_turn_token_exact(
    request, tokenizer, answer, drifts
):
    from tests.unit.rollout.test_runner import LineEnv  # noqa: F401 - registers test/Line-v0

    tok = request.getfixturevalue(tokenizer)
    engine = StopAtAnswer(tok, answer)
    runner = RolloutRunner(
        "test/Line-v0",
        None,
        ChatTokens(tok),
        engine,
        EpisodeSettings(max_turns=2, stop=("</answer>",)),
    )
    (t,) = runner.run([0], 1, SamplingParams(max_new_tokens=40, stop=("STOP",)))
    assert [p.stop for p in engine.params] == [("STOP", "</answer>")] * 2
    conv = t.samples[0].conversation
    sampled = tok.encode(answer, add_special_tokens=False)
    # each turn trains exactly the sampled ids; the end-of-turn token the template needs is glue
    # (mask 0)
    for start, end in conv.turn_spans:
        assert conv.input_ids[start:end] == sampled and all(conv.loss_mask[start:end])
    start, end = conv.turn_spans[0]
    assert conv.input_ids[end] == tok.eos_token_id and conv.loss_mask[end] == 0
    assert t.num_actions == 2 and runner.chat.drift(conv) is drifts


# -- Qwen2.5's byte-level BPE (the tiny:qwen stand-in) ---------------------------------------------
# how Qwen2.5's tokenizer splits the strings below (ids from its ranks, checked in the first test)
ANSWER = "<think>x</think><answer>Left</answer> Right Up Down"
ANSWER_IDS = [13708, 766, 28257, 522, 26865, 1784, 9217, 29, 5415, 522, 9217, 29, 10083, 3138, 6285]
NEWLINE = "Left</answer>\nUp Down"  # "</answer>" ends inside the token ">\n"
NEWLINE_IDS = [5415, 522, 9217, 397, 2324, 6285]


class Forced:
    """Adds +40 to the logit of ``script[k]`` for the k-th sampled token of every request (prompts
    of one length): the stand-in's own forward pass, sampling and stop handling, with a known
    continuation."""

    def __init__(self, model, script: list[int], prompt_len: int):
        self.script, self.prompt_len = script, prompt_len
        self.handle = model.register_forward_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs, output):
        # index of the token these logits sample
        k = kwargs["position_ids"][:, -1] + 1 - self.prompt_len
        for row, i in enumerate(k.tolist()):
            if 0 <= i < len(self.script):
                output.logits[row, -1, self.script[i]] += 40.0
        return output


@pytest.fixture(scope="module")
def qwen_engine(qwen_standin_path, qwen_standin_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(qwen_standin_path).eval()
    tok = qwen_standin_tokenizer
    return HFEngine(
        model, stop_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id, tokenizer=tok
    )


def test_qwen_splits_the_answer_tag_across_tokens(qwen_standin_tokenizer):
    tok = qwen_standin_tokenizer
    assert tok.encode(ANSWER, add_special_tokens=False) == ANSWER_IDS
    assert [tok.decode([i]) for i in ANSWER_IDS[8:12]] == ["Left", "</", "answer", ">"]
    # "</think>" ends inside "><"
    assert [tok.decode([i]) for i in ANSWER_IDS[3:6]] == ["</", "think", "><"]
    assert (
        tok.encode(NEWLINE, add_special_tokens=False) == NEWLINE_IDS and tok.decode([397]) == ">\n"
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(
    ("script", "stop", "kept"),
    [
        (ANSWER_IDS, ("</answer>",), 12),  # completed by ">", the third of "</" "answer" ">"
        (ANSWER_IDS, ("</think>",), 6),  # completed inside "><", which is kept whole as sampled
        (NEWLINE_IDS, ("</answer>",), 4),  # completed inside ">\n"
        (ANSWER_IDS, ("Up", "</think>"), 6),  # the first string completed ends the turn
    ],
)
def test_qwen_stop_strings_end_on_the_completing_token(
    qwen_engine, script, stop, kept, temperature
):
    prompts = [
        [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198],
        [151644, 872, 198, 1, 2, 3, 4, 5, 6],
    ]
    forced = Forced(qwen_engine.model, script, prompt_len=9)
    try:
        free = qwen_engine.generate(
            prompts, SamplingParams(temperature, max_new_tokens=len(script)), seeds=[1, 2]
        )
        cut = qwen_engine.generate(
            prompts,
            SamplingParams(temperature, max_new_tokens=len(script), stop=stop),
            seeds=[1, 2],
        )
    finally:
        forced.handle.remove()
    for f, c in zip(free, cut):
        assert f.token_ids == script and f.finish_reason == "length"
        # exactly the sampled ids (and their log-probs) up to and including the completing token,
        # nothing after
        assert c.token_ids == script[:kept] and c.finish_reason == "stop"
        assert c.logprobs == pytest.approx(f.logprobs[:kept], abs=1e-5)
