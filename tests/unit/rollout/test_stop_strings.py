"""Stop strings: the HF engine ends a request with the token that completes one (token-exact, the same tokens as
without the stop string up to there), the runner adds the episode's stop strings, and a turn that ended on a stop
string instead of the end-of-turn token still gives a drift-free conversation."""

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
    return HFEngine(model, stop_token_ids=[-1], pad_token_id=tiny_tokenizer.pad_token_id, tokenizer=tiny_tokenizer)


def first_completion(tok, ids, stop):
    """Reference: the shortest prefix of ``ids`` whose full decoded text contains a stop string (None: none)."""
    for k in range(1, len(ids) + 1):
        if any(s in tok.decode(ids[:k], skip_special_tokens=False) for s in stop):
            return k
    return None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_ends_with_the_token_that_completes_the_stop_string(engine, tiny_tokenizer, temperature):
    tok = tiny_tokenizer
    free = engine.generate(PROMPTS, SamplingParams(temperature=temperature, max_new_tokens=16), seeds=[1, 2, 3])
    stops = []
    for out in free:  # a stop string the free run completes inside its 4th..6th token, ending mid-token if it can
        text5 = tok.decode(out.token_ids[:5], skip_special_tokens=False)
        text4 = tok.decode(out.token_ids[:4], skip_special_tokens=False)
        stops.append(text5[len(text4) - 2: len(text4) + 1] if len(text5) > len(text4) else text5[-3:])
    for out, stop in zip(free, stops):
        assert stop and len(out.token_ids) == 16 and out.finish_reason == "length"
    cut = engine.generate(PROMPTS, SamplingParams(temperature=temperature, max_new_tokens=16, stop=tuple(stops)),
                          seeds=[1, 2, 3])
    for f, c in zip(free, cut):
        k = first_completion(tok, f.token_ids, stops)
        assert k is not None and k <= 5
        # the same sampled tokens (and log-probs) up to and including the completing token, and nothing after
        assert c.token_ids == f.token_ids[:k] and c.logprobs == pytest.approx(f.logprobs[:k], abs=1e-5)
        assert c.finish_reason == "stop"


def test_a_stop_string_never_sampled_changes_nothing(engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    free = engine.generate(PROMPTS, params, seeds=[4, 5, 6])
    same = engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=8, stop=("\x01never\x01",)),
                           seeds=[4, 5, 6])
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
    """Scripted engine: answers ``x</think><answer>Left</answer>`` and then garbage, cut after the stop string
    the way an engine does (no end-of-turn token); records the params it got."""

    def __init__(self, tok):
        self.tok, self.params = tok, []

    def generate(self, prompts, params, seeds=None):
        self.params.append(params)
        ids = self.tok.encode("x</think><answer>Left</answer>", add_special_tokens=False)
        return [Generation(list(ids), [-0.25] * len(ids), "stop") for _ in prompts]

    def sync_weights(self):
        pass


def test_runner_adds_the_episode_stop_strings_and_keeps_the_turn_token_exact(tiny_tokenizer):
    from tests.unit.rollout.test_runner import LineEnv  # noqa: F401 - registers test/Line-v0

    engine = StopAtAnswer(tiny_tokenizer)
    runner = RolloutRunner("test/Line-v0", None, ChatTokens(tiny_tokenizer), engine,
                           EpisodeSettings(max_turns=2, stop=("</answer>",)))
    (t,) = runner.run([0], 1, SamplingParams(max_new_tokens=40, stop=("STOP",)))
    assert [p.stop for p in engine.params] == [("STOP", "</answer>")] * 2
    conv = t.samples[0].conversation
    sampled = tiny_tokenizer.encode("x</think><answer>Left</answer>", add_special_tokens=False)
    # each turn trains exactly the sampled ids; the end-of-turn token the template needs is glue (mask 0)
    for start, end in conv.turn_spans:
        assert conv.input_ids[start:end] == sampled and all(conv.loss_mask[start:end])
    start, end = conv.turn_spans[0]
    assert conv.input_ids[end] == tiny_tokenizer.eos_token_id and conv.loss_mask[end] == 0
    assert t.num_actions == 2 and not runner.chat.drift(conv)
