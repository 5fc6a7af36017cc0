"""Two-armed bandit with named arms (RAGEN's Bi-Arm Bandit), single turn.

The agent sees two occupation names and must guess from the names alone which arm is the risky,
high-paying one. Departure from RAGEN: RAGEN offsets every instance's seed by a global instance
counter, so envs reset with the same seed in one group see different arms and reward draws. Here the
seed alone decides the arms (group invariant: one initial state per group), and the reward draw
comes from the per-instance transition stream when the trainer passes ``options={"transition_seed":
...}`` (RAGEN's independent draws; ``shared_transitions=True`` shares them instead).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from envs.base import TRANSITION_SEED, PromptSpec, TextEnv, as_action, text_space

# (low-risk arm, high-risk arm) pairs, in RAGEN's order.
TRAIN_ARM_PAIRS: tuple[tuple[str, str], ...] = (
    ("Teacher", "Trader"),
    ("Nurse", "StartupFounder"),
    ("Librarian", "Investor"),
    ("Accountant", "StockBroker"),
    ("Engineer", "RealEstateAgent"),
    ("Pharmacist", "Musician"),
    ("Clerk", "Freelancer"),
    ("Technician", "Youtuber"),
    ("Planner", "Artist"),
    ("Postman", "Pilot"),
    ("Banker", "VentureCapitalist"),
    ("Gardener", "Cryptominer"),
)
# Held-out pairs ("Bandit-Rev" in the RAGEN paper).
TEST_ARM_PAIRS: tuple[tuple[str, str], ...] = (
    ("Receptionist", "Explorer"),
    ("Archivist", "Filmmaker"),
    ("Bookkeeper", "Consultant"),
    ("SocialWorker", "Photographer"),
    ("Mechanic", "GameDesigner"),
    ("Secretary", "Entrepreneur"),
    ("Cashier", "DataScientist"),
    ("CivilServant", "StartupAccelerator"),
)
ARM_PAIRS: dict[str, tuple[tuple[str, str], ...]] = {
    "train": TRAIN_ARM_PAIRS,
    "test": TEST_ARM_PAIRS,
}

PROMPT_TEMPLATE = (
    "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to pull.\n"
    "Game Rules:\n"
    "1. There are 2 arms, named {name_a} and {name_b}\n"
    "2. Each arm has its own reward distribution, related to their names.\n"
    "3. Analyze the symbolic meaning of each arm's name to guess how their reward distribution might behave.\n"
    "4. Based on the symbolic meaning of their names, which arm do you think is more likely to give higher rewards "
    "on average? Choose between {name_a} and {name_b}, and output like <answer> {name_a} </answer> or "
    "<answer> {name_b} </answer>.\n"
)
# RAGEN's Bandit tags have an empty instruction (the observation is the whole task); the shared
# prompt contract wants a non-empty one, so the instruction is the opening of the env's own prompt.
INSTRUCTION = (
    "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to pull."
)
INVALID_TEXT = "Invalid action. Choose arm 0 ({name_a}) or arm 1 ({name_b})."
EXPERT_POLICIES = ("risky", "balanced")


class BanditEnv(TextEnv):
    """Two-armed bandit whose arms are named after occupations; one risky arm, one safe arm.

    ## Description At reset a (safe, risky) name pair is drawn from the split's list and the two
    arms are put in a random order. The observation is a prompt naming both arms. The safe arm
    always pays ``lo_arm_score``; the risky arm pays ``hi_arm_hiscore`` with probability
    ``hi_arm_hiscore_prob`` and ``hi_arm_loscore`` otherwise (expected 0.25 with the defaults,
    versus 0.1 for the safe arm). One pull ends the episode.

    ## Action Space ``Discrete(2)``: the arm index. ``action_names`` holds the two arm names of the
    current episode in index order (empty before the first reset).

    ## Observation Space ``Text`` over printable ASCII. After reset: the game prompt; after a pull:
    ``"{arm}: {reward} points"``.

    ## Rewards Safe arm: ``lo_arm_score``. Risky arm: ``hi_arm_hiscore`` w.p.
    ``hi_arm_hiscore_prob`` else ``hi_arm_loscore``. An invalid action (anything but the ints 0 and
    1) gives 0.0, leaves the episode running and returns a reminder of the two choices.

    ## Episode End Terminated after the first valid pull. Stepping after the end returns the last
    observation, reward 0.0, ``terminated=True`` and ``action_is_valid=False``.

    ## Info ``success`` (the risky, higher-mean arm was pulled), ``action_is_valid``,
    ``action_is_effective`` (equal to valid).

    ## Arguments
    - ``split``: ``"train"`` (12 name pairs) or ``"test"`` (8 held-out pairs;
      ``ragen/BanditTest-v0``).
    - ``lo_arm_score`` (0.1), ``hi_arm_loscore`` (0.0), ``hi_arm_hiscore`` (1.0),
      ``hi_arm_hiscore_prob`` (0.25).
    - ``shared_transitions`` (False): ignore the ``transition_seed`` reset option, so envs reset
      with the same seed share the risky arm's reward draw (before per-instance draws existed this
      was the only behaviour).
    - ``expert_policy`` (``"risky"``): the warm-start expert (:meth:`expert_turn`). ``"risky"``
      always pulls the risky arm (a warm start then teaches the answer, success equals the
      format-valid rate); ``"balanced"`` pulls each arm about half the time (a coin drawn from the
      seed, independent of the arm order) with reasoning that does not say which arm is risky, so a
      warm-started model is format-valid but chooses the higher-mean arm about half the time and RL
      has a choice to learn (``configs/bandit.yaml``).
    - ``render_mode``: ``None`` or ``"ansi"``.

    ## Randomness The reset seed decides the arms (name pair and order) and the balanced expert's
    coin: envs reset with the same seed show the same prompt. The risky arm's reward is a transition
    draw: from the stream seeded by ``reset(options={"transition_seed": t})`` (``transition_seeded =
    True``; the trainer gives every member of a group its own ``t``, so members draw independently,
    as in RAGEN), else from ``np_random`` (same seed => same draw). Same seed and same ``t`` =>
    identical episodes.
    """

    branchable = True  # small in-process state: turns may branch (--data.branching.branches)

    transition_seeded = True

    def __init__(
        self,
        split: str = "train",
        lo_arm_score: float = 0.1,
        hi_arm_loscore: float = 0.0,
        hi_arm_hiscore: float = 1.0,
        hi_arm_hiscore_prob: float = 0.25,
        shared_transitions: bool = False,
        expert_policy: str = "risky",
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        if split not in ARM_PAIRS:
            raise ValueError(f"split must be one of {sorted(ARM_PAIRS)}, got {split!r}")
        if not 0.0 <= hi_arm_hiscore_prob <= 1.0:
            raise ValueError(f"hi_arm_hiscore_prob must be in [0, 1], got {hi_arm_hiscore_prob}")
        for name, value in (
            ("lo_arm_score", lo_arm_score),
            ("hi_arm_loscore", hi_arm_loscore),
            ("hi_arm_hiscore", hi_arm_hiscore),
        ):
            if not np.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if expert_policy not in EXPERT_POLICIES:
            raise ValueError(
                f"expert_policy must be one of {EXPERT_POLICIES}, got {expert_policy!r}"
            )
        self.split = split
        self.shared_transitions = bool(shared_transitions)
        self.expert_policy = expert_policy
        self._expert_risky = True
        self.arm_pairs = ARM_PAIRS[split]
        self.lo_arm_score = float(lo_arm_score)
        self.hi_arm_loscore = float(hi_arm_loscore)
        self.hi_arm_hiscore = float(hi_arm_hiscore)
        self.hi_arm_hiscore_prob = float(hi_arm_hiscore_prob)

        self.action_space = spaces.Discrete(2)
        self.observation_space = text_space()
        self.action_names: tuple[str, ...] = ()
        self.lo_arm_name: str | None = None
        self.hi_arm_name: str | None = None
        self._prompt = ""
        self._obs = ""
        self._done = True

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(instruction=INSTRUCTION, action_names=self.action_names)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        self._seed_transitions(self._reset_options(options, (TRANSITION_SEED,)))
        self.lo_arm_name, self.hi_arm_name = self.arm_pairs[
            int(self.np_random.integers(len(self.arm_pairs)))
        ]
        if self.np_random.random() < 0.5:
            self.action_names = (self.lo_arm_name, self.hi_arm_name)
        else:
            self.action_names = (self.hi_arm_name, self.lo_arm_name)
        if self.expert_policy == "balanced":
            # a child stream of the reset seed: the coin does not move np_random (nor the shared
            # reward draw)
            self._expert_risky = bool(self.np_random.spawn(1)[0].random() < 0.5)
        self._prompt = PROMPT_TEMPLATE.format(
            name_a=self.action_names[0], name_b=self.action_names[1]
        )
        self._obs = self._prompt
        self._done = False
        return self._obs, self._info(success=False, valid=True, effective=False)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.lo_arm_name is None:
            raise RuntimeError("BanditEnv: call reset() before step()")
        if self._done:
            return (
                self._obs,
                0.0,
                True,
                False,
                self._info(success=False, valid=False, effective=False),
            )
        arm = as_action(action, 2)
        if arm is None:
            self._obs = INVALID_TEXT.format(
                name_a=self.action_names[0], name_b=self.action_names[1]
            )
            return (
                self._obs,
                0.0,
                False,
                False,
                self._info(success=False, valid=False, effective=False),
            )

        name = self.action_names[arm]
        if name == self.lo_arm_name:
            reward = self.lo_arm_score
        elif self.transition_rng.random() < self.hi_arm_hiscore_prob:
            reward = self.hi_arm_hiscore
        else:
            reward = self.hi_arm_loscore
        self._obs = f"{name}: {reward} points"
        self._done = True
        return (
            self._obs,
            reward,
            True,
            False,
            self._info(success=name == self.hi_arm_name, valid=True, effective=True),
        )

    def _info(self, *, success: bool, valid: bool, effective: bool) -> dict[str, Any]:
        return {"success": success, "action_is_valid": valid, "action_is_effective": effective}

    # The answer is an arm name copied from the prompt and the tiny model learns that copy late:
    # format-valid at temperature 1 was 0.03 after 150 warm-start steps, 0.64 after 300 and 0.92
    # after 500 (its one-turn samples are short: 500 steps took ~2 min on one core).
    warm_start_steps = 500

    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert, by ``expert_policy``.

        ``"risky"``: the risky arm (the higher expected reward), ``hi_arm_name``. The reasoning
        names no arm: the tiny model learns to copy a multi-token arm name slowly, and with one name
        to copy instead of two it answered in format 0.64 vs 0.39 of the time after 300 steps.

        ``"balanced"``: the risky arm or the safe one on a fair coin drawn from the reset seed
        (independent of which arm is listed first); the reasoning only names the arm it tries ("I
        try Pilot"), so nothing in a demonstration tells the arms apart and the answer copies a name
        written just before it. The reasoning is short on purpose: a whole response must fit the
        rollouts' 32 new tokens (``configs/bandit.yaml``). The first version ("I cannot tell which
        arm pays more, so I try one") took 30-36 tokens, so most demonstrations were cut before
        ``</answer>``, the long (mostly risky) names most often: after 1000 warm-start steps
        format-valid 0.70, success 0.18. "I try {arm}" takes 14-27 tokens; measured numbers in the
        config."""
        if self.expert_policy == "balanced":
            arm = self.hi_arm_name if self._expert_risky else self.lo_arm_name
            return f"I try {arm}", (arm,)
        return "the riskier arm pays more on average", (self.hi_arm_name,)

    def _render_text(self) -> str:
        return self._obs
