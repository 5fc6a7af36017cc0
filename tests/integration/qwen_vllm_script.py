"""Run by ``test_qwen_standin_vllm.py`` in a subprocess (vLLM takes over torch threading in its process).

``python tests/integration/qwen_vllm_script.py MODEL_DIR`` builds the vLLM engine and the HF engine on the ``tiny:qwen``
stand-in and prints one JSON line:

- ``greedy``: HF and vLLM greedy ids and log-probs for chat-template prompts, after the embeddings were sharpened
  (greedy choices far from ties) and pushed to vLLM;
- ``stop``: per alphabet, vLLM sampling only ``</`` ``answer`` ``>`` (or ``>\n``, where the stop string ends
  inside a token) with seeds, with and without the stop string ``</answer>``; the HF engine forced to vLLM's free ids
  with the stop string; the reference length (the shortest free prefix whose text holds it);
- ``turns``: a 3-turn conversation with vLLM's prefix cache kept across turns and with it reset before every turn.
"""

from __future__ import annotations

import contextlib
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ragen_lightning.rollout.engine import HFEngine, SamplingParams
from ragen_lightning.rollout.vllm_engine import VLLMEngine, VLLMSettings

TEXTS = (
    "hi",
    "Push the box left.",
    "你好，世界",
    "#_OX__#\n#__P__#",
    "Answer with <answer>Up</answer>.",
    "1 2 3",
    "Left || Right",
    "emoji 😀",
)


STOP = "</answer>"
# Qwen2.5 spells "</answer>" "</" "answer" ">"; with ">\n" in place of ">" the string ends inside a
# token
ALPHABETS = {"split": [522, 9217, 29], "inside": [522, 9217, 397]}


@contextlib.contextmanager
def allowed_tokens(ids: list[int]):
    """vLLM samples only ``ids`` (its ``allowed_token_ids``) in requests built by
    VLLMEngine.generate meanwhile, with a frequency penalty against the random tied-embedding
    model's habit of repeating its last token."""
    import vllm

    original = vllm.SamplingParams
    vllm.SamplingParams = lambda **kw: original(**kw, allowed_token_ids=ids, frequency_penalty=1.0)
    try:
        yield
    finally:
        vllm.SamplingParams = original


class Forced:
    """Makes the HF engine sample ``script`` after a prompt of ``prompt_len`` ids (one request at a
    time)."""

    def __init__(self, model, script: list[int], prompt_len: int):
        self.script, self.prompt_len = script, prompt_len
        self.handle = model.register_forward_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs, output):
        k = int(kwargs["position_ids"][0, -1]) + 1 - self.prompt_len
        if 0 <= k < len(self.script):
            output.logits[0, -1, self.script[k]] += 1e4
        return output


def stop_case(tok, vllm, hf, prompts, alphabet: list[int]) -> dict:
    """vLLM samples from ``alphabet`` (seeded) with and without the stop string; the HF engine is
    forced to the same free ids and stops on its own."""
    free_params = SamplingParams(temperature=1.0, max_new_tokens=16)
    stop_params = SamplingParams(temperature=1.0, max_new_tokens=16, stop=(STOP,))
    seeds = list(range(len(prompts)))
    with allowed_tokens(alphabet):
        free, cut = (
            vllm.generate(prompts, free_params, seeds),
            vllm.generate(prompts, stop_params, seeds),
        )
    hf_cut = []
    for prompt, f in zip(prompts, free):
        forced = Forced(hf.model, f.token_ids, len(prompt))
        try:
            hf_cut.append(hf.generate([prompt], stop_params)[0])
        finally:
            forced.handle.remove()
    reference = [
        next(
            (k for k in range(1, len(f.token_ids) + 1) if STOP in tok.decode(f.token_ids[:k])), None
        )
        for f in free
    ]
    return {
        "free": [g.token_ids for g in free],
        "reference_lengths": reference,
        "vllm": [g.token_ids for g in cut],
        "vllm_finish": [g.finish_reason for g in cut],
        "vllm_logprobs": [g.logprobs for g in cut],
        "free_logprobs": [g.logprobs for g in free],
        "hf": [g.token_ids for g in hf_cut],
        "hf_finish": [g.finish_reason for g in hf_cut],
    }


def main(model_dir: str) -> dict:
    # One op thread: with torch's default (one per core) on 2 loaded cores the tiny model's ops
    # stall on each other (the stop cases took 5x the CPU time). vLLM keeps it: its CPU worker
    # makes torch.set_num_threads a no-op once it is built.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    actor = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    vllm = VLLMEngine(
        actor,
        model_dir,
        [tok.eos_token_id],
        tok.pad_token_id,
        VLLMSettings(probe_size=0),
        max_model_len=1024,
        max_batch_size=8,
    )
    hf = HFEngine(actor, [tok.eos_token_id], tok.pad_token_id, tokenizer=tok)
    prompts = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
            )
        )
        for t in TEXTS
    ]
    stop = {name: stop_case(tok, vllm, hf, prompts, ids) for name, ids in ALPHABETS.items()}

    with torch.no_grad():  # sharpened: greedy choices far from ties
        actor.get_input_embeddings().weight.mul_(8.0)
    sync = vllm.sync_weights()
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    hf_g, vl_g = hf.generate(prompts, greedy), vllm.generate(prompts, greedy)

    follow = [
        tok.encode(f"<|im_end|>\n<|im_start|>user\nturn {t}<|im_end|>\n<|im_start|>assistant\n")
        for t in range(3)
    ]
    sampled = SamplingParams(temperature=1.0, max_new_tokens=8)
    turns = {}
    for mode in ("cached", "reset"):
        history, current = [], [list(p) for p in prompts]
        for t in range(3):
            if mode == "reset":
                vllm.llm.reset_prefix_cache()
            outs = vllm.generate(current, sampled, [100 * t + i for i in range(len(current))])
            history.append([[o.token_ids, o.logprobs] for o in outs])
            current = [p + o.token_ids + follow[t] for p, o in zip(current, outs)]
        turns[mode] = history
    cache_config = vllm.llm.llm_engine.vllm_config.cache_config
    return {
        "sync": sync,
        "vocab_size": vllm.vocab_size,
        "prefix_caching": bool(cache_config.enable_prefix_caching),
        "greedy": {
            "hf": [g.token_ids for g in hf_g],
            "vllm": [g.token_ids for g in vl_g],
            "hf_logprobs": [g.logprobs for g in hf_g],
            "vllm_logprobs": [g.logprobs for g in vl_g],
        },
        "stop": stop,
        "turns": turns,
    }


if __name__ == "__main__":
    print("RESULT_JSON " + json.dumps(main(sys.argv[1])), flush=True)
