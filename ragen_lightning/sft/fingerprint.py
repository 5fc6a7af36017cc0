"""The warm start's cache key: what decides a warm-started folder (the recipe's arguments, the base
model, the demonstration code's fingerprint and the recipe version), and the env-side defaults the
key reads (the step hint, the demonstration env arguments)."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

# Bump when the training recipe changes in a way the arguments do not show.
# 2: the shared-prefix SFT forward (same loss; gradients equal to float rounding, so other bits).
# 3: shuffled batches instead of length-grouped ones (see shuffled_batches).
WARM_VERSION = 3
DEFAULT_STEPS = 150  # for an env that gives no ``warm_start_steps`` hint


def _env_class(env_id: str, env_kwargs: dict[str, Any] | None) -> type:
    from ragen_lightning.rollout.runner import make_env

    env = make_env(env_id, env_kwargs)
    try:
        return type(env.unwrapped)
    finally:
        env.close()


def default_steps(env_id: str, env_kwargs: dict[str, Any] | None = None) -> int:
    """Optimizer steps of a warm start when none are given: the env's own ``warm_start_steps`` hint,
    else 150."""
    return int(getattr(_env_class(env_id, env_kwargs), "warm_start_steps", DEFAULT_STEPS))


def demonstration_kwargs(env_id: str, env_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``env_kwargs`` less the env's ``reward_only_kwargs`` (reward settings such as Sokoban's
    ``distance_reward``: they change no observation and no expert action, so the same demonstrations
    and the same cached warm start serve every value)."""
    kwargs = dict(env_kwargs or {})
    if not kwargs:
        return kwargs
    reward_only = set(getattr(_env_class(env_id, env_kwargs), "reward_only_kwargs", ()))
    return {k: v for k, v in kwargs.items() if k not in reward_only}


def code_fingerprint(env_id: str, env_kwargs: dict[str, Any] | None = None) -> str:
    """Hash of the source files that decide the demonstrations: the expert engine, the modules of
    the env class and its own base classes (the expert policy is an env method) and the modules of
    their package those use. Editing any of them (a better expert, a changed level generator) must
    not reuse a warm start built from the old demonstrations.

    Read once per env class and process: the code this process runs is the code it imported, so a
    source file edited during a run (its validation, then its fit, each look the warm start up) does
    not send it to rebuild."""
    return _class_fingerprint(_env_class(env_id, env_kwargs))


@functools.cache
def _class_fingerprint(env_class: type) -> str:
    import inspect

    from ragen_lightning.sft import experts

    owners = [
        c
        for c in env_class.__mro__
        if c.__module__.split(".")[0] not in ("builtins", "gymnasium", "typing")
    ]
    modules = dict.fromkeys(inspect.getmodule(c) or c for c in owners)
    h = hashlib.sha256()
    for obj in (experts, *modules, *_package_helpers([m for m in modules if inspect.ismodule(m)])):
        try:
            h.update(Path(inspect.getfile(obj)).read_bytes())
        # built-in or source not on disk: the class name is the best we have
        except (TypeError, OSError):
            h.update(getattr(obj, "__qualname__", repr(obj)).encode())
    return h.hexdigest()[:16]


def _package_helpers(roots: list[Any]) -> list[Any]:
    """The modules of the env's own package that ``roots`` use, transitively (the level generator,
    the board renderer or the reward an env module imports from a sibling), sorted by name;
    ``roots`` themselves left out."""
    import inspect

    seen = {m.__name__: m for m in roots}
    todo = list(roots)
    while todo:
        module = todo.pop()
        package = module.__name__.split(".")[0]
        for value in list(vars(module).values()):
            used = value if inspect.ismodule(value) else inspect.getmodule(value)
            name = getattr(used, "__name__", "")
            if used is not None and name.split(".")[0] == package and name not in seen:
                seen[name] = used
                todo.append(used)
    own = {m.__name__ for m in roots}
    return [seen[name] for name in sorted(seen) if name not in own]


def warm_start_key(model: str, base_path: str | Path, args: dict[str, Any], code: str = "") -> str:
    """The cache key: every argument, the base model folder's name, the demonstration code's
    fingerprint and the recipe version."""
    payload = {
        "model": model,
        "base": Path(base_path).name,
        "args": args,
        "code": code,
        "version": WARM_VERSION,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[
        :16
    ]
