"""EpisodeSettings: validation that names the flag, and the settings declared in exactly one
signature."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout.settings import EpisodeSettings, as_episode

LIBRARY = Path(__file__).resolve().parents[3] / "ragen_lightning"
NAMES = tuple(f.name for f in dataclasses.fields(EpisodeSettings))
HOME = "rollout/settings.py:EpisodeSettings"

# Primitives that take ONE value of a setting as a plain argument (they format, parse or size one
# thing and are called by the consumers of EpisodeSettings with that field). A consumer of several
# settings takes the EpisodeSettings object.
PRIMITIVES = {
    "enable_think": {
        "rollout/prompting.py:format_prompt",
        "rollout/prompting.py:generation_prefix",
        "rollout/prompting.py:instruction_line",
        "rollout/prompting.py:parse_response",
        "rollout/tokens.py:ChatTokens.__init__",
        "sft/experts.py:render_response",
        "rollout/tool_calls.py:parse_tool_calls",
        "rollout/tool_calls.py:_split_reasoning",
    },
    "max_actions_per_turn": {
        "rollout/prompting.py:parse_response",
        "rollout/tool_calls.py:parse_tool_calls",
    },
    "observation_last": {"rollout/prompting.py:turn_block"},
    "max_actions_per_episode": {"rollout/prompting.py:system_prompt"},
    "max_new_tokens": {"rollout/engine.py:SamplingParams"},  # the sampling cap handed to an engine
    "stop": {"rollout/engine.py:SamplingParams"},  # the stop strings handed to an engine
    # engines and the memory plan size themselves by the context length; VLLMSettings' is an
    # override (None = the episode's)
    "max_model_len": {
        "rollout/engines.py:build_engine",
        "rollout/settings.py:VLLMSettings",
        "rollout/vllm_engine.py:VLLMEngine.__init__",
        "starpo/module.py:StarPOModule.make_engine",
        "models/memory.py:plan",
    },
}


def _signatures(path: Path) -> dict[str, set[str]]:
    """qualified name -> parameter names, for every function and every dataclass (its fields) in
    ``path``."""
    rel = path.relative_to(LIBRARY).as_posix()
    out: dict[str, set[str]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                out[f"{rel}:{prefix}{child.name}"] = {
                    x.arg for x in a.posonlyargs + a.args + a.kwonlyargs
                }
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                if any("dataclass" in ast.unparse(d) for d in child.decorator_list):
                    out[f"{rel}:{prefix}{child.name}"] = {
                        s.target.id
                        for s in child.body
                        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                    }
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text()), "")
    return out


def test_episode_settings_are_declared_in_one_signature():
    signatures: dict[str, set[str]] = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        signatures.update(_signatures(path))
    assert HOME in signatures and set(NAMES) <= signatures[HOME]
    for name in NAMES:
        declared = {sig for sig, params in signatures.items() if name in params}
        assert declared == {HOME} | PRIMITIVES.get(name, set()), (
            f"{name!r} is declared in {sorted(declared - {HOME})}: take an EpisodeSettings instead"
        )
    # no signature but the dataclass declares two settings, except the two primitive parsers (one
    # per action format) and the per-request record an engine takes (the runner fills its cap and
    # stop strings from the EpisodeSettings)
    for sig, params in signatures.items():
        if sig not in (
            HOME,
            "rollout/prompting.py:parse_response",
            "rollout/tool_calls.py:parse_tool_calls",
            "rollout/engine.py:SamplingParams",
        ):
            assert len(params & set(NAMES)) <= 1, (sig, sorted(params & set(NAMES)))


@pytest.mark.parametrize(
    "field,value",
    [("max_turns", 0), ("window_turns", 0), ("max_new_tokens", -1), ("max_actions_per_turn", 0)],
)
def test_validation_names_the_flag(field, value):
    with pytest.raises(
        ConfigError, match=rf"^--data\.episode\.{field} must be an integer >= 1, got {value}$"
    ):
        EpisodeSettings(**{field: value})


@pytest.mark.parametrize("value", [0, 2**20 + 1])
def test_max_model_len_is_at_least_one_and_at_most_a_million(value):
    with pytest.raises(
        ConfigError,
        match=rf"^--data\.episode\.max_model_len must be an integer in \[1, 1048576\], "
        rf"got {value}$",
    ):
        EpisodeSettings(max_model_len=value)
    assert EpisodeSettings(max_model_len=2**20).max_model_len == 2**20


def test_context_window_and_penalty_are_checked():
    with pytest.raises(ConfigError, match="--data.episode.context_window must be"):
        EpisodeSettings(context_window="sliding")  # type: ignore[arg-type]
    with pytest.raises(
        ConfigError, match=r"^--data.episode.format_penalty must be a finite number <= 0, got 0.5$"
    ):
        EpisodeSettings(format_penalty=0.5)


def test_as_episode_and_demonstration_fields():
    assert as_episode(None) == EpisodeSettings()
    assert as_episode({"max_turns": 2}) == EpisodeSettings(max_turns=2)
    ep = EpisodeSettings(format_penalty=-0.5)
    assert as_episode(ep) is ep
    # the warm-start key hashes these: every field but the RL-only format penalty, and
    # observation_last only when set, action_format only when tool_call (warm starts built before
    # the options keep their keys); the rollout layer's stop strings, worker pool and timeout shape
    # no demonstration (the expert ignores stop strings; transitions do not depend on threads)
    rollout_layer = {"stop", "max_workers", "step_timeout_s"}
    assert (
        set(ep.demonstration_fields())
        == set(NAMES) - {"format_penalty", "observation_last", "action_format"} - rollout_layer
    )
    assert (
        EpisodeSettings(action_format="tool_call").demonstration_fields()["action_format"]
        == "tool_call"
    )
    assert EpisodeSettings(observation_last=True).demonstration_fields()["observation_last"] is True
    assert (
        EpisodeSettings(
            stop=["</answer>"], max_workers=8, step_timeout_s=2.0
        ).demonstration_fields()
        == EpisodeSettings().demonstration_fields()
    )


def test_rollout_layer_settings():
    ep = EpisodeSettings(stop=["</answer>"])  # a YAML list becomes a (hashable) tuple
    assert ep.stop == ("</answer>",) and hash(ep) == hash(EpisodeSettings(stop=("</answer>",)))
    for bad in ("</answer>", [""], [3]):
        with pytest.raises(
            ConfigError, match=r"^--data\.episode\.stop must be a list of non-empty strings"
        ):
            EpisodeSettings(stop=bad)  # type: ignore[arg-type]
    with pytest.raises(
        ConfigError, match=r"^--data\.episode\.max_workers must be an integer >= 1, got 0$"
    ):
        EpisodeSettings(max_workers=0)
    with pytest.raises(ConfigError, match=r"^--data\.episode\.step_timeout_s must be"):
        EpisodeSettings(step_timeout_s=0.0)
    assert EpisodeSettings(step_timeout_s=None).step_timeout_s is None
