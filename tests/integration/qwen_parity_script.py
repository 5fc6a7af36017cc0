"""5-turn SimpleSokoban episodes at temperature 0 on the Qwen2.5 stand-in, sampled by the HF engine
and by vLLM.

Run in a subprocess by ``test_qwen_standin_parity.py`` (vLLM pins torch's threads in the process
that builds it): ``python qwen_parity_script.py <stand-in folder> <out folder> <steps>``. The
random-weight stand-in is first trained briefly (``steps`` AdamW steps) on the expert demonstrations
of two levels whose expert episode plays all 5 turns, so that its greedy answers are real token
sequences of the demonstrations' format rather than a random walk over 151,936 ids (the softmax of
that training spans only the ids the demonstrations use: :func:`train_on_used_rows`). Prints
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


def tie(actor, embedding: torch.nn.Embedding) -> None:
    """Make ``embedding`` the stand-in's input embedding and (tied) output head."""
    actor.set_input_embeddings(embedding)
    actor.get_output_embeddings().weight = embedding.weight
    actor.config.vocab_size = embedding.num_embeddings


def train_on_used_rows(actor, demos: list, pad_token_id: int, steps: int) -> list[float]:
    """``train_sft`` on the demonstrations with the tied embedding cut to the rows of the ids they
    use (161 of 151,936; the demonstrations' ids renumbered into them); the trained rows are
    written back into the full embedding afterwards. Returns the loss of every step.

    A step over all 151,936 rows costs ~4 s of CPU (the output head's matmuls, the dense gradient
    of the tied embedding and its AdamW update): 60 of them were ~240 of the test's ~530 s of
    CPU. Over the used rows a step is ~0.3 s (the 4 layers). The untrained rows keep their random
    init, and the greedy choice over all 151,936 rows is still a trained one: measured, from step
    50 on the greedy answers are the demonstrations' own turns, all 5 well-formed in both levels
    (step 40: 2 answers in the second level, step 45: 3 in each), so 80 steps leave a margin. The
    test's engines compute every log-prob over all 151,936 rows.
    """
    used = sorted({i for d in demos for i in d.input_ids} | {pad_token_id})
    index = {token: row for row, token in enumerate(used)}
    full = actor.get_input_embeddings()
    rows = torch.nn.Embedding.from_pretrained(full.weight[used].clone(), freeze=False)
    tie(actor, rows)
    try:
        return train_sft(
            actor,
            [
                Demonstration(tuple(index[i] for i in c.input_ids), tuple(c.loss_mask))
                for c in demos
            ],
            index[pad_token_id],
            steps=steps,
            lr=LR,
            batch_size=2,
            warmup_steps=5,
            lr_schedule="constant",
        )
    finally:
        with torch.no_grad():
            full.weight[used] = rows.weight
        tie(actor, full)


def main(model_dir: str, out_dir: str, steps: int) -> dict:
    # One op thread: with torch's default (one per core) on 2 loaded cores the tiny model's ops
    # stall on each other (the HF rollout took 12x the CPU time). vLLM keeps it: its CPU worker
    # makes torch.set_num_threads a no-op once it is built.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    actor = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    seeds, demos = five_turn_demos(tok, 2)
    losses = train_on_used_rows(actor, demos, tok.pad_token_id, steps)
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
        # the trained head is the full one again
        "vocab": actor.get_output_embeddings().weight.shape[0],
    }


if __name__ == "__main__":
    print("RESULT_JSON " + json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
