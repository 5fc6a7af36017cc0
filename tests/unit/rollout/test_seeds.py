"""Episode reset seeds: independent, reproducible streams (the warm start's, the evaluation's, the
mixture's)."""

from __future__ import annotations

from ragen_lightning.rollout.seeds import episode_seeds


def test_episode_seeds_are_deterministic_distinct_and_held_out():
    train = episode_seeds(0, 50, "train")
    assert train == episode_seeds(0, 50, "train") and len(set(train)) == 50
    assert train != episode_seeds(1, 50, "train")
    val = episode_seeds(0, 20, "val", exclude=train)
    assert not set(val) & set(train)
    # excluded values are skipped, order kept
    forced = episode_seeds(0, 5, "train", exclude=train[:3])
    assert forced == train[3:8]


def test_episode_seeds_are_the_streams_every_cache_and_figure_was_made_with():
    # values of the function before it moved out of sft/module.py: warm-start demonstrations,
    # evaluation levels and mixture streams all depend on them
    assert episode_seeds(0, 4, "train") == [1550685491, 1070947487, 3995159866, 784084172]
    assert episode_seeds(7, 3, "eval", exclude=episode_seeds(7, 5, "train")) == [
        1807931572,
        1781646963,
        1853426620,
    ]
    assert episode_seeds(10000, 2, "train/bandit/3") == [636034886, 2041040921]
