"""Can the embedded model read a grid? A supervised probe outside the chat format, for FrozenLake.

    python benchmarks/grid_reading.py                       # grid only (~24 tokens): the relation is learnable
    python benchmarks/grid_reading.py --prefix 8            # the same after a fixed 273-token prefix
    python benchmarks/grid_reading.py --model tiny --steps 500   # the BPE tokenizer instead of one token per cell

Each step draws ``--batch`` fresh random maps (``ragen/FrozenLake-v0``, deterministic ice) and trains the tiny model
to continue ``"State:\\n<grid>\\n"`` (after ``--prefix`` repetitions of a fixed sentence) with ``"goal is <relation>
me."``, the first clause of the FrozenLake expert's reasoning (:func:`envs.base.relation` of goal and player). Every
``--eval-every`` steps it prints the exact-match rate of that clause under teacher forcing (argmax of every target
token) on 500 held-out maps. Reaching the goal by always stepping toward it, ignoring holes, succeeds on 86 % of
maps within RAGEN's 10-action budget (uniformly random actions: 25 %), so a model that gets this clause right has
most of a good FrozenLake policy.

The prefix is the same for every row, so it runs once per batch
(:func:`ragen_lightning.models.forward.run_on_shared_prefix`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


SUFFIX = (
    "You have 10 actions left. Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer> "
    "with no extra text. Strictly follow this format. "
)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        default="tiny:cells",
        help="an embedded model name (tiny, tiny:cells, tiny:small+cells)",
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument(
        "--prefix", type=int, default=0, help="repetitions of a 34-token sentence before the grid"
    )
    p.add_argument(
        "--suffix",
        type=int,
        default=0,
        help="repetitions of the chat format's instruction sentence "
        "(~45 tokens) between the grid and the answer, as in the real prompt",
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import gymnasium as gym
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import envs  # noqa: F401  (registers the env ids)
    from envs.base import relation
    from ragen_lightning.models.forward import run_on_shared_prefix
    from ragen_lightning.models.loading import resolve_model_path

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    path = resolve_model_path(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    env = gym.make("ragen/FrozenLake-v0", success_rate=1.0)
    filler = tok(
        "You're a helpful assistant. You are solving the FrozenLake puzzle. " * args.prefix
    )["input_ids"]

    after = tok(SUFFIX * args.suffix)["input_ids"]

    def example(seed: int) -> tuple[list[int], list[int]]:
        obs, _ = env.reset(seed=seed)
        lake = env.unwrapped
        context = filler + tok("State:\n" + obs + "\n")["input_ids"] + after
        target = tok("goal is " + relation(lake._goal, lake.player_position) + " me.")["input_ids"]
        return context, target

    def batch(seeds) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [example(int(s)) for s in seeds]
        width = max(len(c) + len(t) for c, t in rows)
        ids = torch.full((len(rows), width), tok.pad_token_id)
        trained = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, (c, t) in enumerate(rows):
            ids[i, : len(c) + len(t)] = torch.tensor(c + t)
            trained[i, len(c) : len(c) + len(t)] = True
        return ids, trained

    def logits(ids: torch.Tensor) -> torch.Tensor:
        """``[b, t - 1, V]``: position j predicts token j + 1 (zeros inside the shared prefix, never
        trained)."""
        if not filler:
            return model(input_ids=ids).logits[:, :-1]
        out = run_on_shared_prefix(model, ids, len(filler), attention_mask=None).logits
        return torch.cat([out.new_zeros(ids.shape[0], len(filler), out.shape[-1]), out], 1)[:, :-1]

    held_out = batch(range(10**6, 10**6 + 500))

    def exact_match() -> float:
        model.eval()
        with torch.no_grad():
            ids, trained = held_out
            pred, target, mask = logits(ids).argmax(-1), ids[:, 1:], trained[:, 1:]
            right = [bool((pred[i][mask[i]] == target[i][mask[i]]).all()) for i in range(len(ids))]
        model.train()
        return sum(right) / len(right)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rng = np.random.default_rng(args.seed)
    print(
        f"{args.model}: context {len(example(0)[0])} tokens, batch {args.batch}, lr {args.lr}",
        flush=True,
    )
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        ids, trained = batch(rng.integers(0, 10**6, args.batch))
        mask = trained[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits(ids)[mask], ids[:, 1:][mask])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step % args.eval_every == 0:
            print(
                f"step {step}: loss {loss.item():.3f}, held-out exact match {exact_match():.3f} "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
