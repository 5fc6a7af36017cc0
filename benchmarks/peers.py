"""The update (and a single-turn iteration) of this project against TRL's GRPOTrainer, same model,
batch and settings.

    python benchmarks/peers.py                                   # both comparisons, printed as markdown tables
    python benchmarks/peers.py --part update --rows 32 --prompt-len 256 --completion-len 64
    --repeats 5 python benchmarks/peers.py --part iteration --num-groups 4 --group-size 8
    --iterations 3

Needs the ``bench`` extra (``pip install -e ".[bench]"``: trl). Runs on CPU (or CUDA with ``--device
cuda``).

**update**: one fixed batch of ``--rows`` rows (``--group-size`` rows per prompt; prompts are the
embedded tiny model's chat template around Bandit first turns, ``--prompt-len`` tokens; completions
``--completion-len`` random tokens, all the same length so that neither side pads) with GRPO
advantages from fixed random rewards, trained by

* this project: ``StarPOModule.training_step`` under a Lightning ``Trainer`` (everything the
  iteration's step 2-5 runs: on-policy scoring folded into the update, advantages, the actor's
  micro-batches, clip, AdamW step), timed by the module's own ``timing_s/update``;
* TRL: ``GRPOTrainer.compute_loss`` + backward over the same micro-batches, then clip and the
  optimizer step (what ``GRPOTrainer.training_step`` runs after ``_prepare_inputs`` has generated;
  generation is excluded).

The settings that make the two the same update (TRL's defaults are bf16 and gradient checkpointing,
and ``weight_decay`` 0): TRL ``GRPOConfig(bf16=False, gradient_checkpointing=False, loss_type="dapo"
(default: token mean over the whole batch), beta=0.0, epsilon=0.2, learning_rate=--lr,
max_grad_norm=1.0, weight_decay=0.0, per_device_train_batch_size=--micro-batch, num_iterations=1)``;
this project ``advantage.estimator="grpo", loss.agg_mode="token-mean",
loss.clip_low=loss.clip_high=0.2, loss.dual_clip=None, loss.entropy_coeff=0, optim.actor_lr=--lr,
optim.grad_clip=1.0, optim.weight_decay=0.0, update.mini_batch_size=--rows,
update.micro_batch_size=--micro-batch, update.ppo_epochs=1``, fp32, no KL, no critic, the same torch
thread count (``--check`` takes one step of each from the same weights and prints how far apart they
land). Two more rows: this project's CPU configuration (``update.micro_batch_threads 2``, one torch
thread per micro-batch) and TRL with one torch thread. The runs are interleaved (each row's steps in
turn, repeated), so a busy machine slows all alike; the first step of each is a warm-up and is not
counted. Trained tokens = completion tokens; the ratios are against TRL at ``--threads``.

**iteration**: a whole single-turn iteration on Bandit: generate ``--num-groups x --group-size``
answers of at most ``--completion-len`` tokens at temperature 1, reward them with the env, one GRPO
update over them (micro-batches of ``--micro-batch``). This project: ``RolloutDataModule`` (HF
engine) + ``StarPOModule``; TRL: ``GRPOTrainer.train`` with a reward function that runs the same
Bandit env on the parsed answer. Seconds per iteration (the mean over ``--iterations`` after the
first).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENV = "ragen/Bandit-v0"


def tiny_model(name: str) -> str:
    from ragen_lightning import models

    return models.resolve_model_path(name)


def first_turn_messages(tokenizer, seeds: list[int], episode) -> list[list[dict[str, str]]]:
    """The chat messages of each seed's first Bandit turn, exactly as the rollout runner builds
    them."""
    import envs  # noqa: F401
    from ragen_lightning.rollout.engine import Generation
    from ragen_lightning.rollout.runner import RolloutRunner
    from ragen_lightning.rollout.tokens import ChatTokens

    class Recorder:
        needs_messages = True

        def __init__(self):
            self.messages = []

        def generate(self, prompts, params, seeds=None, messages=None):
            self.messages.extend(messages)
            return [Generation([tokenizer.eos_token_id], [0.0], "stop") for _ in prompts]

        def sync_weights(self):
            return None

    rec = Recorder()
    runner = RolloutRunner(ENV, None, ChatTokens(tokenizer), rec, episode)
    from ragen_lightning.rollout.engine import SamplingParams

    runner.run(seeds, 1, SamplingParams(max_new_tokens=episode.max_new_tokens))
    runner.close()
    return rec.messages


# -- part 1: the update on one fixed batch ---------------------------------------------------------
def fixed_batch(
    tokenizer,
    rows: int,
    group_size: int,
    prompt_len: int,
    completion_len: int,
    seed: int = 0,
    distinct: bool = False,
    varied: bool = False,
):
    """``(RolloutBatch, trl_inputs)`` holding the same rows: prompt + completion ids, GRPO
    advantages of random rewards (the project computes them itself from the scores; TRL gets them
    precomputed, as its ``_generate_and_score_completions`` would). The rows of a group share their
    prompt (GRPO's case), unless ``distinct``: then every row's prompt differs from its first token
    on (no shared prefix to run once).

    ``varied``: lengths vary as in a rollout: each prompt keeps its last ``prompt_len / 2 ..
    prompt_len`` tokens (per row when ``distinct``, else per group) and each completion ends (eos)
    after ``completion_len / 4 .. completion_len`` tokens. This project gets the rows right-padded;
    TRL gets what its generation step hands its loss: prompts left-padded and completions
    right-padded to the batch's longest, with their masks."""
    from ragen_lightning.rollout.settings import EpisodeSettings
    from ragen_lightning.types import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    groups = rows // group_size
    messages = first_turn_messages(tokenizer, list(range(groups)), EpisodeSettings(max_turns=1))
    prompts = []
    for m in messages:
        ids = tokenizer.apply_chat_template(
            m, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        ids = (list(ids) * (prompt_len // len(ids) + 1))[-prompt_len:]  # exactly prompt_len tokens
        prompts.extend([ids] * group_size)
    prompt = torch.tensor(prompts)
    completion = torch.randint(10, len(tokenizer) - 1, (rows, completion_len), generator=g)
    if varied:
        p_len = torch.randint(
            prompt_len // 2, prompt_len + 1, (rows if distinct else groups,), generator=g
        )
        p_len = p_len if distinct else p_len.repeat_interleave(group_size)
        c_len = torch.randint(max(completion_len // 4, 1), completion_len + 1, (rows,), generator=g)
    else:
        p_len, c_len = torch.full((rows,), prompt_len), torch.full((rows,), completion_len)
    first = prompt_len - p_len  # a row's prompt is prompt[first:]
    if distinct:  # a different first token per row: no two rows share a prefix
        prompt[torch.arange(rows), first] = (
            torch.randperm(len(tokenizer) - 20, generator=g)[:rows] + 10
        )
    completion[torch.arange(rows), c_len - 1] = tokenizer.eos_token_id
    scores = torch.randint(0, 2, (rows,), generator=g).float()
    group = torch.arange(rows) // group_size
    grouped = scores.view(groups, group_size)
    adv = (
        (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)
    ).flatten()
    n = p_len + c_len
    T = int(n.max())
    ids = torch.full((rows, T), tokenizer.pad_token_id or 0)
    att = torch.zeros(rows, T, dtype=torch.long)
    loss_mask = torch.zeros(rows, T, dtype=torch.long)
    rewards = torch.zeros(rows, T)
    turn_ends = torch.zeros(rows, T, dtype=torch.bool)
    for i in range(rows):
        p, c = int(p_len[i]), int(c_len[i])
        ids[i, : p + c] = torch.cat([prompt[i, int(first[i]) :], completion[i, :c]])
        att[i, : p + c] = 1
        loss_mask[i, p : p + c] = 1
        rewards[i, p + c - 1] = scores[i]
        turn_ends[i, p + c - 1] = True
    batch = RolloutBatch(
        ids,
        att,
        loss_mask,
        rewards,
        turn_ends,
        torch.zeros(rows, T),
        scores,
        group,
        torch.arange(rows),
        metrics={},
    )
    P, C = int(p_len.max()), int(c_len.max())
    prompt_mask = (torch.arange(P)[None] >= P - p_len[:, None]).long()  # left-padded
    completion_mask = (torch.arange(C)[None] < c_len[:, None]).long()  # right-padded
    trl_prompt = torch.where(
        prompt_mask.bool(), prompt[:, prompt_len - P :], tokenizer.pad_token_id or 0
    )
    trl_completion = torch.where(
        completion_mask.bool(), completion[:, :C], tokenizer.pad_token_id or 0
    )
    trl_inputs = {
        "prompt_ids": trl_prompt,
        "prompt_mask": prompt_mask,
        "completion_ids": trl_completion,
        "completion_mask": completion_mask,
        "advantages": adv,
        "num_items_in_batch": torch.tensor(float(c_len.sum())),
    }
    return batch, trl_inputs


def project_settings(a, micro_batch_threads: int, **update) -> dict:
    """``StarPOModule``'s settings groups for the update TRL's ``trl_config`` makes (``update``:
    more ``--model.update.*`` settings, e.g. a token budget)."""
    return {
        "advantage": {"estimator": "grpo"},
        "loss": {
            "agg_mode": "token-mean",
            "clip_low": 0.2,
            "clip_high": 0.2,
            "dual_clip": None,
            "entropy_coeff": 0.0,
        },
        "optim": {"actor_lr": a.lr, "grad_clip": 1.0, "weight_decay": 0.0},
        "update": {
            "mini_batch_size": a.rows,
            "micro_batch_size": a.micro_batch,
            "ppo_epochs": 1,
            "micro_batch_threads": micro_batch_threads,
            **update,
        },
    }


class _Times:
    """Collects the module's ``timing_s/update`` of every iteration."""

    def __init__(self):
        from lightning.pytorch.callbacks import Callback

        times = self.times = []

        class Cb(Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                times.append(pl_module.last_logs.get("timing_s/update"))

        self.callback = Cb()


def project_update_runner(a, path: str, batch, threads: int, **update):
    """A closure running ``n`` iterations of the project's update on ``batch``; returns their update
    seconds."""
    import lightning as L
    from torch.utils.data import DataLoader

    from ragen_lightning.starpo.module import StarPOModule

    class FixedBatches(L.LightningDataModule):
        def __init__(self, n: int):
            super().__init__()
            self.save_hyperparameters({"group_size": a.group_size})
            self.n = n

        def train_dataloader(self):
            return DataLoader([batch] * self.n, batch_size=None, collate_fn=lambda b: b)

    module = StarPOModule(model=path, **project_settings(a, micro_batch_threads=threads, **update))

    def run(n: int, torch_threads: int) -> list[float]:
        torch.set_num_threads(torch_threads)
        times = _Times()
        trainer = L.Trainer(
            accelerator=a.device,
            devices=1,
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            callbacks=[times.callback],
            default_root_dir="/tmp/peers-bench",
        )
        trainer.fit(module, FixedBatches(n))
        return times.times

    run.actor = lambda: module.actor
    run.grad_norm = lambda: module.last_logs.get("actor/grad_norm")
    return run


def trl_config(a, out: str, **extra):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=out,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        loss_type="dapo",
        beta=0.0,
        epsilon=0.2,
        learning_rate=a.lr,
        max_grad_norm=1.0,
        weight_decay=0.0,
        per_device_train_batch_size=a.micro_batch,
        num_iterations=1,
        use_cpu=a.device == "cpu",
        report_to=[],
        logging_steps=10**9,
        save_strategy="no",
        disable_tqdm=True,
        **extra,
    )


def trl_update_runner(a, path: str, inputs):
    """A closure running ``n`` TRL GRPO updates on ``inputs`` (micro-batches of ``--micro-batch``
    rows)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=trl_config(a, "/tmp/peers-bench/trl", num_generations=a.group_size),
        train_dataset=Dataset.from_dict({"prompt": ["x"] * a.rows}),
        processing_class=tokenizer,
    )
    trainer.create_optimizer()
    # set by Trainer.train; the normaliser is the whole batch's
    trainer.current_gradient_accumulation_steps = 1
    model, opt = trainer.model.to(a.device), trainer.optimizer
    model.train()
    inputs = {k: v.to(a.device) for k, v in inputs.items()}

    def run(n: int, torch_threads: int) -> list[float]:
        torch.set_num_threads(torch_threads)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            for start in range(0, a.rows, a.micro_batch):
                micro = {
                    k: (v[start : start + a.micro_batch] if v.dim() else v)
                    for k, v in inputs.items()
                }
                trainer.compute_loss(model, micro).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        return times

    norms: list[float] = []
    run.actor = lambda: model
    run.grad_norm = lambda: norms[-1]
    return run


def check_same_update(a) -> tuple[float, float, float]:
    """One step of each side from the same weights on the same batch at ``--lr``: the largest
    difference of their parameter changes in units of the learning rate, and both gradient norms
    before clipping. Adam's first step moves every weight by about ``lr`` in the direction of its
    gradient's sign, so gradients pointing elsewhere show up as differences of order 1; its size
    does not depend on the gradient's scale, which the norms compare."""
    from ragen_lightning import models

    path = tiny_model(a.model)
    batch, inputs = fixed_batch(
        models.load_tokenizer(path),
        a.rows,
        a.group_size,
        a.prompt_len,
        a.completion_len,
        distinct=a.prompts == "distinct",
        varied=a.lengths == "varied",
    )
    ours, trl = (
        project_update_runner(a, path, batch, 1, **a.update),
        trl_update_runner(a, path, inputs),
    )
    before = {k: v.detach().clone() for k, v in trl.actor().state_dict().items()}
    ours(1, a.threads)
    trl(1, a.threads)
    mine, theirs = ours.actor().state_dict(), trl.actor().state_dict()
    diff = (
        max(float(((mine[k] - v) - (theirs[k] - v)).abs().max()) for k, v in before.items()) / a.lr
    )
    return diff, float(ours.grad_norm()), trl.grad_norm()


def compare_update(a) -> None:
    from ragen_lightning import models

    path = tiny_model(a.model)
    tokenizer = models.load_tokenizer(path)
    batch, inputs = fixed_batch(
        tokenizer,
        a.rows,
        a.group_size,
        a.prompt_len,
        a.completion_len,
        distinct=a.prompts == "distinct",
        varied=a.lengths == "varied",
    )
    trl = trl_update_runner(a, path, inputs)
    # the memory of a micro-batch of full-length rows
    budget = a.micro_batch * (a.prompt_len + a.completion_len)
    runs = {
        "this project": (project_update_runner(a, path, batch, 1), a.threads),
        "TRL GRPOTrainer": (trl, a.threads),
        f"this project, micro_batch_tokens {budget}": (
            project_update_runner(a, path, batch, 1, micro_batch_tokens=budget),
            a.threads,
        ),
        f"this project, micro_batch_tokens {budget}, pack": (
            project_update_runner(a, path, batch, 1, micro_batch_tokens=budget, pack=True),
            a.threads,
        ),
        "this project, micro_batch_threads 2 (torch threads 1 each)": (
            project_update_runner(a, path, batch, 2),
            1,
        ),
        "TRL GRPOTrainer, torch threads 1": (trl, 1),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for run, threads in runs.values():  # warm-up
        run(1, threads)
    for _ in range(a.repeats):
        for name, (run, threads) in runs.items():
            times[name] += run(a.steps, threads)
    tokens = int(inputs["num_items_in_batch"])
    base, ours = (
        statistics.median(times["TRL GRPOTrainer"]),
        statistics.median(times["this project"]),
    )
    shape = (
        f"({a.prompt_len} prompt + {a.completion_len} trained tokens)"
        if a.lengths == "equal"
        else f"({a.prompt_len // 2}-{a.prompt_len} prompt + {max(a.completion_len // 4, 1)}-{a.completion_len} trained "
        f"tokens; {tokens} trained, {int(batch.attention_mask.sum())} real of {batch.attention_mask.numel()})"
    )
    print(
        f"\n### Update: {a.rows} rows x {shape}, prompts {a.prompts}, micro-batch {a.micro_batch}, model {a.model}, "
        f"{a.device}, torch threads {a.threads}, {a.repeats} x {a.steps} steps\n"
    )
    print(
        "| | s / update (median) | trained tokens/s | vs TRL | vs this project's default |\n|---|---:|---:|---:|---:|"
    )
    for name, ts in times.items():
        med = statistics.median(ts)
        print(
            f"| {name} | {med:.3f} (min {min(ts):.3f}, max {max(ts):.3f}) | {tokens / med:,.0f} | {base / med:.2f}x "
            f"| {ours / med:.2f}x |"
        )


# -- part 2: a single-turn iteration ---------------------------------------------------------------
def bandit_reward(seed_of: dict[str, int]):
    """TRL reward function: the Bandit env (reset with the prompt's seed) stepped with the parsed
    answer; the format penalty of a turn without a valid action, as this project's rollout charges
    it."""
    import envs  # noqa: F401
    from ragen_lightning.rollout import prompting
    from ragen_lightning.rollout.runner import make_env

    env = make_env(ENV)

    def reward(prompts, completions, **kw):
        out = []
        for p, c in zip(prompts, completions):
            text = c[0]["content"] if isinstance(c, list) else c
            env.reset(seed=seed_of[p[-1]["content"] if isinstance(p, list) else p])
            parsed = prompting.parse_response(text, max_actions_per_turn=1)
            actions = [
                x
                for x in prompting.map_actions(parsed.actions, env.unwrapped.action_names)
                if x is not None
            ]
            out.append(float(env.step(actions[0])[1]) if actions else -0.1)
        return out

    return reward


def compare_iteration(a) -> None:
    import lightning as L
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    import envs  # noqa: F401
    from ragen_lightning.data.datamodule import RolloutDataModule
    from ragen_lightning.rollout.settings import EpisodeSettings
    from ragen_lightning.starpo.module import StarPOModule

    path = tiny_model(a.model)
    rows = a.num_groups * a.group_size
    episode = EpisodeSettings(
        max_turns=1,
        max_actions_per_turn=1,
        max_actions_per_episode=1,
        max_new_tokens=a.completion_len,
    )
    torch.set_num_threads(a.threads)

    def ours() -> list[float]:
        a2 = argparse.Namespace(**{**vars(a), "rows": rows})
        module = StarPOModule(model=path, **project_settings(a2, micro_batch_threads=1))
        dm = RolloutDataModule(
            env={"id": ENV},
            episode=episode,
            sampling={"temperature": 1.0},
            engine={"name": "hf"},
            training={
                "num_groups": a.num_groups,
                "group_size": a.group_size,
                "num_iterations": a.iterations,
            },
            validation={"num_groups": 1},
        )
        times: list[float] = []
        from lightning.pytorch.callbacks import Callback

        class Wall(Callback):
            def on_train_batch_start(self, *args):
                self.t0 = time.perf_counter()

            def on_train_batch_end(self, *args):
                times.append(time.perf_counter() - self.t0)

        L.Trainer(
            accelerator=a.device,
            devices=1,
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            callbacks=[Wall()],
            default_root_dir="/tmp/peers-bench",
        ).fit(module, dm)
        # on_train_batch_start runs before the rollout is pulled (training_step pulls it)
        return times

    def trl() -> list[float]:
        tokenizer = AutoTokenizer.from_pretrained(path)
        msgs = first_turn_messages(
            tokenizer, [10000 + i for i in range(a.num_groups * a.iterations)], episode
        )
        seed_of = {m[-1]["content"]: 10000 + i for i, m in enumerate(msgs)}
        accumulation = rows // a.micro_batch
        cfg = trl_config(
            a,
            "/tmp/peers-bench/trl-it",
            num_generations=a.group_size,
            gradient_accumulation_steps=accumulation,
            max_completion_length=a.completion_len,
            temperature=1.0,
            max_steps=a.iterations,
            shuffle_dataset=False,
        )
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[bandit_reward(seed_of)],
            args=cfg,
            train_dataset=Dataset.from_dict({"prompt": msgs}),
            processing_class=tokenizer,
        )
        times: list[float] = []
        from transformers import TrainerCallback

        class Wall(TrainerCallback):
            def on_step_begin(self, *args, **kw):
                self.t0 = time.perf_counter()

            def on_step_end(self, *args, **kw):
                times.append(time.perf_counter() - self.t0)

        trainer.add_callback(Wall())
        trainer.train()
        return times

    results: dict[str, list[float]] = {"this project": [], "TRL GRPOTrainer": []}
    for _ in range(a.repeats):
        results["this project"] += ours()[1:]
        results["TRL GRPOTrainer"] += trl()[1:]
    base = statistics.mean(results["TRL GRPOTrainer"])
    print(
        f"\n### Single-turn iteration: Bandit, {a.num_groups} x {a.group_size} answers of <= {a.completion_len} "
        f"tokens, micro-batch {a.micro_batch}, model {a.model}, {a.device}, torch threads {a.threads}\n"
    )
    print("| | s / iteration (mean) | vs TRL |\n|---|---:|---:|")
    for name, ts in results.items():
        mean = statistics.mean(ts)
        print(f"| {name} | {mean:.2f} (n={len(ts)}, min {min(ts):.2f}) | {base / mean:.2f}x |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["update", "iteration", "both"], default="both")
    p.add_argument("--model", default="tiny", help="a model folder or the embedded 'tiny' preset")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2, help="torch threads (both sides)")
    p.add_argument("--rows", type=int, default=32, help="update: rows in the batch")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--num-groups", type=int, default=4, help="iteration: prompts per iteration")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--completion-len", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-6, help="learning rate of both (TRL's default)")
    p.add_argument(
        "--check",
        action="store_true",
        help="instead of timing: one update of each from the same weights, print how far apart they land",
    )
    p.add_argument(
        "--prompts",
        choices=["grouped", "distinct"],
        default="grouped",
        help="update: a group's rows share their prompt (GRPO), or every prompt differs",
    )
    p.add_argument(
        "--lengths",
        choices=["equal", "varied"],
        default="equal",
        help="update: every row prompt-len + completion-len tokens, or lengths varied as in a rollout",
    )
    p.add_argument(
        "--micro-batch-tokens", type=int, default=None, help="--check: the project's token budget"
    )
    p.add_argument(
        "--pack", action="store_true", help="--check: the project's micro-batches packed"
    )
    p.add_argument("--steps", type=int, default=2, help="update: steps per interleaved turn")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--iterations",
        type=int,
        default=3,
        help="iteration: iterations per run (the first is warm-up)",
    )
    a = p.parse_args(argv)
    a.update = {"micro_batch_tokens": a.micro_batch_tokens, "pack": a.pack}
    warnings.filterwarnings("ignore")
    if (
        a.rows % a.group_size
        or a.rows % a.micro_batch
        or (a.num_groups * a.group_size) % a.micro_batch
    ):
        p.error(
            "--rows (and num_groups x group_size) must be divisible by --group-size and --micro-batch"
        )
    if a.check:
        diff, mine, theirs = check_same_update(a)
        print(
            f"largest difference of the two updates' parameter changes: {diff:.2e} x lr; gradient norms "
            f"{mine:.6g} (this project) and {theirs:.6g} (TRL)"
        )
        return
    if a.part in ("update", "both"):
        compare_update(a)
    if a.part in ("iteration", "both"):
        compare_iteration(a)


if __name__ == "__main__":
    main()
