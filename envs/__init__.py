"""RAGEN's local text environments as exact Gymnasium envs.

``import envs`` registers every id below; ``gymnasium.make("ragen/Sokoban-v0", dim_room=(6, 6), num_boxes=1)``.
This package imports gymnasium and numpy only (never ``ragen_lightning``), so it is reusable on its own.

Preset ids mirror RAGEN's env tags (SimpleSokoban, LargerSokoban, CoordSokoban, SokobanDifferentGridVocab,
CoordFrozenLake, BanditTest); their kwargs live next to each env class (``PRESETS``) and can still be overridden
through ``gymnasium.make(id, **kwargs)``.
"""

from __future__ import annotations

import gymnasium as gym

from envs.base import PromptSpec, TextEnv, text_space

# id -> (entry point, default kwargs)
ENV_IDS: dict[str, tuple[str, dict]] = {
    "ragen/Sokoban-v0": ("envs.sokoban:SokobanEnv", {}),
    "ragen/SimpleSokoban-v0": ("envs.sokoban:SokobanEnv", {"preset": "SimpleSokoban"}),
    "ragen/LargerSokoban-v0": ("envs.sokoban:SokobanEnv", {"preset": "LargerSokoban"}),
    "ragen/CoordSokoban-v0": ("envs.sokoban:SokobanEnv", {"preset": "CoordSokoban"}),
    "ragen/SokobanDifferentGridVocab-v0": ("envs.sokoban:SokobanEnv", {"preset": "SokobanDifferentGridVocab"}),
    "ragen/FrozenLake-v0": ("envs.frozen_lake:FrozenLakeEnv", {}),
    "ragen/CoordFrozenLake-v0": ("envs.frozen_lake:FrozenLakeEnv", {"observation_format": "grid_coord"}),
    "ragen/Bandit-v0": ("envs.bandit:BanditEnv", {}),
    "ragen/BanditTest-v0": ("envs.bandit:BanditEnv", {"split": "test"}),
    "ragen/Countdown-v0": ("envs.countdown:CountdownEnv", {}),
    "ragen/MetaMathQA-v0": ("envs.metamathqa:MetaMathQAEnv", {}),
    "ragen/Sudoku-v0": ("envs.sudoku:SudokuEnv", {}),
    "ragen/2048-v0": ("envs.game_2048:Game2048Env", {}),
    "ragen/RubiksCube-v0": ("envs.rubiks_cube:RubiksCubeEnv", {}),
    "ragen/SearchQA-v0": ("envs.searchqa:SearchQAEnv", {}),
    "ragen/DeepCoder-v0": ("envs.deepcoder:DeepCoderEnv", {}),
    "ragen/Lean-v0": ("envs.lean:LeanEnv", {}),  # needs a backend: server_url / lean_project (envs/lean.py)
    "ragen/WebShop-v0": ("envs.webshop:WebShopEnv", {}),
    "ragen/PropProof-v0": ("envs.prop_proof:PropProofEnv", {}),
}

for _id, (_entry, _kwargs) in ENV_IDS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry, kwargs=dict(_kwargs))

# A client of an env served over HTTP (``python -m envs.serve <env_id>``, envs/remote.py): not in ENV_IDS, whose
# entries are the tasks themselves, because it needs a server to talk to.
REMOTE_ID = "ragen/Remote-v0"
if REMOTE_ID not in gym.registry:
    gym.register(id=REMOTE_ID, entry_point="envs.remote:RemoteEnv")

__all__ = ["ENV_IDS", "REMOTE_ID", "PromptSpec", "TextEnv", "text_space"]
