"""Rollout generation throughput: the HF engine vs the vLLM engine on the same model and the same batch, one run.

    python benchmarks/rollout.py                              # embedded tiny model, batches 32 and 128
    python benchmarks/rollout.py --model medium --batches 32 128
    python benchmarks/rollout.py --model /path/to/hf/folder --prompt-len 64 --new-tokens 128

Needs the ``vllm`` extra (``pip install -e ".[vllm]"``). Models: ``tiny`` (the embedded ~1M-parameter Qwen2),
``small`` (~4M: hidden 256, 4 layers), ``medium`` (~47M: hidden 512, 12 layers) and ``large`` (Qwen2.5-0.5B's 24
blocks with the tiny vocabulary, ~360M), Qwen2 with random weights and the tiny tokenizer, built and cached on first
use; or any local HF folder.

For each batch size: the same random prompts (``--prompt-len`` ids) and per-request seeds go to
:class:`~ragen_lightning.rollout.engine.HFEngine` (the actor's own KV-cached decode loop) and to
:class:`~ragen_lightning.rollout.vllm_engine.VLLMEngine` (in-process vLLM), sampling at temperature 1 for at most
``--new-tokens`` tokens. Each engine gets one warm-up call first; the table reports generated tokens per second
(sampled tokens / wall time of the ``generate`` call) and the wall time. The sync columns time one weight push
(``sync_s``: all weights into vLLM + prefix-cache reset) and the sync-fidelity probe (``probe_s``) with its max
|log-prob difference. HF runs with ``--threads`` torch threads, measured before the vLLM engine is built (vLLM
pins torch to its own thread count in this process).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from ragen_lightning.rollout.engine import HFEngine, SamplingParams  # noqa: E402

PRESETS = {  # random-weight Qwen2 sizes beside the embedded tiny model
    "small": {"hidden_size": 256, "num_layers": 4, "num_heads": 8, "num_kv_heads": 4, "intermediate_size": 1024},
    "medium": {"hidden_size": 512, "num_layers": 12, "num_heads": 16, "num_kv_heads": 8, "intermediate_size": 2048},
    # Qwen2.5-0.5B's blocks (the vocabulary stays the tiny tokenizer's, so ~360M instead of 494M parameters)
    "large": {"hidden_size": 896, "num_layers": 24, "num_heads": 14, "num_kv_heads": 2, "intermediate_size": 4864},
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


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="tiny | small | medium | large | a HF folder")
    p.add_argument("--batches", type=int, nargs="+", default=[32, 128])
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the HF engine")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

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

    from ragen_lightning.rollout.vllm_engine import VLLMConfig, VLLMEngine

    engine, init_s = timed(VLLMEngine, actor, path, stop, tok.pad_token_id, VLLMConfig(),
                           max_model_len=args.prompt_len + args.new_tokens + 8, max_batch_size=max(args.batches),
                           seed=args.seed)
    engine.generate(warm, params)  # warm-up (also records the probe prompts)
    sync = engine.sync_weights()
    for b, (prompts, seeds) in batches.items():
        outs, wall = timed(engine.generate, prompts, params, seeds)
        n = sum(len(o.token_ids) for o in outs)
        rows[b].update(vllm_tokens=n, vllm_s=wall, vllm_tok_s=n / wall, speedup=(n / wall) / rows[b]["hf_tok_s"])

    cpu = os.cpu_count()
    print(f"\nmodel {args.model} ({n_params / 1e6:.2f} M params, fp32), prompt {args.prompt_len} ids, <= "
          f"{args.new_tokens} new tokens, temperature 1; {cpu} CPU cores; HF torch threads {args.threads}; "
          f"vLLM init {init_s:.1f} s")
    print(f"weight sync: push {sync['rollout/sync_s']:.3f} s ({int(sync['rollout/sync_tensors'])} tensors), probe "
          f"{sync['rollout/probe_s']:.3f} s, probe max |dlogp| {sync['rollout/probe_max_abs_logprob_diff']:.2e}\n")
    print("| batch | HF tokens | HF s | HF tok/s | vLLM tokens | vLLM s | vLLM tok/s | vLLM / HF |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows.values():
        print(f"| {r['batch']} | {r['hf_tokens']} | {r['hf_s']:.2f} | {r['hf_tok_s']:.0f} | {r['vllm_tokens']} | "
              f"{r['vllm_s']:.2f} | {r['vllm_tok_s']:.0f} | {r['speedup']:.2f}x |")
    return list(rows.values())


if __name__ == "__main__":
    main()
