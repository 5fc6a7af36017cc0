"""RAGEN's local text environments as exact Gymnasium envs.

``import envs`` registers every id of :data:`ENV_IDS`:
``gymnasium.make("ragen/Sokoban-v0", dim_room=(6, 6), num_boxes=1)``. This package imports gymnasium
and numpy only (never ``ragen_lightning``), so it is reusable on its own.

Layout: ``base.py`` (what every env shares) and a folder per family: ``grid/`` (Sokoban, FrozenLake,
2048, Sudoku, Rubik's Cube), ``text/`` (Bandit, Countdown, MetaMathQA), ``logic/`` (PropProof),
``tools/`` (``search/``, ``webshop/``, ``code/``, ``lean/``: envs whose actions call a tool) and
``serving/`` (envs over HTTP). No family imports another family's private (``_name``) helpers.

Preset ids mirror RAGEN's env tags (SimpleSokoban, LargerSokoban, CoordSokoban,
SokobanDifferentGridVocab, CoordFrozenLake, BanditTest); their kwargs live next to each env class
(``PRESETS``) and can still be overridden through ``gymnasium.make(id, **kwargs)``.
"""

from __future__ import annotations

import gymnasium as gym

from envs.base import PromptSpec, TextEnv, text_space


class EnvIds(dict):
    """id -> (entry point, default kwargs); assigning an entry registers the id with gymnasium.

    So ``ENV_IDS["myorg/Arrow-v0"] = ("mypkg.arrow:ArrowEnv", {})`` registers wherever it stands:
    after the table below or in your own module after ``import envs``. An id gymnasium already
    knows is left as it is.
    """

    def __init__(self, entries: dict[str, tuple[str, dict]] | None = None):
        super().__init__()
        self.update(entries or {})

    def __setitem__(self, env_id: str, entry: tuple[str, dict]) -> None:
        entry_point, kwargs = entry
        super().__setitem__(env_id, entry)
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs))

    def update(self, *args, **kwargs) -> None:
        for env_id, entry in dict(*args, **kwargs).items():
            self[env_id] = entry


ENV_IDS = EnvIds(
    {
        "ragen/Sokoban-v0": ("envs.grid.sokoban.env:SokobanEnv", {}),
        "ragen/SimpleSokoban-v0": ("envs.grid.sokoban.env:SokobanEnv", {"preset": "SimpleSokoban"}),
        "ragen/LargerSokoban-v0": ("envs.grid.sokoban.env:SokobanEnv", {"preset": "LargerSokoban"}),
        "ragen/CoordSokoban-v0": ("envs.grid.sokoban.env:SokobanEnv", {"preset": "CoordSokoban"}),
        "ragen/SokobanDifferentGridVocab-v0": (
            "envs.grid.sokoban.env:SokobanEnv",
            {"preset": "SokobanDifferentGridVocab"},
        ),
        "ragen/FrozenLake-v0": ("envs.grid.frozen_lake:FrozenLakeEnv", {}),
        "ragen/CoordFrozenLake-v0": (
            "envs.grid.frozen_lake:FrozenLakeEnv",
            {"observation_format": "grid_coord"},
        ),
        "ragen/Bandit-v0": ("envs.text.bandit:BanditEnv", {}),
        "ragen/BanditTest-v0": ("envs.text.bandit:BanditEnv", {"split": "test"}),
        "ragen/Countdown-v0": ("envs.text.countdown:CountdownEnv", {}),
        "ragen/MetaMathQA-v0": ("envs.text.metamathqa:MetaMathQAEnv", {}),
        "ragen/Sudoku-v0": ("envs.grid.sudoku.env:SudokuEnv", {}),
        "ragen/2048-v0": ("envs.grid.game_2048:Game2048Env", {}),
        "ragen/RubiksCube-v0": ("envs.grid.rubiks_cube:RubiksCubeEnv", {}),
        "ragen/SearchQA-v0": ("envs.tools.search.env:SearchQAEnv", {}),
        "ragen/DeepCoder-v0": ("envs.tools.code.env:DeepCoderEnv", {}),
        # Lean needs a backend: server_url / lean_project (envs/tools/lean/env.py)
        "ragen/Lean-v0": ("envs.tools.lean.env:LeanEnv", {}),
        "ragen/WebShop-v0": ("envs.tools.webshop.env:WebShopEnv", {}),
        "ragen/PropProof-v0": ("envs.logic.env:PropProofEnv", {}),
    }
)

# A client of an env served over HTTP (``python -m envs.serving.serve <env_id>``, serving/remote):
# not in ENV_IDS, whose entries are the tasks themselves, because it needs a server to talk to.
REMOTE_ID = "ragen/Remote-v0"
if REMOTE_ID not in gym.registry:
    gym.register(id=REMOTE_ID, entry_point="envs.serving.remote:RemoteEnv")

__all__ = ["ENV_IDS", "REMOTE_ID", "EnvIds", "PromptSpec", "TextEnv", "text_space"]
