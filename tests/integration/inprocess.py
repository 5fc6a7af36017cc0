"""``python main.py <argv>`` run in the test's own process: what main.py does (``sys.argv`` set,
:func:`ragen_lightning.cli.main` called with no ``args``, so a configuration error is one line on
stderr and ``SystemExit(2)``, as from the shell), without the ~7 s of interpreter, torch and
Lightning start-up a subprocess pays.

The process state a run may change is put back afterwards, so runs do not leak into each other or
into later tests of the same pytest worker: the environment (main() sets ``HF_HUB_OFFLINE``,
``TOKENIZERS_PARALLELISM``, ``VLLM_LOGGING_LEVEL``; ``seed_everything`` sets ``PL_GLOBAL_SEED``),
``sys.argv``, the working folder, the warnings filters (``filter_harmless_warnings``), every
logger's level, handlers and filters, torch's default dtype, thread count (and
``torch.set_num_threads`` itself, which vLLM's CPU worker replaces), deterministic flags, matmul
precision and grad mode, the random states of ``random``, numpy and torch, the gymnasium
registry and the signal handlers Lightning installs during a fit.

Output is not captured here: a test reads it with pytest's ``capfd`` (the run writes to the
process's own stdout and stderr, as main.py would).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

import envs  # noqa: F401  (main.py imports it: the ragen/* gymnasium ids the configs name)
from ragen_lightning.cli import StarPOCLI, main

_SIGNALS = tuple(
    s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None)) if s is not None
)


@dataclass
class Outcome:
    """How ``main.py`` ended: ``code`` its exit status (0 when main() returned), ``cli`` the
    :class:`StarPOCLI` it returned (None when it exited)."""

    code: int
    cli: StarPOCLI | None


def run_main(argv: Sequence[str], cwd: Path | str) -> Outcome:
    """``python main.py *argv`` in folder ``cwd``, in this process (see the module docstring). An
    exception other than ``SystemExit`` propagates, as a traceback would end the process."""
    with isolated_process_state(cwd):
        sys.argv = ["main.py", *map(str, argv)]
        try:
            cli = main()
        except SystemExit as e:
            return Outcome(_exit_status(e.code), None)
        return Outcome(0, cli)


def _exit_status(code: object) -> int:
    """The status ``sys.exit(code)`` gives the process: None is 0, an integer itself, anything else
    (a message printed to stderr) 1."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


@contextlib.contextmanager
def isolated_process_state(cwd: Path | str) -> Iterator[None]:
    """Run the body in ``cwd`` and put the process state it may change back afterwards."""
    import gymnasium

    environ = dict(os.environ)
    argv, old_cwd = list(sys.argv), os.getcwd()
    registry = dict(gymnasium.envs.registration.registry)
    loggers = _logger_states()
    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    torch_state = _torch_state()
    rng = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
    try:
        os.chdir(cwd)
        with warnings.catch_warnings():
            yield
    finally:
        os.chdir(old_cwd)
        sys.argv[:] = argv
        if dict(os.environ) != environ:
            os.environ.clear()
            os.environ.update(environ)
        gymnasium.envs.registration.registry.clear()
        gymnasium.envs.registration.registry.update(registry)
        _restore_loggers(loggers)
        for s, handler in handlers.items():
            if handler is not None:
                signal.signal(s, handler)
        _restore_torch_state(torch_state)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.random.set_rng_state(rng[2])


def _torch_state() -> dict:
    return {
        "dtype": torch.get_default_dtype(),
        "threads": torch.get_num_threads(),
        # vLLM's CPU worker replaces it for the rest of the process (a no-op that logs a warning)
        "set_num_threads": torch.set_num_threads,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn": (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic),
        "matmul": torch.get_float32_matmul_precision(),
        "grad": torch.is_grad_enabled(),
    }


def _restore_torch_state(state: dict) -> None:
    torch.set_default_dtype(state["dtype"])
    torch.set_num_threads = state["set_num_threads"]
    if torch.get_num_threads() != state["threads"]:
        torch.set_num_threads(state["threads"])
    torch.use_deterministic_algorithms(state["deterministic"], warn_only=state["warn_only"])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = state["cudnn"]
    torch.set_float32_matmul_precision(state["matmul"])
    torch.set_grad_enabled(state["grad"])


def _logger_states() -> dict[str, tuple]:
    """Every existing logger's (level, handlers, filters, propagate, disabled), the root's under
    ``""``."""
    manager = logging.Logger.manager
    loggers = {
        name: logger
        for name, logger in manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    loggers[""] = logging.getLogger()
    return {
        name: (lg.level, list(lg.handlers), list(lg.filters), lg.propagate, lg.disabled)
        for name, lg in loggers.items()
    }


def _restore_loggers(states: dict[str, tuple]) -> None:
    """Loggers that existed get their state back. Loggers created during the run are left as they
    are: a library imported by the run configures its own logger at import (vLLM's level comes from
    ``VLLM_LOGGING_LEVEL``, which main() sets), as it would in a fresh process."""
    manager = logging.Logger.manager
    for name, (level, handlers, filters, propagate, disabled) in states.items():
        logger = manager.loggerDict.get(name) if name else logging.getLogger()
        if not isinstance(logger, logging.Logger):
            continue
        # set directly: Logger.setLevel clears every logger's cache, once per logger restored
        logger.level = level
        logger.handlers[:] = handlers
        logger.filters[:] = filters
        logger.propagate, logger.disabled = propagate, disabled
    manager._clear_cache()


@pytest.fixture(autouse=True)
def in_process(tmp_path: Path) -> Iterator[None]:
    """A module that imports this fixture runs ``main()`` in this process: in ``tmp_path``, with the
    process state it may change (the environment, warnings filters, loggers, torch flags, random
    states, ...) put back after each test (:func:`isolated_process_state`)."""
    with isolated_process_state(tmp_path):
        yield
