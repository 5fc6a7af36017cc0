"""5-turn SimpleSokoban episodes at temperature 0 on the Qwen2.5 stand-in, sampled by the HF engine
and by vLLM.

Run in a subprocess by ``test_qwen_standin_parity.py`` (vLLM pins torch's threads in the process
that builds it): ``python qwen_parity_script.py <stand-in folder> <out folder> <steps>``. The
random-weight stand-in is first trained briefly (``steps`` AdamW steps) on the expert demonstrations
of two levels whose expert episode plays all 5 turns, so that its greedy answers are real token
sequences of the demonstrations' format rather than a random walk over 151,936 ids. Prints
``RESULT_JSON {...}``: per engine the whole token stream of each episode, whether re-rendering its
messages through the chat template reproduces it (the drift check), turns, actions and sampled
log-probs, and the demonstrations themselves.
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import envs  # noqa: F401  (registers the env ids)
from ragen_lightning.rollout.engine import HFEngine, SamplingParams
from ragen_lightning.rollout.runner import RolloutRunner
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.tokens import ChatTokens
from ragen_lightning.rollout.vllm_engine import VLLMEngine
from ragen_lightning.sft.experts import collect_demonstrations
from ragen_lightning.sft.module import Demonstration
from ragen_lightning.sft.training import train_sft

ENV_ID = "ragen/SimpleSokoban-v0"
EPISODE = EpisodeSettings(
    max_turns=5,
    max_actions_per_turn=1,
    max_actions_per_episode=5,
    max_new_tokens=64,
    max_model_len=4096,
)
LR = 3e-3


def episodes(runner: RolloutRunner, seeds: list[int]) -> list[dict]:
    try:
        trajs = runner.run(
            seeds, 1, SamplingParams(temperature=0.0, max_new_tokens=EPISODE.max_new_tokens)
        )
    finally:
        runner.close()
    out = []
    for t in trajs:
        (sample,) = t.samples  # full context: one sample per episode
        conv = sample.conversation
        out.append(
            {
                "ids": list(conv.input_ids),
                "mask": list(conv.loss_mask),
                "drift": runner.chat.drift(conv),
                "turns": t.num_turns,
                "actions": [a for info in t.turn_info for a in info["actions"]],
                "logprobs": [lp for lp, m in zip(conv.sampled_logprobs, conv.loss_mask) if m],
            }
        )
    return out


def five_turn_demos(tok, count: int) -> tuple[list[int], list]:
    """The first ``count`` levels (reset seeds 0, 1, ...) whose expert episode plays all 5 turns,
    and their demonstration conversations."""
    seeds, convs = [], []
    candidate = 0
    while len(seeds) < count:
        (traj,) = collect_demonstrations(ENV_ID, tok, [candidate], episode=EPISODE)
        if traj.num_turns == EPISODE.max_turns:
            seeds.append(candidate)
            convs.append(traj.samples[0].conversation)
        candidate += 1
    return seeds, convs


def main(model_dir: str, out_dir: str, steps: int) -> dict:
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    actor = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    seeds, demos = five_turn_demos(tok, 2)
    losses = train_sft(
        actor,
        [Demonstration(tuple(c.input_ids), tuple(c.loss_mask)) for c in demos],
        tok.pad_token_id,
        steps=steps,
        lr=LR,
        batch_size=2,
        warmup_steps=5,
        lr_schedule="constant",
    )
    actor.eval()
    # vLLM builds its engine from a folder, then receives the trained weights
    actor.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    stop = [tok.eos_token_id]
    chat = ChatTokens(tok, enable_think=EPISODE.enable_think)
    hf = episodes(
        RolloutRunner(
            ENV_ID, None, chat, HFEngine(actor, stop, tok.pad_token_id, tokenizer=tok), EPISODE
        ),
        seeds,
    )
    vllm = episodes(
        RolloutRunner(
            ENV_ID,
            None,
            chat,
            VLLMEngine(actor, out_dir, stop, tok.pad_token_id, max_model_len=EPISODE.max_model_len),
            EPISODE,
        ),
        seeds,
    )
    return {
        "hf": hf,
        "vllm": vllm,
        "demos": [{"ids": list(c.input_ids), "drift": chat.drift(c)} for c in demos],
        "seeds": seeds,
        "losses": losses,
        "vocab": actor.config.vocab_size,
    }


if __name__ == "__main__":
    print("RESULT_JSON " + json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
