"""Evidence that StarPO learns: a shortened Bandit fit from the config's warm start raises the mean env return on
held-out episodes (fixed seeds, CPU, slow).

The warm start is the one ``configs/bandit.yaml`` trains from (300 SFT steps: format-valid ~38 % at temperature 1,
so RL has room), built in the default cache like the RL module does, so only the first run pays for it (~2 min).
The fit is the config's (GRPO, actor_lr 5e-4, 8 groups x 8) shortened to 12 iterations without validation. Before/after are evaluated on the same held-out seeds at temperature 1 (the
training temperature). Success = the risky arm was pulled; every failure of the warm-started model is a malformed
answer (format-valid rate = success rate), so the return rises when RL removes format errors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import envs  # noqa: F401  (registers the ragen/* ids)
from ragen_lightning.cli import main
from ragen_lightning.rollout.settings import EpisodeSettings

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "bandit.yaml"
RUNNER = {"max_turns": 1, "max_actions_per_turn": 1, "max_actions_per_episode": 1, "max_new_tokens": 32,
          "max_model_len": 2048}
EVAL_EPISODES = 128
ITERATIONS = 12


@pytest.mark.slow
def test_bandit_fit_improves_heldout_return(tmp_path, monkeypatch, capsys):
    from ragen_lightning.sft.module import episode_seeds
    from ragen_lightning.sft.warm_start import evaluate_policy, warm_start

    cfg = yaml.safe_load(CONFIG.read_text())
    data = cfg["data"]
    assert {k: data["episode"][k] for k in RUNNER} == RUNNER  # the test rolls out in the config's format
    ws = cfg["model"]["warm_start"]
    warm = warm_start("tiny", data["env_id"], **(ws if isinstance(ws, dict) else {}),
                      episode=EpisodeSettings(**RUNNER))
    demo_seeds = episode_seeds(0, 512, "train")
    evaluate = dict(num_episodes=EVAL_EPISODES, temperature=1.0, seed=0, exclude_seeds=demo_seeds,
                    episode=EpisodeSettings(**RUNNER))
    before = evaluate_policy(warm, data["env_id"], **evaluate)

    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(CONFIG), "--trainer.logger", "false", "--trainer.callbacks", "[]",
          "--trainer.enable_checkpointing", "false", "--trainer.limit_val_batches", "0",
          "--data.num_iterations", str(ITERATIONS), "--model.export_dir", str(tmp_path / "actor")])
    after = evaluate_policy(tmp_path / "actor", data["env_id"], **evaluate)
    with capsys.disabled():
        print(f"\n[learning] bandit {ITERATIONS} iterations: before {before} after {after}")
    # return = 0.25 * P(risky) + 0.1 * P(safe) in expectation, 0 for a malformed answer (episode ends, no pull)
    assert after["format_valid_rate"] > before["format_valid_rate"]
    assert after["mean_return"] > before["mean_return"]
