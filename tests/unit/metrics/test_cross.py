"""The teacher-forced cross log-prob matrix (metrics/cross.py) on the session's tiny model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from ragen_lightning.metrics.cross import (
    ReasoningFinder,
    first_turn_pairs,
    mi_diagnostics,
    score_pairs,
    trajectory_pairs,
    trajectory_turns,
)
from ragen_lightning.rollout.tokens import ChatTokens
from ragen_lightning.types import Sample, Trajectory


@pytest.fixture(scope="module")
def actor(tiny_path):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_path).eval()


def _traj(chat, group_id, states, bodies):
    """One trajectory whose turn t shows ``states[t]`` and samples ``bodies[t]`` (text after
    ``<think>``)."""
    conv = chat.start("You're a helpful assistant.", f"State:\n{states[0]}\n")
    for t, body in enumerate(bodies):
        if t:
            chat.add_user(conv, f"State:\n{states[t]}\n")
        chat.add_response(conv, chat.encode(body) + [chat.eos_id], None)
    return Trajectory(
        env_index=0, group_id=group_id, seed=group_id, samples=[Sample(conv, [0.0] * len(bodies))]
    )


@pytest.fixture(scope="module")
def rollout(tiny_tokenizer):
    chat = ChatTokens(tiny_tokenizer)
    trajs = [
        _traj(chat, 0, ["#_P_#"], ["I go left.</think><answer>Left</answer>"]),
        _traj(chat, 0, ["#_P_#"], ["no close tag<answer>Up</answer>"]),  # no reasoning: excluded
        _traj(chat, 1, ["#P__#"], ["Right is 1 2 3.</think><answer>Right</answer>"]),
        _traj(chat, 1, ["#P__#"], ["</think><answer>Right</answer>"]),  # empty reasoning: excluded
        _traj(chat, 2, ["#_P_#"], ["Up Up.</think><answer>Up</answer>"]),  # same prompt as group 0
    ]
    return chat, trajs


def test_first_turn_pairs_rows_columns_and_exclusions(rollout, tiny_tokenizer):
    chat, trajs = rollout
    finder = ReasoningFinder(tiny_tokenizer)
    pairs = first_turn_pairs(trajectory_turns(trajs, finder))
    # columns: one per group (0, 1, 2), the group's first member's prompt; groups 0 and 2 saw the
    # same state
    assert len(pairs.prompts) == 3 and pairs.prompt_signature.tolist() == [0, 1, 0]
    assert all(p[-1] == tiny_tokenizer.convert_tokens_to_ids("<think>") for p in pairs.prompts)
    # rows: trajectories 0, 2, 4 have reasoning; 1 (no </think>) and 3 (empty) are excluded and
    # counted
    assert (
        pairs.prompt_index.tolist() == [0, 1, 2]
        and pairs.num_turns == 5
        and pairs.num_excluded == 2
    )
    assert pairs.reasonings[0] == chat.encode("I go left.")
    # the decode-based path (tokenizers whose </think> is several ids) finds the same reasoning
    slow = ReasoningFinder(tiny_tokenizer)
    slow.close_id = None
    assert first_turn_pairs(trajectory_turns(trajs, slow)).reasonings == pairs.reasonings
    # num_samples draws rows without replacement; the columns stay one per group
    sub = first_turn_pairs(
        trajectory_turns(trajs, finder), num_samples=2, generator=torch.Generator().manual_seed(0)
    )
    assert len(sub.reasonings) == 2 and len(sub.prompts) == 3 and sub.num_excluded == 2
    assert len(set(sub.prompt_index.tolist())) == 2


def test_matrix_matches_independent_teacher_forcing_and_micro_batching(
    rollout, tiny_tokenizer, actor
):
    _, trajs = rollout
    pairs = first_turn_pairs(trajectory_turns(trajs, ReasoningFinder(tiny_tokenizer)))
    scores = score_pairs(actor, pairs, micro_batch_size=4, pad_token_id=tiny_tokenizer.pad_token_id)
    assert scores.seq_sum.shape == (3, 3) and scores.wall_s > 0
    for m, z in enumerate(pairs.reasonings):
        for j, x in enumerate(pairs.prompts):
            ids = torch.tensor([x + z])  # one unpadded sequence, its own forward pass
            with torch.no_grad():
                logp = actor(input_ids=ids).logits[0, :-1].log_softmax(-1)
            expected = sum(float(logp[len(x) - 1 + t, tok]) for t, tok in enumerate(z))
            assert abs(float(scores.seq_sum[m, j]) - expected) < 1e-4
            assert abs(float(scores.token_mean[m, j]) - expected / len(z)) < 1e-4
    for micro in (1, 2, 9):  # 9 > M*N: one forward pass for all pairs
        for cache in (True, False):  # the prompt's KV cache reused, or every [x | z] run whole
            other = score_pairs(
                actor,
                pairs,
                micro_batch_size=micro,
                pad_token_id=tiny_tokenizer.pad_token_id,
                prefix_cache=cache,
            )
            torch.testing.assert_close(other.seq_sum, scores.seq_sum, atol=1e-5, rtol=0)
    assert not actor.training


def test_trajectory_pairs_use_the_history_up_to_the_drawn_turn(tiny_tokenizer):
    chat = ChatTokens(tiny_tokenizer)
    # turn 1 has no reasoning, turn 2 does: every draw must be turn 2 with the whole history as its
    # prompt
    traj = _traj(
        chat,
        0,
        ["#P_#", "#_P#"],
        ["oops<answer>Right</answer>", "done.</think><answer>Up</answer>"],
    )
    conv = traj.samples[0].conversation
    start2 = conv.turn_spans[1][0]
    pairs = trajectory_pairs(
        trajectory_turns([traj], ReasoningFinder(tiny_tokenizer)),
        num_samples=3,
        generator=torch.Generator().manual_seed(0),
    )
    assert (
        pairs.prompts == [conv.input_ids[:start2]] * 3
        and pairs.reasonings == [chat.encode("done.")] * 3
    )
    assert pairs.prompt_index.tolist() == [0, 1, 2] and pairs.prompt_signature.tolist() == [0, 0, 0]
    assert pairs.num_turns == 2 and pairs.num_excluded == 1


def test_mi_diagnostics_keys_and_counts(rollout, tiny_tokenizer, actor):
    _, trajs = rollout
    pairs = first_turn_pairs(trajectory_turns(trajs, ReasoningFinder(tiny_tokenizer)))
    scores = score_pairs(actor, pairs, 4, pad_token_id=tiny_tokenizer.pad_token_id)
    ema: dict = {}
    logs = mi_diagnostics(pairs, scores, "collapse/first_turn", ema_state=ema)
    assert (
        logs["collapse/first_turn/num_valid"] == 3.0
        and logs["collapse/first_turn/valid_rate"] == 3 / 5
    )
    assert logs["collapse/first_turn/num_excluded"] == 2.0
    # conditional entropy = -mean of the matrix's matched entries (hand: a_m = l[m, m] for
    # prompt_index 0,1,2)
    diag = scores.token_mean.diagonal()
    assert abs(logs["collapse/first_turn/conditional_entropy"] + float(diag.mean())) < 1e-5
    assert (
        abs(
            logs["collapse/first_turn/conditional_entropy_seq"]
            + float(scores.seq_sum.diagonal().mean())
        )
        < 1e-4
    )
    assert set(ema) == {"", "_seq"}
    # no valid row: only the counts are logged
    empty = first_turn_pairs(trajectory_turns(trajs[1:2], ReasoningFinder(tiny_tokenizer)))
    logs = mi_diagnostics(empty, score_pairs(actor, empty, 4), "p")
    assert logs == {
        "p/num_turns": 1.0,
        "p/num_valid": 0.0,
        "p/num_excluded": 1.0,
        "p/valid_rate": 0.0,
        "p/time_s": logs["p/time_s"],
    }
