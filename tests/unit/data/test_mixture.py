"""Environment mixtures: entry parsing, per-tag seeds, the concatenated and sharded rollout, per-tag
metrics and reward normalisation by env (scripted engines and hand-built trajectories, no model)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import envs  # noqa: F401
from ragen_lightning.data import mixture as mix
from ragen_lightning.data.batching import build_batch, normalize_scores
from ragen_lightning.data.checks import check_world_size
from ragen_lightning.data.suite import SuiteEntry, as_entry
from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout.engine import Generation, SamplingParams
from ragen_lightning.rollout.seeds import episode_seeds
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.types import Conversation, Sample, Trajectory
from tests.data_groups import data_module

BANDIT = {
    "env_id": "ragen/Bandit-v0",
    "num_groups": 2,
    "tag": "bandit",
    "episode": {"max_turns": 1},
}
LAKE = {"env_id": "ragen/FrozenLake-v0", "tag": "lake"}
EPISODE = EpisodeSettings(max_turns=2, max_new_tokens=16, max_model_len=1024)


def dm(**kw):
    return data_module(
        **{"group_size": 2, "num_groups": 1, "val_num_groups": 2, "episode": EPISODE, **kw}
    )


# -- entries ---------------------------------------------------------------------------------------
def test_entries_take_num_groups_with_the_flag_as_default():
    d = dm(mixture=[BANDIT, LAKE], num_groups=3)
    assert [(e.env_id, e.tag, e.num_groups) for e in d.train_entries] == [
        ("ragen/Bandit-v0", "bandit", 2),
        ("ragen/FrozenLake-v0", "lake", 3),
    ]
    # no val_suite: validation runs the training entries, each with --data.validation.num_groups
    # groups
    assert [(e.tag, e.num_groups) for e in d.val_entries] == [("bandit", 2), ("lake", 2)]
    assert d.val_entries[0].episode == {"max_turns": 1}
    # the single-env flags are a mixture of one entry (tag = env id) and the default env is the one
    # of before
    assert [
        (e.env_id, e.num_groups) for e in dm(env_id="ragen/Bandit-v0", num_groups=5).train_entries
    ] == [("ragen/Bandit-v0", 5)]
    assert dm().train_entries[0].env_id == "ragen/SimpleSokoban-v0" and not dm().mixture


def test_evaluation_entries_keep_num_episodes():
    assert as_entry({"env_id": "x", "num_episodes": 3}).num_episodes == 3
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['num_groups'\]"):
        as_entry({"env_id": "x", "num_groups": 3})
    entry = as_entry({"env_id": "x", "num_groups": 4}, "m", count="num_groups", default_count=9)
    assert entry == SuiteEntry("x", num_episodes=4) and entry.num_groups == 4
    assert as_entry({"env_id": "x"}, "m", count="num_groups", default_count=9).num_groups == 9


@pytest.mark.parametrize(
    "kw, message",
    [
        (
            {"mixture": [BANDIT], "env_id": "ragen/Bandit-v0"},
            r"^--data.env.id conflicts with --data.env.mixture, whose entries name the training envs",
        ),
        (
            {"mixture": [BANDIT], "env_id": "ragen/Bandit-v0", "env_kwargs": {"split": "test"}},
            r"^--data.env.id and --data.env.kwargs conflict with --data.env.mixture",
        ),
        ({"mixture": []}, r"^--data.env.mixture must be a non-empty list of entries"),
        (
            {"mixture": [BANDIT, {**LAKE, "num_episodes": 3}]},
            r"^--data.env.mixture\[1\]: unknown key\(s\) \['num_episodes'\]",
        ),
        (
            {"mixture": [BANDIT, {**LAKE, "num_groups": 0}]},
            r"^--data.env.mixture\[1\]: num_groups must be an integer >= 1, got 0",
        ),
        (
            {"mixture": [BANDIT, {**LAKE, "tag": "bandit"}]},
            r"^--data.env.mixture\[0\] and --data.env.mixture\[1\] share the tag",
        ),
        (
            {"mixture": [{**BANDIT, "tag": "a/b"}, {**LAKE, "tag": "a b"}]},
            r"^--data.env.mixture\[0\] and --data.env.mixture\[1\] have tags that give the same metric name 'a_b'",
        ),
        (
            {"mixture": [BANDIT, {"env_id": "ragen/Nope-v0"}]},
            r"^--data.env.mixture\[1\].env_id: unknown env id 'ragen/Nope-v0'",
        ),
        (
            {"mixture": [BANDIT, {**LAKE, "env_kwargs": {"size": 0}}]},
            r"^--data.env.mixture\[1\].env_kwargs for ragen/FrozenLake-v0: ",
        ),
        (
            {"val_suite": [{"env_id": "ragen/Nope-v0"}]},
            r"^--data.validation.suite\[0\].env_id: unknown env id",
        ),
        (
            {"mixture": [{**LAKE, "episode": {"max_model_len": 4096}}]},
            r"^--data.env.mixture\[0\] \('lake'\): episode.max_model_len 4096 exceeds --data.episode.max_model_len 1024",
        ),
        (
            {"mixture": [{**LAKE, "episode": {"max_turns": 0}}]},
            r"^--data.env.mixture\[0\]: suite entry 'lake': episode: .*max_turns",
        ),
    ],
)
def test_bad_mixtures_name_the_flag(kw, message):
    with pytest.raises(ConfigError, match=message):
        dm(**kw)


def test_metric_names_replace_unsafe_runs():
    assert mix.metric_name("ragen/Bandit-v0") == "ragen_Bandit-v0"
    assert mix.metric_name("my lake / 4x4") == "my_lake_4x4"
    assert mix.metric_name("Bandit_test.2") == "Bandit_test.2"


def test_world_size_counts_the_groups_of_all_entries():
    s = dm(mixture=[BANDIT, LAKE]).settings  # 2 + 1 training groups, 2 + 2 validation groups
    check_world_size(s, 1)
    even = replace(s, env=replace(s.env, mixture=[BANDIT, {**LAKE, "num_groups": 2}]))
    check_world_size(even, 2)
    with pytest.raises(
        ConfigError,
        match=r"^the training entries' num_groups summed \(3\) must be divisible by the "
        r"number of processes \(2\)",
    ):
        check_world_size(s, 2)
    with pytest.raises(ConfigError, match=r"^the validation entries' num_groups summed \(3\)"):
        check_world_size(
            replace(even, validation=replace(s.validation, suite=[{**LAKE, "num_groups": 3}])), 2
        )


# -- seeds per tag ---------------------------------------------------------------------------------
def test_an_entry_s_seeds_do_not_depend_on_the_other_entries():
    alone = dm(mixture=[LAKE])
    both = dm(mixture=[BANDIT, LAKE])
    swapped = dm(mixture=[LAKE, BANDIT], val_suite=[{**BANDIT, "num_groups": 5}, LAKE])
    for n in (0, 1, 7):
        assert alone.entry_seeds(n)[0] == both.entry_seeds(n)[1] == swapped.entry_seeds(n)[0]
    assert alone.val_entry_seeds()[0] == both.val_entry_seeds()[1] == swapped.val_entry_seeds()[1]
    # the streams: episode_seeds(train_seed, groups, "train/<tag>/<iteration>") and (val_seed,
    # "val/<tag>")
    assert both.entry_seeds(3)[0] == episode_seeds(10000, 2, "train/bandit/3")
    assert both.val_entry_seeds()[0] == episode_seeds(123, 2, "val/bandit")
    # group_seeds: the entries' seeds in order; iterations draw new levels; tags draw their own
    assert both.group_seeds(0) == both.entry_seeds(0)[0] + both.entry_seeds(0)[1]
    assert both.entry_seeds(0)[0] != both.entry_seeds(1)[0]
    assert dm(mixture=[{**LAKE, "tag": "lake2"}]).entry_seeds(0) != alone.entry_seeds(0)


def test_training_seeds_skip_their_tag_s_validation_seeds_and_nothing_else():
    entry = SuiteEntry("ragen/FrozenLake-v0", num_episodes=4, tag="lake")
    full = mix.train_seeds(entry, 10000, 0) + episode_seeds(10000, 5, "train/lake/0")[4:]
    assert mix.train_seeds(entry, 10000, 0, exclude=[full[1]]) == [
        full[0],
        full[2],
        full[3],
        full[4],
    ]
    d = dm(mixture=[LAKE], val_num_groups=64)
    held_out = set(d.val_entry_seeds()[0])
    assert not held_out & {s for n in range(200) for s in d.group_seeds(n)}


def test_single_env_seeds_are_unchanged_and_a_val_suite_adds_tagged_validation():
    d = dm(env_id="ragen/Bandit-v0", num_groups=3, val_num_groups=4)
    assert d.entry_seeds(2) == [[10006, 10007, 10008]] and d.val_entry_seeds() == [
        [123, 124, 125, 126]
    ]
    assert not d.tagged_validation
    v = dm(
        env_id="ragen/Bandit-v0",
        num_groups=3,
        val_suite=[{"env_id": "ragen/BanditTest-v0", "tag": "test"}],
    )
    assert v.entry_seeds(2) == [[10006, 10007, 10008]] and v.tagged_validation and not v.mixture
    assert v.val_entry_seeds() == [episode_seeds(123, 2, "val/test")]


# -- the concatenated rollout ----------------------------------------------------------------------
class FakeRunner:
    """Returns one scripted trajectory per env (score = member index of the group seed's parity);
    records calls."""

    def __init__(self, success_of=lambda seed, member: False):
        self.calls, self.timing, self.success_of = [], {"generate": 9.0, "env": 9.0}, success_of

    def run(self, seeds, group_size, params, seed=0, first_group=0):
        self.calls.append((list(seeds), params.max_new_tokens, seed, first_group))
        self.timing = {"generate": 1.0, "env": 2.0}
        return [
            Trajectory(
                env_index=(first_group + g) * group_size + m,
                group_id=first_group + g,
                seed=s,
                turn_rewards=[float(m)],
                success=self.success_of(s, m),
                num_turns=1,
            )
            for g, s in enumerate(seeds)
            for m in range(group_size)
        ]


def test_run_parts_renumbers_groups_and_shards_the_concatenated_list():
    a, b = FakeRunner(), FakeRunner()
    parts = [
        mix.Part(a, [10, 11], SamplingParams(max_new_tokens=8), seed=5, tag="a"),
        mix.Part(b, [20], SamplingParams(max_new_tokens=4), seed=6, tag="b"),
    ]
    trajs = mix.run_parts(parts, group_size=2)
    assert [(t.tag, t.group_id, t.env_index, t.seed) for t in trajs] == [
        ("a", 0, 0, 10),
        ("a", 0, 1, 10),
        ("a", 1, 2, 11),
        ("a", 1, 3, 11),
        ("b", 2, 4, 20),
        ("b", 2, 5, 20),
    ]
    # each runner saw its own groups from 0, its own cap and generation seed: the entry's rollout
    # run alone
    assert a.calls == [([10, 11], 8, 5, 0)] and b.calls == [([20], 4, 6, 0)]
    # three ranks, one group each: rank 1 runs a's second group, rank 2 b's only group (global id 2)
    a, b = FakeRunner(), FakeRunner()
    parts = [
        mix.Part(a, [10, 11], SamplingParams(), 5, "a"),
        mix.Part(b, [20], SamplingParams(), 6, "b"),
    ]
    rank1 = mix.run_parts(parts, 2, dp_rank=1, dp_size=3)
    assert a.calls[-1][0] == [11] and a.calls[-1][3] == 1 and not b.calls
    # not run on this rank: no stale timing of an earlier rollout
    assert b.timing == {"generate": 0.0, "env": 0.0}
    assert [(t.group_id, t.env_index) for t in rank1] == [(1, 2), (1, 3)]
    rank2 = mix.run_parts(parts, 2, dp_rank=2, dp_size=3)
    assert [(t.tag, t.group_id, t.env_index) for t in rank2] == [("b", 2, 4), ("b", 2, 5)]


def _t(tag, group, member, reward, success=False, format_errors=0, turns=1):
    return Trajectory(
        env_index=group * 2 + member,
        group_id=group,
        seed=group,
        turn_rewards=[reward],
        tag=tag,
        success=success,
        num_format_errors=format_errors,
        num_turns=turns,
        response_tokens=4 * turns,
    )


def test_tag_metrics_by_hand():
    trajs = [
        _t("a", 0, 0, 1.0, True),
        _t("a", 0, 1, 0.0),
        _t("a", 1, 0, 1.0, True),
        _t("a", 1, 1, 1.0, True),
        _t("b/x", 2, 0, 0.0, format_errors=1, turns=2),
        _t("b/x", 2, 1, 0.5, True, turns=2),
    ]
    m = mix.tag_metrics(trajs, group_size=2, prefix="val")
    assert m["val/a/success"] == 0.75 and m["val/a/return"] == 0.75 and m["val/a/score"] == 0.75
    assert (
        m["val/a/format_error_rate"] == 0.0
        and m["val/a/pass@2"] == 1.0
        and m["val/a/num_turns"] == 1.0
    )
    # b: 1 of 2 succeeded, return (0 + 0.5) / 2, one format error over 4 turns, 8 tokens per 2 turns
    assert (
        m["val/b_x/success"] == 0.5
        and m["val/b_x/return"] == 0.25
        and m["val/b_x/format_error_rate"] == 0.25
    )
    assert m["val/b_x/response_length"] == 4.0 and m["val/b_x/num_turns"] == 2.0
    assert not any(k.startswith("val/b/") for k in m)


# -- normalisation by env --------------------------------------------------------------------------
def _sample():
    c = Conversation()
    c.extend([1, 2], sampled=False)
    c.extend([3], sampled=True, logprobs=[-0.5])
    c.turn_spans.append((2, 3))
    return Sample(c, [0.0])


def test_normalisation_by_env_by_hand():
    # env a: scores 1, 0 | 1, 1 (mean 0.75, unbiased std 0.5); env b: 0, 0.5 (mean 0.25, std 0.5 /
    # sqrt 2)
    trajs = [
        _t("a", 0, 0, 1.0),
        _t("a", 0, 1, 0.0),
        _t("a", 1, 0, 1.0),
        _t("a", 1, 1, 1.0),
        _t("b", 2, 0, 0.0),
        _t("b", 2, 1, 0.5),
    ]
    for t in trajs:
        t.samples = [_sample()]
    mean = build_batch(trajs, pad_token_id=0, norm_grouping="env", norm_method="mean").scores
    assert mean.tolist() == pytest.approx([0.25, -0.75, 0.25, 0.25, -0.25, 0.25])
    z = build_batch(trajs, pad_token_id=0, norm_grouping="env", norm_method="mean_std").scores
    assert z.tolist() == pytest.approx([0.5, -1.5, 0.5, 0.5, -0.70710, 0.70710], abs=1e-4)
    # by state: group 1 (1, 1) has no variance -> 0; by batch: one mean 0.5833 over all six
    state = build_batch(trajs, pad_token_id=0, norm_grouping="state", norm_method="mean").scores
    assert state.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0, -0.25, 0.25])
    batch = build_batch(trajs, pad_token_id=0, norm_grouping="batch", norm_method="mean").scores
    assert batch.tolist() == pytest.approx([s - 3.5 / 6 for s in (1.0, 0.0, 1.0, 1.0, 0.0, 0.5)])
    # a single env (every tag empty) normalised by env is the whole batch
    for t in trajs:
        t.tag = ""
    single = build_batch(trajs, pad_token_id=0, norm_grouping="env", norm_method="mean").scores
    assert single.tolist() == pytest.approx(batch.tolist())
    with pytest.raises(ValueError, match="env_index"):
        normalize_scores(torch.ones(2), torch.zeros(2, dtype=torch.long), "env", "mean")


# -- the data module end to end (scripted engine) --------------------------------------------------
class ArmEngine:
    """Answers every request with an action word of its env chosen by the request seed."""

    needs_envs = True

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def generate(self, prompts, params, seeds=None, **kw):
        self.calls += 1
        out = []
        for seed, env in zip(seeds, kw["envs"]):
            names = env.action_names
            ids = self.tok.encode(
                f"x</think><answer>{names[seed % len(names)]}</answer>", add_special_tokens=False
            )
            ids = ids[: params.max_new_tokens - 1] + [self.tok.eos_token_id]
            out.append(Generation(ids, [-0.5] * len(ids), "stop"))
        return out

    def sync_weights(self):
        return {}


def attach(d, tok):
    engine = ArmEngine(tok)
    d.trainer = SimpleNamespace(world_size=1, should_stop=False)
    # the policy it rolls out
    d.connect(SimpleNamespace(tokenizer=tok, make_engine=lambda **kw: engine))
    return d


def _key(t):
    return t.seed, t.turn_rewards, t.num_turns, [s.conversation.input_ids for s in t.samples]


def test_mixture_batch_and_per_tag_metrics(tiny_tokenizer):
    d = attach(
        dm(
            mixture=[BANDIT, LAKE],
            val_suite=[
                {"env_id": "ragen/BanditTest-v0", "tag": "test"},
                {"env_id": "ragen/CoordFrozenLake-v0", "tag": "coord", "num_groups": 3},
            ],
        ),
        tiny_tokenizer,
    )
    batch = d.train_batch(0)
    trajs = batch.trajectories
    # groups in entry order, members contiguous; the bandit entry is one-turn (its episode override)
    assert [(t.tag, t.group_id) for t in trajs] == [("bandit", 0)] * 2 + [("bandit", 1)] * 2 + [
        ("lake", 2)
    ] * 2
    assert [t.seed for t in trajs[::2]] == d.group_seeds(0)
    assert all(t.num_turns == 1 for t in trajs[:4]) and all(t.num_turns == 2 for t in trajs[4:])
    m = batch.metrics
    for tag, ts in (("bandit", trajs[:4]), ("lake", trajs[4:])):
        assert m[f"train/{tag}/success"] == sum(t.success for t in ts) / len(ts)
        assert m[f"train/{tag}/return"] == pytest.approx(sum(t.env_return for t in ts) / len(ts))
        assert 0.0 <= m[f"train/{tag}/format_error_rate"] <= 1.0
    assert m["train/success"] == sum(t.success for t in trajs) / 6  # pooled over both entries
    assert len(batch) == 6 and batch.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    # the lake entry's episodes (reset and generation seeds, tokens) are those of a mixture without
    # the bandit
    alone = attach(dm(mixture=[LAKE]), tiny_tokenizer).train_batch(0).trajectories
    assert [_key(t) for t in alone] == [_key(t) for t in trajs[4:]]
    val = d.validation_batch()
    assert [t.tag for t in val.trajectories] == ["test"] * 2 + ["coord"] * 3
    assert {k for k in val.metrics if k.endswith("/success")} == {
        "val/success",
        "val/test/success",
        "val/coord/success",
    }
    assert val.metrics["val/success"] == sum(t.success for t in val.trajectories) / 5
    d.check_prompt_budget(tiny_tokenizer)  # every training and validation entry's first prompt fits


def test_single_env_rollout_has_no_tags(tiny_tokenizer):
    d = attach(
        dm(
            env_id="ragen/Bandit-v0",
            num_groups=2,
            episode=EpisodeSettings(max_turns=1, max_new_tokens=16, max_model_len=1024),
        ),
        tiny_tokenizer,
    )
    batch = d.train_batch(0)
    assert {t.tag for t in batch.trajectories} == {""} and [
        t.seed for t in batch.trajectories[::2]
    ] == [10000, 10001]
    # the metric names of before: train/<name> only
    assert not [k for k in batch.metrics if k.count("/") > 1]
    assert not [k for k in d.validation_batch().metrics if k.count("/") > 1]


def test_state_dict_resumes_a_mixture_on_the_same_seeds(tiny_tokenizer):
    first = attach(dm(mixture=[BANDIT, LAKE]), tiny_tokenizer)
    first.train_batch(0)
    first.iteration = 1
    resumed = attach(dm(mixture=[BANDIT, LAKE]), tiny_tokenizer)
    resumed.load_state_dict(first.state_dict())
    assert [_key(t) for t in resumed._next_train_batch().trajectories] == [
        _key(t) for t in first.train_batch(1).trajectories
    ]


def test_warm_start_learns_from_every_training_entry(monkeypatch):
    from ragen_lightning.sft import warm_start as ws

    calls = []
    monkeypatch.setattr(
        ws,
        "warm_start",
        lambda model, env_id, env_kwargs, settings, **kw: (
            calls.append((env_id, env_kwargs, {**kw, "steps": settings.steps})) or "folder"
        ),
    )
    d = dm(mixture=[BANDIT, {**LAKE, "env_kwargs": {"size": 4}}])
    assert ws.warm_started_path("tiny", {"steps": 3}, d) == "folder"
    env_id, env_kwargs, kw = calls[-1]
    assert (env_id, env_kwargs, kw["steps"]) == ("ragen/Bandit-v0", None, 3)
    # the entry's own settings
    assert kw["episode"] == EPISODE.__class__(**{**EPISODE.__dict__, "max_turns": 1})
    assert kw["more_envs"] == [("ragen/FrozenLake-v0", {"size": 4}, EPISODE)]
    # a single env: no further envs
    ws.warm_started_path("tiny", True, dm(env_id="ragen/Bandit-v0"))
    assert calls[-1][:2] == ("ragen/Bandit-v0", None) and calls[-1][2]["more_envs"] == []
