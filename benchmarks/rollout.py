"""Rollout generation throughput: the HF engine vs the vLLM engine on the same model and the same
batch, one run.

    python benchmarks/rollout.py                              # embedded tiny model, batches 32 and 128
    python benchmarks/rollout.py --model medium --batches 32 128
    python benchmarks/rollout.py --model /path/to/hf/folder --prompt-len 64 --new-tokens 128
    python benchmarks/rollout.py --multi-turn configs/sokoban.yaml     # a task config's default rollout

Needs vLLM (the README install). Models: ``tiny`` (the embedded ~1M-parameter Qwen2), ``small``
(~4M: hidden 256, 4 layers), ``medium`` (~47M: hidden 512, 12 layers) and ``large`` (Qwen2.5-0.5B's
24 blocks with the tiny vocabulary, ~360M), Qwen2 with random weights and the tiny tokenizer, built
and cached on first use; or any local HF folder.

For each batch size: the same random prompts (``--prompt-len`` ids) and per-request seeds go to
:class:`~ragen_lightning.rollout.engine.HFEngine` (the actor's own KV-cached decode loop) and to
:class:`~ragen_lightning.rollout.vllm_engine.VLLMEngine` (in-process vLLM), sampling at temperature 1 for at most
``--new-tokens`` tokens. Each engine gets one warm-up call first; the table reports generated tokens
per second (sampled tokens / wall time of the ``generate`` call) and the wall time. The sync columns
time one weight push (``sync_s``: all weights into vLLM + prefix-cache reset) and the sync-fidelity
probe (``probe_s``) with its max
|log-prob difference. HF runs with ``--threads`` torch threads, measured before the vLLM engine is built (vLLM
pins torch to its own thread count in this process).

``--multi-turn CONFIG`` runs instead the first training rollout of a task config (its ``num_groups x
group_size`` episodes, ``max_turns``, ``max_new_tokens``, sampling settings and seeds; the
warm-started model when the config warm starts, built and cached on first use) with each of
``--engines``: ``hf`` (prefix reuse across turns and finished-row dropping), ``hf-noreuse`` (the
same engine with ``prefix_cache_tokens=0``: every turn re-prefills the whole conversation) and
``vllm`` (in-process, prefix caching on). Each engine runs one untimed rollout first, then the timed
one (same seeds, so the HF variants sample the same tokens). Reported: rollout wall time, the part
spent in ``generate``, prompt tokens requested, prompt tokens prefilled (HF only; vLLM's prefix
cache is internal), sampled tokens, and sampled tokens per second of ``generate``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from ragen_lightning.rollout.engine import HFEngine, SamplingParams

PRESETS = {  # random-weight Qwen2 sizes beside the embedded tiny model
    "small": {
        "hidden_size": 256,
        "num_layers": 4,
        "num_heads": 8,
        "num_kv_heads": 4,
        "intermediate_size": 1024,
    },
    "medium": {
        "hidden_size": 512,
        "num_layers": 12,
        "num_heads": 16,
        "num_kv_heads": 8,
        "intermediate_size": 2048,
    },
    # Qwen2.5-0.5B's blocks (the vocabulary stays the tiny tokenizer's, so ~360M instead of 494M
    # parameters)
    "large": {
        "hidden_size": 896,
        "num_layers": 24,
        "num_heads": 14,
        "num_kv_heads": 2,
        "intermediate_size": 4864,
    },
}


def model_path(name: str) -> str:
    from ragen_lightning.models.tiny import TinySpec, tiny_model_path

    if name == "tiny":
        return str(tiny_model_path())
    if name in PRESETS:
        return str(tiny_model_path(TinySpec(**PRESETS[name])))
    return name


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


class Counting:
    """Wraps an engine: counts prompt tokens requested and tokens sampled (other attributes pass
    through)."""

    def __init__(self, engine):
        self.engine, self.prompt_tokens, self.sampled_tokens, self.requests = engine, 0, 0, 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, params, seeds=None, **kw):
        outs = self.engine.generate(prompts, params, seeds, **kw)
        self.prompt_tokens += sum(len(p) for p in prompts)
        self.sampled_tokens += sum(len(o.token_ids) for o in outs)
        self.requests += len(prompts)
        return outs


def task_settings(config: str) -> tuple[dict, dict]:
    """``(data, model)`` settings of a task config: the data module's groups with their defaults,
    flattened to the names this benchmark reads (the episode's fields, the sampling's, ``env_id``,
    ``num_groups``, ...)."""
    from dataclasses import asdict

    import yaml

    from ragen_lightning.data.settings import DataSettings

    cfg = yaml.safe_load(Path(config).read_text())
    s = DataSettings.build(**cfg.get("data", {}))
    data = {
        **asdict(s.episode),
        **asdict(s.sampling),
        "env_id": s.env.id,
        "env_kwargs": s.env.kwargs,
        "num_groups": s.training.num_groups,
        "group_size": s.training.group_size,
        "train_seed": s.training.seed,
        "vllm": s.engine.vllm,
    }
    return data, cfg.get("model", {})


def multi_turn(args) -> list[dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import envs  # noqa: F401  (registers the project's envs)
    from ragen_lightning.models import resolve_model_path
    from ragen_lightning.rollout.runner import RolloutRunner
    from ragen_lightning.rollout.tokens import ChatTokens

    d, m = task_settings(args.multi_turn)
    names = (
        "max_turns",
        "max_actions_per_turn",
        "max_actions_per_episode",
        "context_window",
        "window_turns",
        "max_new_tokens",
        "max_model_len",
        "enable_think",
    )
    torch.set_num_threads(args.threads)
    if m.get("warm_start"):
        from ragen_lightning.sft.warm_start import as_warm_start, warm_start

        episode = {k: d[k] for k in names}
        path = str(
            warm_start(
                m.get("model", "tiny"),
                d["env_id"],
                d.get("env_kwargs"),
                as_warm_start(m["warm_start"]),
                episode=episode,
            )
        )
    else:
        path = resolve_model_path(m.get("model", "tiny"))
    tok = AutoTokenizer.from_pretrained(path)
    actor = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    params = SamplingParams(d["temperature"], d["top_p"], d["top_k"], d["max_new_tokens"])
    G, N = d["num_groups"], d["group_size"]
    # iteration 0's groups and generation seed
    group_seeds = [d["train_seed"] + i for i in range(G)]
    seed = d["train_seed"] << 20
    runner_kwargs = {k: d[k] for k in names if k not in ("max_new_tokens",)}
    runner_kwargs["format_penalty"] = d["format_penalty"]
    stop, pad = [tok.eos_token_id], tok.pad_token_id

    def engine(name):
        if name == "hf":
            return HFEngine(actor, stop, pad, max_batch_size=G * N)
        if name == "hf-noreuse":
            return HFEngine(actor, stop, pad, max_batch_size=G * N, prefix_cache_tokens=0)
        from ragen_lightning.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            actor,
            path,
            stop,
            pad,
            d["vllm"],
            max_model_len=d["max_model_len"],
            max_batch_size=G * N,
            seed=0,
        )

    rows = []
    for name in args.engines:  # vLLM last: it pins torch's thread count in this process
        eng = engine(name)
        eng.sync_weights()
        runner = RolloutRunner(
            d["env_id"],
            d.get("env_kwargs"),
            ChatTokens(tok, enable_think=d["enable_think"]),
            eng,
            **runner_kwargs,
        )
        runner.run(group_seeds, N, params, seed=seed)  # warm-up
        counting = Counting(eng)
        runner.engine = counting
        stats0 = dict(getattr(eng, "stats", {}))
        trajs, wall = timed(runner.run, group_seeds, N, params, seed=seed)
        gen = runner.timing["generate"]
        stats = {k: v - stats0.get(k, 0) for k, v in getattr(eng, "stats", {}).items()}
        rows.append(
            dict(
                engine=name,
                wall=wall,
                generate=gen,
                requests=counting.requests,
                prompt=counting.prompt_tokens,
                prefilled=stats.get("prefill_tokens"),
                sampled=counting.sampled_tokens,
                tok_s=counting.sampled_tokens / gen,
                turns=sum(t.num_turns for t in trajs),
                success=sum(t.success for t in trajs) / len(trajs),
            )
        )
    print(
        f"\n{args.multi_turn}: {G} x {N} episodes, max_turns {d['max_turns']}, max_new_tokens "
        f"{d['max_new_tokens']}, temperature {d['temperature']}; model {path}; {os.cpu_count()} CPU cores, "
        f"HF torch threads {args.threads}\n"
    )
    print(
        "| engine | rollout s | generate s | requests | turns | prompt tokens | prefilled | sampled | "
        "sampled tok/s | vs first |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        pre = "-" if r["prefilled"] is None else str(r["prefilled"])
        print(
            f"| {r['engine']} | {r['wall']:.2f} | {r['generate']:.2f} | {r['requests']} | {r['turns']} | "
            f"{r['prompt']} | {pre} | {r['sampled']} | {r['tok_s']:.0f} | {rows[0]['wall'] / r['wall']:.2f}x |"
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="tiny | small | medium | large | a HF folder")
    p.add_argument("--batches", type=int, nargs="+", default=[32, 128])
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the HF engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--multi-turn", default=None, metavar="CONFIG", help="time a task config's default rollout"
    )
    p.add_argument(
        "--engines", nargs="+", default=["hf-noreuse", "hf", "vllm"], help="with --multi-turn"
    )
    args = p.parse_args(argv)
    if args.multi_turn:
        return multi_turn(args)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_path(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    torch.set_num_threads(args.threads)
    actor = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    n_params = sum(p.numel() for p in actor.parameters())
    vocab = actor.config.vocab_size
    g = torch.Generator().manual_seed(args.seed)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    stop = [tok.eos_token_id]

    def batch(b):
        prompts = torch.randint(3, vocab, (b, args.prompt_len), generator=g).tolist()
        return prompts, [args.seed * 100_003 + i for i in range(b)]

    batches = {b: batch(b) for b in args.batches}
    rows = {b: {"batch": b} for b in args.batches}
    hf = HFEngine(actor, stop, tok.pad_token_id, max_batch_size=max(args.batches))
    warm = batches[args.batches[0]][0][:4]
    hf.generate(warm, params)  # warm-up
    for b, (prompts, seeds) in batches.items():
        outs, wall = timed(hf.generate, prompts, params, seeds)
        n = sum(len(o.token_ids) for o in outs)
        rows[b].update(hf_tokens=n, hf_s=wall, hf_tok_s=n / wall)

    from ragen_lightning.rollout.vllm_engine import VLLMEngine, VLLMSettings

    engine, init_s = timed(
        VLLMEngine,
        actor,
        path,
        stop,
        tok.pad_token_id,
        VLLMSettings(),
        max_model_len=args.prompt_len + args.new_tokens + 8,
        max_batch_size=max(args.batches),
        seed=args.seed,
    )
    engine.generate(warm, params)  # warm-up (also records the probe prompts)
    sync = engine.sync_weights()
    for b, (prompts, seeds) in batches.items():
        outs, wall = timed(engine.generate, prompts, params, seeds)
        n = sum(len(o.token_ids) for o in outs)
        rows[b].update(
            vllm_tokens=n,
            vllm_s=wall,
            vllm_tok_s=n / wall,
            speedup=(n / wall) / rows[b]["hf_tok_s"],
        )

    cpu = os.cpu_count()
    print(
        f"\nmodel {args.model} ({n_params / 1e6:.2f} M params, fp32), prompt {args.prompt_len} ids, <= "
        f"{args.new_tokens} new tokens, temperature 1; {cpu} CPU cores; HF torch threads {args.threads}; "
        f"vLLM init {init_s:.1f} s"
    )
    print(
        f"weight sync: push {sync['rollout/sync_s']:.3f} s ({int(sync['rollout/sync_tensors'])} tensors), probe "
        f"{sync['rollout/probe_s']:.3f} s, probe max |dlogp| {sync['rollout/probe_max_abs_logprob_diff']:.2e}\n"
    )
    print("| batch | HF tokens | HF s | HF tok/s | vLLM tokens | vLLM s | vLLM tok/s | vLLM / HF |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows.values():
        print(
            f"| {r['batch']} | {r['hf_tokens']} | {r['hf_s']:.2f} | {r['hf_tok_s']:.0f} | {r['vllm_tokens']} | "
            f"{r['vllm_s']:.2f} | {r['vllm_tok_s']:.0f} | {r['speedup']:.2f}x |"
        )
    return list(rows.values())


if __name__ == "__main__":
    main()
