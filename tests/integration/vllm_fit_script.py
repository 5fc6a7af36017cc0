"""Run by ``test_vllm.py`` outside the test process (vLLM takes over torch threading in the process
that builds an engine): :func:`main` is the last phase of its single-process
``dist_worker.py`` launch, which writes the result as the phase's ``rank0.json``.

``main(MODEL_DIR, OUT_DIR)`` (or ``python tests/integration/vllm_fit_script.py MODEL_DIR OUT_DIR``,
which prints it) fits StarPO with ``--data.engine.name vllm`` on the tiny model for 3 iterations and
returns one JSON object:

- ``pushes``: per weight sync, whether the actor changed since the previous sync (a real optimizer
  step ran), the number of tensors pushed and the probe's max/mean |log-prob difference|;
- ``probe_error``: the error raised when the 3rd sync is deliberately skipped (the probe must catch
  stale weights);
- ``greedy``: HF and vLLM greedy token ids for the same prompts after a push;
- ``seeded``: sampled token ids for the same per-request seeds twice, alone, and with other seeds;
- ``lora``: a push from a peft LoRA actor (only the adapted modules, merged) and its probe
  difference.
"""

from __future__ import annotations

import json
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

import envs  # noqa: F401
from ragen_lightning.data.datamodule import RolloutDataModule
from ragen_lightning.rollout.engine import HFEngine, SamplingParams
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.rollout.vllm_engine import SyncProbeError, VLLMEngine, VLLMSettings
from ragen_lightning.starpo.module import StarPOModule


def snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def main(model_dir: str, out_dir: str) -> dict:
    torch.manual_seed(0)
    pushes: list[dict] = []
    original_sync = VLLMEngine.sync_weights

    def recording_sync(self):
        now = snapshot(self.actor)
        prev = getattr(self, "_last_snapshot", None)
        changed = prev is not None and any(not torch.equal(a, b) for a, b in zip(prev, now))
        self._last_snapshot = now
        entry = {"changed_since_last_push": changed, "skipped": self._skip_push}
        pushes.append(entry)
        stats = original_sync(self)
        entry.update(stats)
        return stats

    VLLMEngine.sync_weights = recording_sync

    class SkipThirdPush(Callback):  # after the 2nd update, leave the engine's weights stale
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 1:
                trainer.datamodule.engine._skip_push = True

    module = StarPOModule(
        model=model_dir,
        advantage={"estimator": "grpo"},
        update={"mini_batch_size": 4, "micro_batch_size": 4},
        optim={"actor_lr": 1e-3},
    )
    dm = RolloutDataModule(
        env={"id": "ragen/Bandit-v0"},
        training={"num_groups": 2, "group_size": 2, "num_iterations": 3},
        episode=EpisodeSettings(
            max_turns=1,
            max_actions_per_turn=1,
            max_actions_per_episode=1,
            max_new_tokens=12,
            max_model_len=1024,
        ),
        validation={"num_groups": 2},
        engine={"name": "vllm", "max_batch_size": 16, "vllm": VLLMSettings(probe_size=2)},
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=out_dir,
        callbacks=[SkipThirdPush()],
    )
    probe_error = None
    try:
        trainer.fit(module, dm)
    except SyncProbeError as e:
        probe_error = str(e)
    engine: VLLMEngine = dm.engine
    VLLMEngine.sync_weights = original_sync

    # greedy: HF and vLLM on the same weights (sharpened so near-ties of the random model cannot
    # flip an argmax)
    actor = module.actor
    with torch.no_grad():
        actor.get_input_embeddings().weight.mul_(8.0)
    engine._skip_push = False
    engine.sync_weights()
    prompts = [seq[:-4] for seq in engine.probe[1:]] + [
        [5, 6, 7, 8, 9],
        [10, 11],
        list(range(20, 60)),
    ]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    tok = module.tokenizer
    hf = HFEngine(actor, [tok.eos_token_id], tok.pad_token_id).generate(prompts, greedy)
    vl = engine.generate(prompts, greedy)

    # stop strings: one that the greedy continuation completes inside its 4th..5th token (ending
    # inside a token when it can), for the requests that ran that far; vLLM and HF must both stop on
    # the completing token
    long_enough = [(p, g.token_ids) for p, g in zip(prompts, vl) if len(g.token_ids) >= 6]
    stops = []
    for _, ids in long_enough:
        t4, t5 = (tok.decode(ids[:n], skip_special_tokens=False) for n in (4, 5))
        stops.append(t5[len(t4) - 2 : len(t4) + 1] if len(t5) > len(t4) else t5[-3:])
    stop_params = SamplingParams(temperature=0.0, max_new_tokens=16, stop=tuple(stops))
    stop_prompts = [p for p, _ in long_enough]
    vl_stop = engine.generate(stop_prompts, stop_params)
    hf_stop = HFEngine(actor, [tok.eos_token_id], tok.pad_token_id, tokenizer=tok).generate(
        stop_prompts, stop_params
    )
    reference = []  # shortest greedy prefix whose full decoded text holds a stop string
    for _, ids in long_enough:
        reference.append(
            next(
                k
                for k in range(1, len(ids) + 1)
                if any(x in tok.decode(ids[:k], skip_special_tokens=False) for x in stops)
            )
        )

    # seeded sampling: the same seeds give the same tokens, in a batch or alone (batch-independent)
    sampled = SamplingParams(temperature=1.0, max_new_tokens=16)
    seeds = [1000 + i for i in range(len(prompts))]
    batch_a = [g.token_ids for g in engine.generate(prompts, sampled, seeds)]
    batch_b = [g.token_ids for g in engine.generate(prompts, sampled, seeds)]
    alone = [
        engine.generate([p], sampled, [s])[0].token_ids for p, s in zip(prompts[:2], seeds[:2])
    ]
    other = [g.token_ids for g in engine.generate(prompts, sampled, [s + 1 for s in seeds])]

    # LoRA: a peft-wrapped copy of the actor with a random (non-zero) adapter; only adapted modules
    # are pushed
    import copy

    from peft import LoraConfig, get_peft_model

    lora_actor = get_peft_model(
        copy.deepcopy(actor),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    engine.actor = lora_actor
    lora_stats = engine.sync_weights()
    lora_unmerged = not any(getattr(m, "merged", False) for m in lora_actor.modules())
    full = len(actor.state_dict())
    return {
        "pushes": pushes,
        "probe_error": probe_error,
        "global_step": trainer.global_step,
        "greedy": {
            "hf": [g.token_ids for g in hf],
            "vllm": [g.token_ids for g in vl],
            "hf_logprobs": [g.logprobs for g in hf],
            "vllm_logprobs": [g.logprobs for g in vl],
        },
        "stop": {
            "free": [ids for _, ids in long_enough],
            "reference_lengths": reference,
            "vllm": [g.token_ids for g in vl_stop],
            "hf": [g.token_ids for g in hf_stop],
            "vllm_finish": [g.finish_reason for g in vl_stop],
        },
        "seeded": {"batch_a": batch_a, "batch_b": batch_b, "alone": alone, "other_seeds": other},
        "lora": {
            "stats": lora_stats,
            "full_state_dict_tensors": full,
            "unmerged_after_push": lora_unmerged,
        },
    }


if __name__ == "__main__":
    result = main(sys.argv[1], sys.argv[2])
    print("RESULT_JSON " + json.dumps(result))
