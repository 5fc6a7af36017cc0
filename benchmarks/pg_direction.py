"""Does the policy gradient point uphill, and do iterated optimizer steps keep what one step gains?

One-turn episodes of an env with per-state groups (the members of a group share the start state, so the group mean is
an exact baseline), GRPO advantages, the token-mean policy-gradient loss, no PPO clipping, KL or entropy terms. Two
measurements, both scored as the change of the mean episode score on the same fresh seeds with the same sampling
seeds (common random numbers; a random direction of the same length is the noise control):

* ``--mode step``: one batch's gradient, the model moved by ``eta`` along it (normalised) and along a random direction;
* ``--mode loop``: ``--iterations`` rollout -> advantages -> optimizer steps of ``--mini-batch`` (the trainer's
  iteration without its clipping and regularisers), evaluated every five iterations.

docs/learning.md ("SimpleSokoban, round 8") has the figures. Example:

    python benchmarks/pg_direction.py --model ~/.cache/ragen_lightning/warm-... --config /tmp/exp/sokoban_nt.yaml \
        --env-kwargs '{distance_reward: 1.0, dead_distance: 12}' --mode loop --optimizer sgd --lr 0.3
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np
import torch
import yaml

# the repository's envs package, not benchmarks/envs.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.modules.pop("envs", None)
import envs  # noqa: F401  (registers the ragen/* envs)
from ragen_lightning import models
from ragen_lightning.data.batching import build_batch
from ragen_lightning.rollout.engine import SamplingParams
from ragen_lightning.rollout.engines import HFEngine
from ragen_lightning.rollout.runner import RolloutRunner
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.tokens import ChatTokens


def rollout(model, tok, env_id, env_kwargs, episode, seeds, group_size, seed):
    engine = HFEngine(model, [tok.eos_token_id], tok.pad_token_id)
    runner = RolloutRunner(
        env_id, env_kwargs, ChatTokens(tok, enable_think=episode.enable_think), engine, episode
    )
    try:
        return runner.run(
            seeds,
            group_size,
            SamplingParams(temperature=1.0, max_new_tokens=episode.max_new_tokens),
            seed=seed,
        )
    finally:
        runner.close()


def pg_loss_backward(model, batch, adv, rows, micro=32):
    """Accumulate the gradient of the token-mean loss -A log pi over ``rows`` of ``batch``."""
    ids, mask = batch.input_ids, batch.loss_mask
    ntok = mask[rows, 1:].float().sum()
    for j in range(0, len(rows), micro):
        sl = rows[j : j + micro]
        logits = (
            model(input_ids=ids[sl], attention_mask=batch.attention_mask[sl]).logits[:, :-1].float()
        )
        lp = torch.log_softmax(logits, -1).gather(-1, ids[sl, 1:, None]).squeeze(-1)
        (-(adv[sl, None] * lp * mask[sl, 1:].float()).sum() / ntok).backward()


def grpo_batch(trajs, tok, group_size):
    batch = build_batch(trajs, pad_token_id=tok.pad_token_id, reward_placement="last")
    scores = torch.tensor([t.score for t in trajs]).view(-1, group_size)
    adv = ((scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)).view(-1)
    return batch, adv[batch.episode_index], float(scores.mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model folder (e.g. a cached warm start)")
    p.add_argument(
        "--config", required=True, help="task YAML whose data.env_id and data.episode are used"
    )
    p.add_argument("--env-kwargs", default="{}", help="YAML mapping of env keyword arguments")
    p.add_argument("--mode", choices=["step", "loop"], default="step")
    p.add_argument(
        "--groups",
        type=int,
        default=128,
        help="start states per batch (step) / per iteration (loop)",
    )
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument(
        "--eval-seeds", type=int, default=256, help="fresh start states scored (4 episodes each)"
    )
    p.add_argument("--etas", default="0.5,1,2", help="step mode: normalised step lengths")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument(
        "--adam-eps", type=float, default=1e-8, help="AdamW's eps (torch's default 1e-8)"
    )
    p.add_argument("--iterations", type=int, default=15)
    p.add_argument("--mini-batch", type=int, default=64)
    a = p.parse_args()
    torch.set_num_threads(1)
    cfg = yaml.safe_load(Path(a.config).read_text())
    episode = EpisodeSettings(**{**cfg["data"].get("episode", {}), "max_turns": 1})
    env_id, env_kwargs = cfg["data"]["env"]["id"], yaml.safe_load(a.env_kwargs) or {}
    tok, net = models.load_tokenizer(a.model), models.load_causal_lm(a.model).float()
    eval_seeds = list(range(70000, 70000 + a.eval_seeds))

    def score(model):
        return float(
            np.mean(
                [
                    t.score
                    for t in rollout(model, tok, env_id, env_kwargs, episode, eval_seeds, 4, 11)
                ]
            )
        )

    base = score(net)
    print(f"mean one-turn score of the model: {base:.4f}", flush=True)
    if a.mode == "step":
        trajs = rollout(
            net,
            tok,
            env_id,
            env_kwargs,
            episode,
            list(range(60000, 60000 + a.groups)),
            a.group_size,
            7,
        )
        batch, adv, _ = grpo_batch(trajs, tok, a.group_size)
        net.zero_grad()
        pg_loss_backward(net, batch, adv, torch.arange(len(batch)))
        grad = {n: q.grad.detach().clone() for n, q in net.named_parameters() if q.grad is not None}
        gen = torch.Generator().manual_seed(0)
        directions = {
            "gradient": grad,
            "random": {n: torch.randn(v.shape, generator=gen) for n, v in grad.items()},
        }
        for eta in (float(x) for x in a.etas.split(",")):
            for name, d in directions.items():
                norm = torch.sqrt(sum((v**2).sum() for v in d.values()))
                moved = copy.deepcopy(net)
                with torch.no_grad():
                    for n, q in moved.named_parameters():
                        if n in d:
                            q -= eta * d[n] / norm
                print(f"{name:8s} eta {eta:g}: score change {score(moved) - base:+.4f}", flush=True)
        return
    model = copy.deepcopy(net)
    opt = (
        torch.optim.AdamW(model.parameters(), lr=a.lr, eps=a.adam_eps, weight_decay=0.0)
        if a.optimizer == "adamw"
        else torch.optim.SGD(model.parameters(), lr=a.lr)
    )
    for it in range(a.iterations):
        seeds = list(range(80000 + it * a.groups, 80000 + (it + 1) * a.groups))
        batch, adv, train_score = grpo_batch(
            rollout(model, tok, env_id, env_kwargs, episode, seeds, a.group_size, 100 + it),
            tok,
            a.group_size,
        )
        order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(it))
        for i in range(0, len(batch), a.mini_batch):
            opt.zero_grad()
            pg_loss_backward(model, batch, adv, order[i : i + a.mini_batch])
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        line = f"iteration {it + 1}: training score {train_score:+.3f}"
        if (it + 1) % 5 == 0:
            line += f", score change on the fresh seeds {score(model) - base:+.4f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
