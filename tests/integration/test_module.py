"""StarPOModule + RolloutDataModule under a real Lightning Trainer on CPU with a tiny model (seconds
each)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

import envs  # noqa: F401
from ragen_lightning.data.sampler import FilterSettings
from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.starpo import module as starpo_module
from ragen_lightning.starpo.early_stop import EarlyStopSettings
from ragen_lightning.starpo.module import StarPOModule
from tests.data_groups import data_module
from tests.integration.scripted import SeededBanditEngine

pytestmark = pytest.mark.slow


class ScriptedStarPO(StarPOModule):
    def make_engine(self, max_batch_size=128):
        return SeededBanditEngine(self.tokenizer)


class Recorder(Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def data(**kw):
    args = dict(
        env_id="ragen/Bandit-v0",
        num_groups=2,
        group_size=4,
        num_iterations=1,
        episode=EpisodeSettings(
            max_turns=1,
            max_actions_per_turn=1,
            max_actions_per_episode=1,
            max_new_tokens=12,
            max_model_len=1024,
        ),
        val_num_groups=2,
    )
    args.update(kw)
    return data_module(**args)


def trainer(tmp_path, callbacks=(), **kw):
    kw = {"limit_val_batches": 0, **kw}
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=bool([c for c in callbacks if isinstance(c, ModelCheckpoint)]),
        callbacks=list(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        **kw,
    )


def params(m):
    return {k: v.detach().clone() for k, v in m.named_parameters()}


def changed(before, module):
    return any(not torch.equal(before[k], v) for k, v in module.named_parameters())


def fit(tmp_path, module, dm, callbacks=(), **kw):
    t = trainer(tmp_path, callbacks, **kw)
    t.fit(module, dm)
    return t


def test_ppo_iteration_updates_actor_and_critic(tmp_path, tiny_path):
    module = ScriptedStarPO(
        model=str(tiny_path),
        update={"mini_batch_size": 8, "micro_batch_size": 4},
        optim={"actor_lr": 1e-3, "critic_lr": 1e-3},
    )
    rec = Recorder()
    t = trainer(tmp_path, [rec])
    t.strategy.connect(module)
    module.configure_model()
    actor0, critic0 = params(module.actor), params(module.critic)
    t.fit(module, data())
    assert module.critic is not None and module.reference is None
    assert changed(actor0, module.actor) and changed(critic0, module.critic)
    m = rec.rows[-1]
    # one mini-batch of 8: one actor and one critic optimizer step
    assert t.global_step == 2 and m["train/batch_size"] == 8.0
    assert m["actor/pg_loss"] != 0.0 and m["critic/vf_loss"] > 0.0
    # scripted log-probs (-0.7) differ from the actor's
    assert m["rollout/engine_logprob_abs_diff"] > 0.0


def test_grpo_has_no_critic_and_reference_only_with_kl(tmp_path, tiny_path):
    module = ScriptedStarPO(
        model=str(tiny_path),
        advantage={"estimator": "grpo"},
        update={"mini_batch_size": 4, "micro_batch_size": 2},
        optim={"actor_lr": 1e-3},
    )
    rec = Recorder()
    t = fit(tmp_path, module, data(), [rec])
    assert module.critic is None and module.reference is None
    assert t.global_step == 2  # 8 samples / mini-batch 4 = two actor steps, no critic
    assert "critic/vf_loss" not in rec.rows[-1] and rec.rows[-1]["actor/pg_loss"] != 0.0

    # KL loss on
    kl = ScriptedStarPO(
        model=str(tiny_path),
        advantage={"estimator": "grpo"},
        loss={"kl_coef": 0.1},
        update={"mini_batch_size": 8, "micro_batch_size": 8},
        optim={"actor_lr": 1e-3},
    )
    rec = Recorder()
    fit(tmp_path, kl, data(), [rec])
    assert kl.reference is not None
    assert not any(p.requires_grad for p in kl.reference.parameters())
    assert "reference" not in " ".join(kl.state_dict())  # rebuilt from the folder, not checkpointed
    assert "actor/kl_loss" in rec.rows[-1]


def test_empty_filter_skips_update_and_stops(tmp_path, tiny_path):
    class Same(SeededBanditEngine):  # every member of a group answers the same arm -> zero variance
        def generate(self, prompts, params, seeds=None, **kw):
            return super().generate(prompts, params, [0] * len(prompts), **kw)

    class M(StarPOModule):
        def make_engine(self, max_batch_size=128):
            return Same(self.tokenizer)

    module = M(
        model=str(tiny_path),
        advantage={"estimator": "grpo"},
        update={"mini_batch_size": 8, "micro_batch_size": 8},
    )
    t = trainer(tmp_path)
    t.strategy.connect(module)
    module.configure_model()
    before = params(module.actor)
    rec = Recorder()
    # shared reward draws: members answering the same arm then score the same (zero variance)
    dm = data(
        num_iterations=10,
        empty_stop_steps=2,
        filter=FilterSettings(value=0.9, include_zero=False),
        env_kwargs={"shared_transitions": True},
    )
    with pytest.warns(UserWarning, match="kept no group"):
        t = fit(tmp_path, module, dm, [rec])
    assert not changed(before, module.actor) and t.global_step == 0
    assert dm.iteration == 2 and rec.rows[-1]["rollout/consecutive_empty_after_filter_steps"] == 2.0


def test_bad_config_errors(tiny_path):
    with pytest.raises(
        ValueError, match="micro_batch_size .* must be <= --model.update.mini_batch_size"
    ):
        StarPOModule(model=str(tiny_path), update={"mini_batch_size": 2, "micro_batch_size": 4})
    with pytest.raises(ValueError, match="unknown env id 'ragen/Nope-v0'"):
        data(env_id="ragen/Nope-v0")
    module = StarPOModule(model=str(tiny_path), advantage={"estimator": "grpo"})
    with pytest.raises(ValueError, match="--data.training.group_size must be >= 2"):
        L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False).fit(
            module, data(group_size=1)
        )


def test_resume_continues_exactly(tmp_path, tiny_path):
    """Stop after iteration 2 of 3, resume: iteration 3 and the final weights equal an uninterrupted
    run."""

    def run(root, ckpt=None, stop_after=None):
        module = StarPOModule(
            model=str(tiny_path),
            advantage={"estimator": "grpo"},
            update={"mini_batch_size": 8, "micro_batch_size": 4},
            optim={"actor_lr": 1e-2},
            loss={"entropy_coeff": 0.01},
        )
        rec = Recorder()
        cbs = [
            rec,
            ModelCheckpoint(dirpath=root, every_n_train_steps=1, save_top_k=-1, filename="{step}"),
        ]
        t = trainer(root, cbs, max_steps=stop_after or -1)
        t.fit(module, data(num_iterations=3, group_size=4, temperature=1.0), ckpt_path=ckpt)
        return module, rec

    full, rec_full = run(tmp_path / "full")
    _, rec_first = run(tmp_path / "part", stop_after=2)
    resumed, rec_resumed = run(tmp_path / "part", ckpt=str(tmp_path / "part" / "step=2.ckpt"))
    assert len(rec_resumed.rows) == 1  # only iteration 3 ran after the resume
    for key in (
        "actor/pg_loss",
        "actor/entropy",
        "actor/grad_norm",
        "train/score",
        "rollout/token_drift_rate",
    ):
        assert rec_resumed.rows[0][key] == pytest.approx(rec_full.rows[2][key], abs=1e-6), key
    for (k, a), (_, b) in zip(full.actor.named_parameters(), resumed.actor.named_parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=k)


def test_max_model_len_too_small_fails_before_training(tmp_path, tiny_path):
    module = StarPOModule(
        model=str(tiny_path),
        advantage={"estimator": "grpo"},
        update={"mini_batch_size": 8, "micro_batch_size": 8},
    )
    small = EpisodeSettings(
        max_turns=1,
        max_actions_per_turn=1,
        max_actions_per_episode=1,
        max_new_tokens=12,
        max_model_len=64,
    )
    with pytest.raises(
        ValueError, match=r"--data.episode.max_model_len=64 is too small for the first prompt"
    ):
        fit(tmp_path, module, data(episode=small))
    assert module.global_step == 0


def _separate_passes(settings, batch) -> bool:
    return False


def test_single_pass_shortcut_equals_separate_old_logprob_pass(tmp_path, tiny_path, monkeypatch):
    """One epoch over one mini-batch takes old log-probs and (GAE) values from the update's own
    forward passes: same result, two passes less. Micro-batches on two threads
    (``micro_batch_threads``) give it too, with and without the separate passes (which then score on
    two threads as well)."""
    results = []
    variants = (
        (False, 1, False),
        (True, 1, False),
        (False, 2, False),
        (True, 2, False),
        (False, 2, True),
    )
    for force, threads, background in variants:
        module = ScriptedStarPO(
            model=str(tiny_path),
            update={"mini_batch_size": 8, "micro_batch_size": 4, "micro_batch_threads": threads},
            optim={"actor_lr": 1e-2, "critic_lr": 1e-3},
            loss={"entropy_coeff": 0.01},
            critic={"in_background": background},
        )
        rec = Recorder()
        with monkeypatch.context() as patch:
            if force:  # always run the separate old-log-prob and value passes
                patch.setattr(starpo_module, "scores_in_update", _separate_passes)
            fit(tmp_path, module, data(num_iterations=3), [rec])
        # GAE: the critic's values come from its step when not forced
        assert module.critic is not None
        results.append(
            ({**params(module.actor), **params(module.critic)}, rec.rows, module.global_step)
        )
    a, rows_a, steps_a = results[0]
    assert steps_a == 6  # 3 iterations x (critic + actor) optimizer steps
    for (b, rows_b, steps_b), (*_, background) in zip(results[1:], variants[1:]):
        assert steps_b == steps_a  # steps taken on the worker thread are counted too
        for k in a:
            torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)
        for key in (
            "actor/pg_loss",
            "actor/entropy",
            "actor/ppo_kl",
            "rollout/engine_logprob_abs_diff",
            "critic/values_mean",
            "train/advantage_mean",
            "train/return_mean",
            "critic/explained_variance",
        ):
            assert rows_a[-1][key] == pytest.approx(rows_b[-1][key], abs=1e-6), key
        # in the background: logged with the next iteration
        for key in ("critic/vf_loss", "critic/vpred_mean"):
            late = [r[key] for r in rows_b if key in r]
            expected = (
                [r[key] for r in rows_a][: len(late)] if background else [r[key] for r in rows_a]
            )
            assert late == pytest.approx(expected, abs=1e-6), key
            assert len(late) == (2 if background else 3)


def test_background_critic_takes_the_sequential_steps_when_validation_starts_mid_step(
    tmp_path, tiny_path, monkeypatch
):
    """Lightning zeroes every gradient before validating. A critic step still accumulating on the
    worker thread lost the micro-batches it had done (a different step, at a point set by thread
    timing: runs under load differed). Here a background critic step sleeps once it holds gradients,
    so validation always starts mid-step: the weights must be the sequential update's bit for
    bit."""
    import threading
    import time

    from ragen_lightning.starpo import ppo

    plain = ppo.critic_micro_loss

    # a background critic micro-batch after the first of a step waits
    def slow(critic, *args, **kwargs):
        if threading.current_thread().name.startswith("critic-steps") and any(
            p.grad is not None for p in critic.parameters()
        ):
            time.sleep(0.15)
        return plain(critic, *args, **kwargs)

    monkeypatch.setattr(ppo, "critic_micro_loss", slow)
    results = []
    for background in (False, True):
        module = ScriptedStarPO(
            model=str(tiny_path),
            update={"mini_batch_size": 8, "micro_batch_size": 2},
            optim={"actor_lr": 1e-2, "critic_lr": 1e-2},
            critic={"in_background": background},
        )
        fit(tmp_path, module, data(num_iterations=3), limit_val_batches=1, val_check_interval=1)
        results.append(
            {
                f"{net}.{k}": v
                for net in ("actor", "critic")
                for k, v in params(getattr(module, net)).items()
            }
        )
    for k, v in results[0].items():
        assert torch.equal(v, results[1][k]), k


def test_reward_variance_collapse_stops_the_run(tmp_path, tiny_path):
    # varied answers in the first rollout, identical ones afterwards
    class Collapsing(SeededBanditEngine):
        calls = 0

        def generate(self, prompts, params, seeds=None, **kw):
            Collapsing.calls += 1
            return super().generate(
                prompts, params, seeds if Collapsing.calls == 1 else [0] * len(prompts), **kw
            )

    class M(StarPOModule):
        def make_engine(self, max_batch_size=128):
            return Collapsing(self.tokenizer)

    module = M(
        model=str(tiny_path),
        advantage={"estimator": "grpo"},
        update={"mini_batch_size": 8, "micro_batch_size": 8},
        early_stop=EarlyStopSettings(rv_collapse_window=1, rv_collapse_ratio=0.1),
    )
    # equal answers, equal rewards
    dm = data(num_iterations=5, env_kwargs={"shared_transitions": True})
    rec = Recorder()
    with pytest.warns(UserWarning, match="early stop: in-group reward std"):
        fit(tmp_path, module, dm, [rec])
    assert dm.iteration == 2 and rec.rows[-1]["early_stopped/reward_variance_collapse"] == 1.0


def test_tis_weights_the_policy_gradient_by_trainer_over_engine_probability(tmp_path, tiny_path):
    rows = {}
    for cap in (None, 2.0):
        torch.manual_seed(0)
        module = ScriptedStarPO(
            model=str(tiny_path),
            advantage={"estimator": "grpo"},
            update={"mini_batch_size": 8, "micro_batch_size": 8},
            optim={"actor_lr": 1e-3},
            loss={"tis_cap": cap},
        )
        rec = Recorder()
        fit(tmp_path, module, data(), [rec])
        rows[cap] = rec.rows[-1]
    assert "actor/is_weight_mean" not in rows[None]
    # the scripted engine claims log-prob -0.7 for every token; the random tiny actor gives its
    # tokens about -ln(vocab) ~ -6, so the weights min(exp(old + 0.7), 2) are far below 1 and shrink
    # the policy-gradient term
    w = rows[2.0]["actor/is_weight_mean"]
    assert 0.0 < w < 0.5
    assert rows[2.0]["actor/pg_loss"] != rows[None]["actor/pg_loss"]


def test_lr_warmup_ramps_each_network_per_optimizer_step(tmp_path, tiny_path):
    # 8 samples, mini-batch 4: two actor and two critic steps in the iteration. With N = 4, step k
    # uses lr * (k + 1) / 4: steps 0 and 1 use 0.25 lr and 0.5 lr, and after them the scheduler
    # stands at 0.75 lr.
    module = ScriptedStarPO(
        model=str(tiny_path),
        update={"mini_batch_size": 4, "micro_batch_size": 4},
        optim={"actor_lr": 1e-3, "critic_lr": 2e-3, "warmup_steps": 4},
    )
    t = fit(tmp_path, module, data())
    seen = [
        module.network_optimizer(n).optimizer.param_groups[0]["lr"] for n in ("actor", "critic")
    ]
    assert t.global_step == 4
    assert seen == pytest.approx([0.75e-3, 1.5e-3])
    off = ScriptedStarPO(
        model=str(tiny_path),
        update={"mini_batch_size": 4, "micro_batch_size": 4},
        optim={"actor_lr": 1e-3, "critic_lr": 2e-3},
    )
    fit(tmp_path / "off", off, data())
    assert [
        off.network_optimizer(n).optimizer.param_groups[0]["lr"] for n in ("actor", "critic")
    ] == [1e-3, 2e-3]
    with pytest.raises(ConfigError, match="--model.optim.warmup_steps"):
        ScriptedStarPO(optim={"warmup_steps": -1})


def test_lr_decay_follows_iterations_not_steps(tmp_path, tiny_path):
    # three iterations of two actor steps each, cosine over 2 iterations: iteration 0 at 1.0 lr, 1
    # at 0.55 lr, 2 at 0.1 lr (held); the rate an iteration's steps ran at is read in the next
    # iteration's first step
    seen = []

    class Spy(L.Callback):
        def on_train_batch_end(self, trainer, module, *args):
            seen.append(module.network_optimizer("actor").optimizer.param_groups[0]["lr"])

    module = ScriptedStarPO(
        model=str(tiny_path),
        advantage={"estimator": "grpo"},
        update={"mini_batch_size": 4, "micro_batch_size": 4},
        optim={"actor_lr": 1e-3, "decay_iterations": 2},
    )
    t = fit(tmp_path, module, data(num_iterations=3), [Spy()])
    assert t.global_step == 6 and seen == pytest.approx([1e-3, 0.55e-3, 0.1e-3])
    with pytest.raises(ConfigError, match="--model.optim.decay_iterations"):
        ScriptedStarPO(optim={"decay_iterations": -2})


def test_rft_steps_on_the_kept_rows_only(tmp_path, tiny_path):
    # one sample per mini-batch: one optimizer step per kept sample, none for the rows scored at or
    # below the line
    module = ScriptedStarPO(
        model=str(tiny_path),
        advantage={"estimator": "rft", "options": {"threshold": 0.0}},
        update={"mini_batch_size": 1, "micro_batch_size": 1},
        optim={"actor_lr": 1e-3},
    )
    rec = Recorder()
    t = fit(tmp_path, module, data(), [rec])
    kept = rec.rows[-1]["train/kept_rows"] * 8
    # these seeds: some of the 8 episodes score above 0, not all
    assert kept == round(kept) and 0 < kept < 8
    assert t.global_step == round(kept) and rec.rows[-1]["train/batch_size"] == 8.0
