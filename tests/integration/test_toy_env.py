"""A new environment needs only an env class and a registration: warm start + one StarPO iteration
on a toy env defined here, with no edit to the library (docs/extending.md, "Add your own
environment", walks through the same steps)."""

from __future__ import annotations

import csv
import json
from typing import Any

import gymnasium as gym
import pytest
from gymnasium import spaces

import envs  # noqa: F401  (the project's ids; the tiny model's corpus comes from them)
from envs.base import PromptSpec, TextEnv, text_space
from ragen_lightning.cli import main
from ragen_lightning.errors import ConfigError

pytestmark = pytest.mark.slow


class ArrowEnv(TextEnv):
    """Point the way: the observation names a side, answering that side's word wins.

    ## Action Space
    ``Discrete(2)``: 0 Left, 1 Right (``action_names``).

    ## Observation Space
    ``Text``: ``"The exit is on the <side>."``

    ## Rewards / Episode End
    1.0 and ``terminated`` for the named side; 0.0 otherwise (the episode goes on).
    """

    action_names = ("Left", "Right")
    warm_start_steps = 20  # the warm-start hint: a trivial format, few steps suffice

    def __init__(self, render_mode: str | None = None):
        super().__init__(render_mode)
        self.observation_space = text_space()
        self.action_space = spaces.Discrete(2)
        self.side = 0

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec("Walk towards the exit.", self.action_names)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.side = int(self.np_random.integers(2))
        return self._render_text(), {}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        won = int(action) == self.side
        return self._render_text(), float(won), won, False, {"success": won}

    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        side = self.action_names[self.side]
        return f"the exit is {side.lower()}", (side,)

    def _render_text(self) -> str:
        return f"The exit is on the {self.action_names[self.side].lower()}."


class NoExpertEnv(ArrowEnv):
    expert_turn = None  # type: ignore[assignment]  (an env that defines no expert)


gym.register("toy/Arrow-v0", entry_point=ArrowEnv)
gym.register("toy/NoExpert-v0", entry_point=NoExpertEnv)


def _args(tmp_path, env_id: str) -> list[str]:
    return [
        "fit",
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "1",
        "--trainer.max_epochs",
        "1",
        "--trainer.logger",
        "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir",
        str(tmp_path / "logs"),
        "--trainer.enable_checkpointing",
        "false",
        "--trainer.limit_val_batches",
        "0",
        "--trainer.log_every_n_steps",
        "1",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.enable_progress_bar",
        "false",
        "--model.model",
        "tiny",
        "--model.warm_start",
        "{num_episodes: 16}",
        "--model.advantage.estimator",
        "grpo",
        "--model.update.mini_batch_size",
        "4",
        "--model.update.micro_batch_size",
        "4",
        "--data.env.id",
        env_id,
        "--data.training.num_groups",
        "2",
        "--data.training.group_size",
        "2",
        "--data.training.num_iterations",
        "1",
        "--data.episode.max_turns",
        "2",
        "--data.episode.max_actions_per_turn",
        "1",
        "--data.episode.max_actions_per_episode",
        "2",
        "--data.episode.max_new_tokens",
        "24",
        "--data.episode.max_model_len",
        "1024",
        "--data.validation.num_groups",
        "2",
    ]


def test_warm_start_and_one_iteration_on_a_new_env(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGEN_LIGHTNING_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    main(_args(tmp_path, "toy/Arrow-v0"))

    # the warm start built a model folder, with the env's hint
    (warm,) = (tmp_path / "cache").glob("warm-*")
    meta = json.loads((warm / "warm_start.json").read_text())
    assert (
        meta["args"]["steps"] == ArrowEnv.warm_start_steps
        and meta["demo_stats"]["demo/expert_success_rate"] == 1
    )
    rows = list(csv.DictReader(open(next((tmp_path / "logs").rglob("metrics.csv")))))
    # the iteration ran and logged success
    assert [r["train/success"] for r in rows if r.get("train/success")]

    # the demonstrations are the expert's answers, in the rollout format
    from ragen_lightning import models
    from ragen_lightning.rollout.settings import EpisodeSettings
    from ragen_lightning.sft.experts import collect_demonstrations

    tok = models.load_tokenizer(str(warm))
    (traj,) = collect_demonstrations(
        "toy/Arrow-v0", tok, [3], episode=EpisodeSettings(max_actions_per_turn=1)
    )
    env = gym.make("toy/Arrow-v0")
    env.reset(seed=3)
    side = env.unwrapped.action_names[env.unwrapped.side]
    conv = traj.samples[0].conversation
    s, e = conv.turn_spans[0]
    assert tok.decode(conv.input_ids[s:e]).startswith(
        f"the exit is {side.lower()}</think><answer>{side}</answer>"
    )
    assert traj.success and traj.num_turns == 1


def test_warm_start_on_an_env_without_expert_is_one_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGEN_LIGHTNING_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError, match=r"^--model.warm_start needs an expert: NoExpertEnv has no expert_turn\("
    ):
        main(_args(tmp_path, "toy/NoExpert-v0"))
    # refused before the tiny model or a warm start was built
    assert not (tmp_path / "cache").exists()
