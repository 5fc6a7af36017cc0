"""Teacher-forced passes without the padding mask on right-padded rows give the same outputs on real
tokens."""

import pytest
import torch

from ragen_lightning.models.forward import MIN_SHARED, causal_only, shared_prefix
from ragen_lightning.starpo.scoring import (
    ForwardSettings,
    actor_outputs,
    critic_values,
    score_batch,
)


@pytest.fixture(scope="module")
def nets(tiny_path):
    from transformers import AutoModelForCausalLM

    from ragen_lightning.models.loading import load_critic

    torch.manual_seed(0)
    actor = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    critic = load_critic(tiny_path).eval()
    with torch.no_grad():
        torch.nn.init.normal_(critic.value_head.weight)  # a zero head would hide any difference
    return actor, critic


def right_padded(lengths, T=12, pad=0):
    g = torch.Generator().manual_seed(1)
    ids = torch.full((len(lengths), T), pad, dtype=torch.long)
    att = torch.zeros((len(lengths), T), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(3, 300, (n,), generator=g)
        att[i, :n] = 1
    return ids, att


def test_causal_only_drops_the_mask_only_for_right_padding():
    _, att = right_padded([5, 12, 1, 0])  # an all-padding row (an inert row) is right-padded too
    assert causal_only(att) is None
    left = att.flip(1)
    assert causal_only(left) is left
    gap = torch.tensor([[1, 0, 1, 1]])
    assert causal_only(gap) is gap


def test_same_logprobs_entropy_and_values_on_real_tokens(nets):
    actor, critic = nets
    ids, att = right_padded([5, 12, 9, 2])
    real = att[:, 1:].bool()  # target axis
    with torch.no_grad():
        lp, ent = actor_outputs(actor, ids, att, with_entropy=True)
        ref = torch.log_softmax(actor(input_ids=ids, attention_mask=att).logits[:, :-1], -1)
        ref_lp = ref.gather(-1, ids[:, 1:, None]).squeeze(-1)
        ref_ent = -(ref.exp() * ref).sum(-1)
        v = critic_values(critic, ids, att)
        ref_v = critic(ids, att)[:, :-1]
    torch.testing.assert_close(lp[real], ref_lp[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent[real], ref_ent[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(v[real], ref_v[real], atol=1e-5, rtol=0)
    # and the same as each row scored alone, unpadded
    for i, n in enumerate(att.sum(-1).tolist()):
        with torch.no_grad():
            alone = torch.log_softmax(actor(input_ids=ids[i : i + 1, :n]).logits[0, :-1], -1)
        torch.testing.assert_close(
            lp[i, : n - 1], alone.gather(-1, ids[i, 1:n, None]).squeeze(-1), atol=1e-5, rtol=0
        )


def test_score_batch_matches_the_masked_pass(nets):
    actor, critic = nets
    ids, att = right_padded([5, 12, 9, 2, 7])
    real = att[:, 1:].bool()
    lp, _ = score_batch(actor, ids, att, 2, kind="actor")
    v, _ = score_batch(critic, ids, att, 2, kind="critic")
    with torch.no_grad():
        ref_lp = torch.log_softmax(actor(input_ids=ids, attention_mask=att).logits[:, :-1], -1)
        ref_lp = ref_lp.gather(-1, ids[:, 1:, None]).squeeze(-1)
        ref_v = critic(ids, att)[:, :-1]
    torch.testing.assert_close(lp[real], ref_lp[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(v[real], ref_v[real], atol=1e-5, rtol=0)


def test_left_padding_keeps_the_mask(nets):
    actor, _ = nets
    ids, att = right_padded([5, 12, 9])
    ids, att = ids.flip(1), att.flip(1)  # left-padded rows: the mask matters, so it is kept
    with torch.no_grad():
        lp, _ = actor_outputs(actor, ids, att, with_entropy=False)
        ref = torch.log_softmax(actor(input_ids=ids, attention_mask=att).logits[:, :-1], -1)
    real = att[:, 1:].bool() & att[:, :-1].bool()
    torch.testing.assert_close(
        lp[real], ref.gather(-1, ids[:, 1:, None]).squeeze(-1)[real], atol=1e-6, rtol=0
    )


def test_by_length_orders_rows_longest_first_keeping_ties_in_order():
    from ragen_lightning.starpo.scoring import by_length

    lengths = torch.tensor([3, 7, 5, 7, 2])
    assert by_length(torch.tensor([0, 1, 2, 3, 4]), lengths).tolist() == [1, 3, 2, 0, 4]
    # a subset, by its own lengths
    assert by_length(torch.tensor([4, 2, 0]), lengths).tolist() == [2, 0, 4]


def test_skipping_untrained_prompt_columns_is_exact(tiny_path):
    from transformers import AutoModelForCausalLM

    from ragen_lightning.starpo.scoring import actor_outputs, first_target, score_batch

    model = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (3, 20), generator=g)
    att = torch.ones_like(ids)
    att[1, 15:] = 0
    mask = torch.zeros((3, 19), dtype=torch.bool)
    mask[0, 9:12], mask[1, 7:10], mask[2, 12:] = True, True, True
    assert (
        first_target(mask) == 7
        and first_target(None) == 0
        and first_target(torch.zeros(2, 5).bool()) == 4
    )
    with torch.no_grad():
        full_lp, full_ent = actor_outputs(model, ids, att, with_entropy=True)
        lp, ent = actor_outputs(model, ids, att, with_entropy=True, skip=7)
        scored, scored_ent = score_batch(
            model, ids, att, 2, kind="actor", with_entropy=True, loss_mask=mask
        )
    assert lp.shape == full_lp.shape and (lp[:, :7] == 0).all() and (ent[:, :7] == 0).all()
    torch.testing.assert_close(lp[:, 7:], full_lp[:, 7:], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent[:, 7:], full_ent[:, 7:], atol=1e-5, rtol=0)
    # every trained column is right
    torch.testing.assert_close(scored[mask], full_lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(scored_ent[mask], full_ent[mask], atol=1e-5, rtol=0)


def sharing_rows(lengths, common, T=64):
    """Right-padded rows whose first ``common`` tokens are the same."""
    ids, att = right_padded(lengths, T=T)
    ids[:, :common] = torch.arange(3, 3 + common)
    return ids * att, att


def test_shared_prefix_length():
    ids, att = sharing_rows([40, 64, 50], common=20)
    assert shared_prefix(ids, att, limit=63) == 20
    # never past the first column an output is read from
    assert shared_prefix(ids, att, limit=18) == 18
    assert shared_prefix(ids, att, limit=MIN_SHARED - 1) == 0  # too short to pay for the extra call
    assert shared_prefix(ids[:1], att[:1], limit=63) == 0  # one row: nothing to share
    short, short_att = sharing_rows([10, 64], common=20)  # a row ends inside the common tokens
    assert shared_prefix(short, short_att, limit=63) == 0
    ids[1, 17] += 1  # rows differ at column 17
    assert shared_prefix(ids, att, limit=63) == 17
    # left padding: the prefix is not real tokens
    assert shared_prefix(ids.flip(1), att.flip(1), limit=63) == 0


def test_shared_prefix_gives_the_same_outputs_and_gradients(nets):
    """Running the common prefix once and repeating its cache is the same function: identical
    log-probs, entropies and values on every column read, and the same gradients (to float
    rounding)."""
    actor, critic = nets
    ids, att = sharing_rows([40, 64, 50, 33], common=24)
    skip = 26
    read = att[:, 1:].bool()
    read[:, :skip] = False
    results = []
    for share in (False, True):
        actor.zero_grad()
        critic.zero_grad()
        forward = ForwardSettings(share_prefix=share)
        lp, ent = actor_outputs(actor, ids, att, forward, with_entropy=True, skip=skip)
        v = critic_values(critic, ids, att, forward, skip=skip)
        (lp[read].sum() + ent[read].sum() + v[read].sum()).backward()
        grads = [
            p.grad.clone()
            for p in [*actor.parameters(), *critic.parameters()]
            if p.grad is not None
        ]
        results.append((lp[read], ent[read], v[read], grads))
    (lp0, ent0, v0, g0), (lp1, ent1, v1, g1) = results
    torch.testing.assert_close(lp1, lp0, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent1, ent0, atol=1e-6, rtol=0)
    torch.testing.assert_close(v1, v0, atol=1e-5, rtol=1e-6)  # values ~10 (a random head)
    assert len(g1) == len(g0) > 0
    # summed in another order: equal up to float rounding of the whole tensor
    for a, b in zip(g1, g0, strict=True):
        assert float((a - b).norm()) <= 1e-5 * float(b.norm()) + 1e-9
    assert g0[0].abs().sum() > 0  # the embedding's gradient reaches the shared tokens too


def test_sharded_networks_do_not_share_a_prefix(nets):
    """FSDP expects one forward per backward: a network with a sharded part runs every row in
    full."""
    from ragen_lightning.models.forward import can_share

    actor, _ = nets
    assert can_share(actor)
    # fully_shard swaps in a subclass of this name
    fsdp2_like = type("FSDPModule", (torch.nn.Module,), {})
    wrapped = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(fsdp2_like()))
    assert not can_share(wrapped)
    assert not can_share(type("FullyShardedDataParallel", (torch.nn.Module,), {})())
    ids, att = sharing_rows([40, 64], common=20)
    assert shared_prefix(ids, att, limit=63, model=actor) == 20
    assert shared_prefix(ids, att, limit=63, model=wrapped) == 0
