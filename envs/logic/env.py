"""Tactic proofs of generated propositional theorems, checked exactly by the project
(``ragen/PropProof-v0``).

This is NOT Lean and runs no Lean: it is a CPU-trainable stand-in for RAGEN's Lean env, so
multi-turn proof repair (write a tactic, read the compiler-like error and the goal state, fix it)
can be trained and tested anywhere. The formulas live in :mod:`envs.logic.formulas`, the tactic
language and its checker in
:mod:`envs.logic.checker`, the proof search (the expert) in :mod:`envs.logic.prover` and the theorem
generator in :mod:`envs.logic.theorems`.

Rewards mirror RAGEN's Lean env: every step ``step_penalty`` (-0.1) plus ``valid_step_reward`` when
the tactic is accepted or ``invalid_step_reward`` (-1) when it is rejected, ``success_reward`` (+10)
when the last goal closes, ``max_steps_penalty`` (-2) when the step limit ends the episode with
goals left. RAGEN's Lean timeout penalty has no counterpart (the checker is exact and bounded).
Departure: ``valid_step_reward`` defaults to +0.1, not RAGEN's +1: with +1 every accepted tactic
nets +0.9, and an agent that repeats an accepted tactic that proves nothing (``exfalso`` on the
target ``False``) earns more over a long episode than a short proof (RAGEN's 100 steps: about 88
against 10 + a few); at +0.1 an accepted step nets 0 and only the proof pays. Pass
``valid_step_reward=1.0`` for RAGEN's values.
"""

from __future__ import annotations

from typing import Any

from gymnasium import spaces

from envs.base import PromptSpec, TextEnv, bounded_int, text_space
from envs.logic.checker import MAX_TACTIC_CHARS, ProofError, apply_tactic
from envs.logic.formulas import (
    FormulaSyntaxError,
    State,
    initial_state,
    parse_formula,
    show,
    state_text,
)
from envs.logic.prover import prove_state
from envs.logic.theorems import SPLITS, draw_theorem

INSTRUCTION = (
    "You are proving a theorem of propositional logic with tactics (a checker of this project, not Lean). The state "
    "shows the goals: hypotheses 'name : formula' and the target after '|-'. ~A means A -> False. Tactics: intro h1 "
    "h2, exact t, apply t, assumption, constructor, left, right, cases h with a b, specialize h t, exfalso, "
    "contradiction. Terms t: hypothesis names, application (h1 h2), h.1, h.2, And.intro a b, Or.inl a, Or.inr b, "
    "False.elim h, absurd a na. Tactics act on the first goal; an error leaves the state unchanged. Example answer "
    "format: <think>the goal is an implication</think><answer>intro h1 || exact h1</answer>"
)
OBS_MAX_CHARS = 8192
_SAMPLE_TACTICS = (
    "intro h1",
    "intro h1 h2",
    "intro h1 h2 h3",
    "exact h1",
    "exact h2",
    "exact h1 h2",
    "apply h1",
    "apply h2",
    "assumption",
    "constructor",
    "left",
    "right",
    "cases h1 with h4 h5",
    "cases h2 with h4 h5",
    "specialize h1 h2",
    "exfalso",
    "contradiction",
    "exact h1.1",
    "exact Or.inl h1",
    "exact And.intro h1 h2",
    "intros",
    "done",
)
_SHAPES = {
    "imp": "an implication",
    "not": "a negation",
    "and": "a conjunction",
    "or": "a disjunction",
    "false": "False",
    "atom": "an atom",
}


class _TacticActions(spaces.Text):
    """The action space: text. ``sample()`` draws tactic lines (most of them well-formed, over the
    names ``h1..h5``) so random agents, ``check_env`` and the benchmark meet accepted steps and real
    error messages, not strings that never parse."""

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        return _SAMPLE_TACTICS[int(self.np_random.integers(len(_SAMPLE_TACTICS)))]


class PropProofEnv(TextEnv):
    """Prove a generated propositional theorem with tactics; each step is a tactic line (not Lean).

    ## Description
    At reset the seed draws a theorem of ``split`` (``train``/``val``/``test``: disjoint by the theorem's text, see
    :func:`envs.logic.theorems.split_of`) built by ``depth`` sound construction steps over
    ``num_atoms`` propositions, so it is provable (and the proof search proves it). Each step is one
    tactic line (several tactics separated by ``;`` are checked as one block); the checker applies
    it to the first goal or rejects it with a compiler-like error, leaving the state unchanged.

    ## Action Space
    ``Text`` (printable ASCII, up to 512 characters). ``action_names`` is empty.

    ## Observation Space
    ``Text`` over printable ASCII. Reset: the goal view (``"1 goal\\n|- p -> p"``; hypotheses ``name : formula``
    above ``|-``, goals separated by blank lines, at most 4 shown). After an accepted tactic: the new goal view, or
    ``"no goals\\nProof complete."``. After a rejected one: ``"error: <message>\\n"`` and the unchanged goal view.
    When the step limit ends the episode: the view, then ``"error: unsolved goals (step limit N reached)"``.

    ## Rewards
    ``step_penalty`` + (``valid_step_reward`` if accepted else ``invalid_step_reward``) + ``success_reward`` when
    the proof completes + ``max_steps_penalty`` when the step limit ends it unproved (module docstring).

    ## Episode End
    Terminated when no goals are left (success). Truncated after ``max_steps`` steps. Stepping after the end
    returns the last observation, reward 0.0, the same flags and ``action_is_valid=False``.

    ## Info
    ``success`` (proof complete), ``action_is_valid`` (the tactic was accepted), ``action_is_effective`` (accepted
    and the state changed), ``goals`` (open goals), ``error`` (the message, '' when accepted).

    ## Arguments
    - ``depth`` (3): construction steps of a generated theorem (the difficulty knob; proofs get longer with it).
    - ``num_atoms`` (4): propositions ``p, q, r, ...`` (1 to 8).
    - ``split`` (``"train"``): which split's theorems are drawn.
    - ``max_steps`` (10): steps per episode.
    - ``step_penalty`` (-0.1), ``valid_step_reward`` (0.1), ``invalid_step_reward`` (-1.0), ``success_reward``
      (10.0), ``max_steps_penalty`` (-2.0).
    - ``render_mode``: ``None`` or ``"ansi"``.

    ## Options
    ``reset(options={"theorem": "p /\\\\ q -> q /\\\\ p"})`` poses a given formula (ASCII syntax of
    :mod:`envs.logic.formulas`) instead of a generated one.
    """

    def __init__(
        self,
        depth: int = 3,
        num_atoms: int = 4,
        split: str = "train",
        max_steps: int = 10,
        step_penalty: float = -0.1,
        valid_step_reward: float = 0.1,
        invalid_step_reward: float = -1.0,
        success_reward: float = 10.0,
        max_steps_penalty: float = -2.0,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        depth = bounded_int("PropProofEnv", "depth", depth, 0, 12)
        num_atoms = bounded_int("PropProofEnv", "num_atoms", num_atoms, 1, 8)
        max_steps = bounded_int("PropProofEnv", "max_steps", max_steps, 1, 1000)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
        self.depth, self.num_atoms, self.split, self.max_steps = depth, num_atoms, split, max_steps
        self.step_penalty, self.valid_step_reward = float(step_penalty), float(valid_step_reward)
        self.invalid_step_reward, self.success_reward = (
            float(invalid_step_reward),
            float(success_reward),
        )
        self.max_steps_penalty = float(max_steps_penalty)
        self.observation_space = text_space(max_length=OBS_MAX_CHARS)
        self.action_space = _TacticActions(
            min_length=0, max_length=MAX_TACTIC_CHARS, charset=text_space().character_set
        )
        self.theorem: tuple | None = None
        self.state: State = ()
        self.step_count = 0
        self._obs = ""
        self._terminated = self._truncated = False

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(instruction=INSTRUCTION)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = self._reset_options(options, ("theorem",))
        if "theorem" in options:
            try:
                self.theorem = parse_formula(options["theorem"])
            except FormulaSyntaxError as exc:
                raise ValueError(f"PropProofEnv.reset: options['theorem']: {exc}") from None
        else:
            self.theorem = draw_theorem(self.np_random, self.depth, self.num_atoms, self.split)
        self.state = initial_state(self.theorem)
        self.step_count = 0
        self._terminated = self._truncated = False
        self._obs = self._view()
        return self._obs, self._info(False, True, False, "")

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.theorem is None:
            raise RuntimeError("PropProofEnv: call reset() before step()")
        if self._terminated or self._truncated:
            return (
                self._obs,
                0.0,
                self._terminated,
                self._truncated,
                self._info(False, False, False, "episode ended"),
            )
        self.step_count += 1
        before = self.state
        try:
            self.state = apply_tactic(self.state, action if isinstance(action, str) else None)
            error = ""
        except ProofError as exc:
            error = str(exc)
        reward = self.step_penalty + (self.invalid_step_reward if error else self.valid_step_reward)
        self._terminated = not self.state
        self._truncated = not self._terminated and self.step_count >= self.max_steps
        if self._terminated:
            reward += self.success_reward
        if self._truncated:
            reward += self.max_steps_penalty
        view = "no goals\nProof complete." if self._terminated else self._view()
        text = f"error: {error}\n{view}" if error else view
        if self._truncated:
            text += f"\nerror: unsolved goals (step limit {self.max_steps} reached)"
        self._obs = _bounded(text)
        info = self._info(self._terminated, not error, not error and self.state != before, error)
        return self._obs, reward, self._terminated, self._truncated, info

    def _view(self) -> str:
        return _bounded(state_text(self.state))

    def _info(self, success: bool, valid: bool, effective: bool, error: str) -> dict[str, Any]:
        return {
            "success": bool(success),
            "action_is_valid": bool(valid),
            "action_is_effective": bool(effective),
            "goals": len(self.state),
            "error": error,
        }

    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert: a proof search from the current state
        (:func:`envs.logic.prover.prove_state`); the next ``max_actions`` tactics of its proof, with
        a sentence naming the shape of the first goal."""
        if self.theorem is None:
            raise RuntimeError("PropProofEnv: call reset() before expert_turn()")
        plan = prove_state(self.state)
        if not plan:
            raise ValueError(
                f"PropProofEnv: the proof search finds no proof of the current goals of "
                f"{show(self.theorem)}"
            )
        target = self.state[0].target
        return f"the goal is {_SHAPES[target[0]]}", tuple(plan[: max(1, int(max_actions))])

    def _render_text(self) -> str:
        return self._obs


def _bounded(text: str) -> str:
    return text if len(text) <= OBS_MAX_CHARS else text[: OBS_MAX_CHARS - 3] + "..."


__all__ = ["INSTRUCTION", "PropProofEnv"]
