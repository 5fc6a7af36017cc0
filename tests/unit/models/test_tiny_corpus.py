"""The tiny model's tokenizer corpus is frozen: registering another env must not change it (its hash
is part of every cached tiny model's and warm start's key)."""

import gymnasium as gym

import envs
from ragen_lightning.models import tiny


def test_corpus_env_ids_are_the_frozen_list_whatever_else_is_registered():
    before = tiny.corpus_env_ids()
    assert before == list(tiny.CORPUS_ENV_IDS)  # all fourteen are registered by the envs package
    # a later task: not in it
    assert "ragen/SearchQA-v0" in envs.ENV_IDS and "ragen/SearchQA-v0" not in before
    extra = "ragen/CorpusProbe-v0"
    gym.register(id=extra, entry_point="envs.text.bandit:BanditEnv")
    try:
        assert tiny.corpus_env_ids() == before
    finally:
        del gym.registry[extra]


def test_an_unlisted_env_drops_out_when_unregistered():
    spec = gym.registry.pop("ragen/RubiksCube-v0")
    try:
        assert tiny.corpus_env_ids() == [
            e for e in tiny.CORPUS_ENV_IDS if e != "ragen/RubiksCube-v0"
        ]
    finally:
        gym.registry["ragen/RubiksCube-v0"] = spec
