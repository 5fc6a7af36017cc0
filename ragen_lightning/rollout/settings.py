"""The episode settings: how one multi-turn episode is shaped, declared once.

The rollout runner, the RL data module, the demonstration data module, the expert demonstrations and
the warm start all take the same :class:`EpisodeSettings` object (``--data.episode.*`` on the
command line), so the demonstrations the warm start trains on have exactly the format of the
rollouts RL samples, and no copy of the keyword list can drift (a test asserts the names are
declared in this one signature). ``python main.py evaluate`` and ``python main.py warm_start`` take
the same group under the same key (``--data.episode.*``), as they take :class:`EngineSettings`
(``--data.engine.*``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, TypeVar

from ragen_lightning.errors import ConfigError, Domain, check_domains

ContextWindow = Literal["full", "limited", "single_turn"]
CONTEXT_WINDOWS: tuple[str, ...] = ("full", "limited", "single_turn")
ActionFormat = Literal["text", "tool_call"]
ACTION_FORMATS: tuple[str, ...] = ("text", "tool_call")
FLAG_PREFIX = "--data.episode."


# seconds an env reset or step may take by default (EpisodeSettings.step_timeout_s explains the
# figure)
DEFAULT_STEP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class EpisodeSettings:
    """Shape of one episode: turns, action budgets, response and context limits, answer format.

    Args:
        max_turns: assistant turns per episode at most.
        max_actions_per_turn: env actions executed per turn at most (extra parsed actions are
        ignored; the expert
            proposes this many).
        max_actions_per_episode: the episode's action budget, shown in the prompt (RAGEN's
        ``max_actions_per_traj``). max_new_tokens: sampled tokens per turn at most (RAGEN's
        ``response_length``; announced in the prompt). context_window: ``full`` (the whole
        conversation, one sample per episode), ``limited`` (system message and
            the last ``window_turns`` turns, one sample per turn) or ``single_turn`` (one user message summarising
            the last ``window_turns - 1`` turns, one sample per turn).
        window_turns: turns kept in the prompt in the ``limited`` / ``single_turn`` modes, the
        current one included. max_model_len: hard limit on prompt + response tokens; an episode
        whose next turn would not fit ends early.
            At most 2**20 (and the model's own maximum positions where its config names them).
        enable_think: ask for (and parse) ``<think>...</think>`` reasoning before the answer.
        observation_last: put each turn's instruction line (actions left, answer format, length)
        before
            ``State:`` instead of after it (RAGEN's order), so the observation directly precedes the response. The
            embedded 4-layer model learns to read a grid behind a ~240-token system prompt only this
            way (``benchmarks/grid_reading.py``: 0.79 exact after 500 steps with the state last,
            0.29 with RAGEN's ~45-token instruction line between the grid and the answer;
            docs/learning.md).
        format_penalty: score added for every turn with an invalid or missing action. action_format:
        how the model acts: ``text`` (RAGEN's: the actions inside ``<answer>...</answer>``,
        separated
            by ``||``) or ``tool_call`` (the env's tools offered through the chat template's ``tools=`` list, each
            action one ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block, Qwen2.5's
            format; the results come back as ``tool`` messages; needs an env that declares tools and
            a template that renders them, e.g. Qwen2.5's: ``rollout/tool_calls.py``,
            docs/environments.md). A malformed call is an invalid action (the format penalty).
        stop: stop strings of every turn (e.g. ``["</answer>"]``): a turn ends with the token that
        completes one, and
            those tokens stay in the response, token for token, as sampled. The expert demonstrations of a warm start
            do not use them (an expert answer ends with ``</answer>`` and the end-of-turn token
            either way).
        max_workers: env steps (and resets) of one turn run concurrently on this many worker
        threads; 1 runs them
            one after another (on one worker thread while ``step_timeout_s`` is set, else in the rollout's own
            thread), which is fastest for the in-process envs (microseconds per step); raise it for
            slow or remote envs.
        step_timeout_s: seconds one env reset or step may take (None = no limit); a step over it
        ends its episode
            with a recorded error and its worker thread is abandoned (a thread cannot be killed: a hung env keeps
            it until the env returns; it is a daemon thread, so it never blocks the run's exit). The
            default, 600 s (:data:`DEFAULT_STEP_TIMEOUT_S`), is above the worst case of every
            built-in env: a DeepCoder step is one sandbox run of at most ``wall_seconds`` (4 s), a
            Lean check at most ``http_timeout`` (60 s) per attempt over 1 + ``max_retries`` (3)
            attempts (240 s), a SearchQA search through a retrieval server at most
            ``retrieval_timeout`` (30 s) x 3 attempts (90 s), a ``ragen/Remote-v0`` call at most
            ``timeout_s`` (60 s) x 1 + ``retries`` (3) attempts plus backoff (~242 s); so only a
            hung env reaches it. Results are collected in episode order whatever the timeout, so it
            never changes a rollout.
    """

    max_turns: int = 5
    max_actions_per_turn: int = 2
    max_actions_per_episode: int = 10
    max_new_tokens: int = 100
    context_window: ContextWindow = "full"
    window_turns: int = 2
    max_model_len: int = 4096
    enable_think: bool = True
    observation_last: bool = False
    format_penalty: float = -0.1
    action_format: ActionFormat = "text"
    stop: tuple[str, ...] = ()
    max_workers: int = 1
    step_timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S

    def __post_init__(self) -> None:
        check_domains(FLAG_PREFIX, self, _DOMAINS)
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ConfigError(
                f"{FLAG_PREFIX}stop must be a list of non-empty strings, got {self.stop!r}"
            )
        # a YAML list arrives as a list; keep it hashable
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.action_format not in ACTION_FORMATS:
            raise ConfigError(
                f"{FLAG_PREFIX}action_format must be 'text' or 'tool_call', got {self.action_format!r}"
            )
        if self.context_window not in CONTEXT_WINDOWS:
            raise ConfigError(
                f"{FLAG_PREFIX}context_window must be 'full', 'limited' or 'single_turn', "
                f"got {self.context_window!r}"
            )

    def demonstration_fields(self) -> dict[str, Any]:
        """The settings that shape expert demonstrations (every field but ``format_penalty``, which
        only moves the RL score, and the rollout layer's ``stop``, ``max_workers`` and
        ``step_timeout_s``, which the expert's answers and the env's transitions do not depend on);
        the warm start's cache key hashes exactly these."""
        fields = asdict(self)
        for name in ("format_penalty", "stop", "max_workers", "step_timeout_s"):
            fields.pop(name)
        # RAGEN's order: the keys of warm starts built before the option
        if not fields["observation_last"]:
            fields.pop("observation_last")
        # likewise: the keys of warm starts built before tool calls
        if fields["action_format"] == "text":
            fields.pop("action_format")
        return fields


_COUNT = Domain(low=1, integer=True)
# 1M tokens, the longest context of open models; vLLM also refuses more than the model's own
MAX_MODEL_LEN = 1 << 20
_DOMAINS = {
    "max_turns": _COUNT,
    "max_actions_per_turn": _COUNT,
    "max_actions_per_episode": _COUNT,
    "max_new_tokens": _COUNT,
    "window_turns": _COUNT,
    "max_model_len": Domain(1, MAX_MODEL_LEN, integer=True),
    "format_penalty": Domain(high=0),
    "max_workers": _COUNT,
    # the penalty is added to the score
    "step_timeout_s": Domain(low=0, low_open=True, none=True),
}


# -- the rollout engine
# ------------------------------------------------------------------------------------------
ENGINE_PREFIX = "--data.engine."
VLLM_PREFIX = "--data.engine.vllm."
EngineName = Literal["hf", "vllm", "auto"]
ENGINES: tuple[str, ...] = ("hf", "vllm", "auto")


@dataclass(frozen=True)
class VLLMSettings:
    """Settings of the vLLM rollout engine (``--data.engine.name vllm``):
    ``--data.engine.vllm.<name>``.

    Args:
        gpu_memory_utilization: fraction of GPU memory vLLM may take (weights + KV cache); the
            actor, its optimizer and activations need the rest.
        enforce_eager: no CUDA graphs (less memory and start-up time, slower decode).
        max_model_len: vLLM's context length; None = ``--data.episode.max_model_len``.
        tensor_parallel_size: training ranks one engine shards over (``k``). With ``k > 1`` the run
            needs a multiple of ``k`` processes: vLLM is built with
            ``distributed_executor_backend="external_launcher"``, each rank is one worker (its own
            GPU), ranks ``[d*k, (d+1)*k)`` form one engine that gets the same prompts and seeds from
            each of them, and the ``W / k`` engines split the env groups.
        sleep_level: 0 = never sleep; 1 = offload weights and drop the KV cache during the update
            (default); 2 = drop the weights too, so every sync pushes every weight (also for a LoRA
            actor). vLLM ignores sleep on CPU.
        dtype: vLLM's dtype; None = the dtype the actor computes in (its parameters'; under FSDP2 on
            GPUs the mixed-precision bf16).
        seed: seed of the engine's sampler; None = ``--data.training.seed``.
        probe_threshold: largest allowed max |log-prob difference| between vLLM and the trainer on
            the probe batch; None = 1e-3 when vLLM and the trainer both compute in float32, else 0.1
            (16-bit rounding alone differs by ~1e-2).
        probe_size: prompts of the run (with their sampled continuations) kept for the probe batch,
            besides one fixed synthetic sequence.
        probe_max_tokens: tokens per probe sequence at most.
        cpu_kvcache_gib: KV cache size on CPU in GiB (sets ``VLLM_CPU_KVCACHE_SPACE`` unless it is
            set already).
        full_push: push every weight even for a LoRA actor (otherwise only the blocks with an
            adapter).
    """

    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    sleep_level: int = 1
    dtype: str | None = None
    seed: int | None = None
    probe_threshold: float | None = None
    probe_size: int = 2
    probe_max_tokens: int = 64
    cpu_kvcache_gib: int = 1
    full_push: bool = False

    def __post_init__(self):
        check_domains(VLLM_PREFIX, self, _VLLM_DOMAINS)
        if self.sleep_level not in (0, 1, 2):
            raise ConfigError(f"{VLLM_PREFIX}sleep_level must be 0, 1 or 2, got {self.sleep_level}")


_VLLM_DOMAINS = {
    "gpu_memory_utilization": Domain(0, 1, low_open=True),
    "max_model_len": Domain(low=1, integer=True, none=True),
    "tensor_parallel_size": Domain(low=1, integer=True),
    "seed": Domain(low=0, integer=True, none=True),
    "probe_threshold": Domain(low=0, low_open=True, none=True),
    "probe_size": Domain(low=0, integer=True),
    "probe_max_tokens": Domain(low=2, integer=True),
    "cpu_kvcache_gib": Domain(low=1, integer=True),
}


@dataclass(frozen=True)
class EngineSettings:
    """The rollout engine (``--data.engine.*``; ``python main.py evaluate`` and ``warm_start`` take
    the same).

    Args:
        name: ``hf`` (transformers, samples with the actor itself), ``vllm`` (an in-process vLLM
            engine whose weights are pushed from the actor before every rollout and checked by the
            sync probe; needs vLLM) or ``auto`` (``vllm`` when installed and the actor is not 4-bit,
            else ``hf``).
        max_batch_size: generation requests decoded together at most.
        vllm: the vLLM engine's settings (:class:`VLLMSettings`).
    """

    name: EngineName = "hf"
    max_batch_size: int = 128
    vllm: VLLMSettings = VLLMSettings()

    def __post_init__(self) -> None:
        if self.name not in ENGINES:
            raise ConfigError(
                f"{ENGINE_PREFIX}name must be one of {', '.join(ENGINES)}, got {self.name!r}"
            )
        Domain(low=1, integer=True).check(f"{ENGINE_PREFIX}max_batch_size", self.max_batch_size)
        object.__setattr__(self, "vllm", as_settings(VLLMSettings, self.vllm, VLLM_PREFIX[:-1]))

    @property
    def tensor_parallel_size(self) -> int:
        """Ranks one rollout engine spans: ``vllm.tensor_parallel_size``, 1 for the HF engine."""
        return 1 if self.name == "hf" else int(self.vllm.tensor_parallel_size)


S = TypeVar("S")


def as_settings(cls: type[S], value: S | dict[str, Any] | None, flag: str) -> S:
    """``value`` as the settings dataclass ``cls``: an instance as is, a mapping (parsed YAML,
    hyperparameters, a jsonargparse Namespace) field by field (an unknown key names ``flag.<key>``),
    None: the defaults."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a mapping of its settings, got {value!r}")
    names = [f.name for f in fields(cls)]
    if unknown := [k for k in value if k not in names]:
        raise ConfigError(f"{flag}.{unknown[0]} is not a setting; {flag} has: {', '.join(names)}")
    return cls(**value)


def as_episode(value: EpisodeSettings | dict[str, Any] | None) -> EpisodeSettings:
    """``value`` as :class:`EpisodeSettings` (None: the defaults; a mapping: its keys over the
    defaults)."""
    if value is None:
        return EpisodeSettings()
    if isinstance(value, EpisodeSettings):
        return value
    if hasattr(value, "as_dict"):  # a jsonargparse Namespace
        value = value.as_dict()
    return EpisodeSettings(**dict(value))
