"""Padding-free micro-batches (``--model.update.pack``) and token budgets
(``--model.update.micro_batch_tokens``): the packed forward is the padded one to float rounding
(outputs and gradients), and the budget splits rows as computed by hand."""

import pytest
import torch

from ragen_lightning.models.packing import (
    IMPLEMENTATION,
    by_tokens,
    pack,
    prefix_groups,
    use_packed_attention,
)
from ragen_lightning.starpo.scoring import (
    ForwardSettings,
    actor_outputs,
    critic_values,
    plan_micro_batches,
    score_batch,
    token_slices,
)


@pytest.fixture(scope="module")
def nets(tiny_path):
    from transformers import AutoModelForCausalLM

    from ragen_lightning.models.loading import load_critic

    torch.manual_seed(0)
    actor = (
        AutoModelForCausalLM.from_pretrained(tiny_path, attn_implementation="sdpa").double().eval()
    )
    critic = load_critic(tiny_path).double().eval()
    with torch.no_grad():
        torch.nn.init.normal_(critic.value_head.weight)  # a zero head would hide any difference
    return actor, critic


def rows_of(lengths, common=0, T=None, seed=1, groups=1):
    """Right-padded rows of ``lengths`` tokens; the rows of each of ``groups`` consecutive groups
    have the same first ``common`` tokens."""
    g = torch.Generator().manual_seed(seed)
    T = T or max(lengths)
    ids = torch.zeros((len(lengths), T), dtype=torch.long)
    att = torch.zeros((len(lengths), T), dtype=torch.long)
    heads = torch.randint(3, 300, (groups, common), generator=g)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(3, 300, (n,), generator=g)
        ids[i, :common] = heads[i * groups // len(lengths)]
        att[i, :n] = 1
    return ids, att


def test_pack_lists_the_real_tokens_row_after_row():
    ids = torch.tensor([[5, 6, 7], [8, 9, 0], [4, 0, 0]])
    att = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    p = pack(ids, att)
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 9, 4]]
    assert p.position_ids.tolist() == [[0, 1, 2, 0, 1, 0]]  # positions restart in every row
    assert p.rows.tolist() == [0, 0, 0, 1, 1, 2] and p.cols.tolist() == [0, 1, 2, 0, 1, 0]
    assert p.segments == ((0, 0, 0, 3), (0, 0, 3, 2), (0, 0, 5, 1)) and p.shared == 0
    with pytest.raises(ValueError, match="right-padded"):
        pack(ids, att.flip(1))
    with pytest.raises(ValueError, match="every row is padding"):
        pack(ids, torch.zeros_like(att))


def test_rows_that_start_alike_pack_their_prefix_once():
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 5, 0], [1, 2, 3, 6], [7, 8, 0, 0]])
    att = (ids > 0).long()
    # rows 0-2 share [1, 2] (rows 0 and 2 share three tokens, but a group's prefix is what all of
    # them share); row 3 starts a group of its own
    assert prefix_groups(ids, [4, 3, 4, 2], limit=3, min_shared=2) == [([0, 1, 2], 2), ([3], 0)]
    p = pack(ids, att, limit=3, min_shared=2)
    assert p.input_ids.tolist() == [[1, 2, 3, 4, 5, 3, 6, 7, 8]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 2, 2, 3, 0, 1]]
    assert p.rows.tolist() == [-1, -1, 0, 0, 1, 2, 2, 3, 3] and p.owned.tolist() == [
        2,
        3,
        4,
        5,
        6,
        7,
        8,
    ]
    # the prefix attends to itself; each row's rest to the prefix at 0 (2 tokens), then to itself
    assert p.segments == ((0, 0, 0, 2), (0, 2, 2, 2), (0, 2, 4, 1), (0, 2, 5, 2), (0, 0, 7, 2))
    assert p.shared == 4  # two rows' copies of the prefix not run
    assert pack(ids, att, limit=1, min_shared=2).shared == 0  # a limit under min_shared: no sharing
    # lexicographic order of the tokens puts rows that start alike together
    assert by_tokens(torch.tensor([3, 0, 1, 2]), ids, att.sum(-1)).tolist() == [0, 2, 1, 3]


@pytest.mark.parametrize("common, skip, groups", [(0, 0, 1), (0, 9, 1), (24, 26, 1), (24, 30, 2)])
def test_packed_outputs_and_gradients_equal_the_padded_ones(nets, common, skip, groups):
    """Log-probs, entropies and values on every column read, and the gradients of both networks: the
    same to float rounding (float64), with the LM head skipped on untrained columns and with shared
    prefixes run once (one for the micro-batch, or one per group: the padded pass then shares
    nothing)."""
    actor, critic = nets
    ids, att = rows_of([40, 64, 50, 33, 29, 45], common=common, groups=groups)
    read = att[:, 1:].bool()
    read[:, :skip] = False
    results = []
    for packed in (False, True):
        actor.zero_grad()
        critic.zero_grad()
        forward = ForwardSettings(share_prefix=common > 0, pack=packed)
        lp, ent = actor_outputs(actor, ids, att, forward, with_entropy=True, skip=skip)
        v = critic_values(critic, ids, att, forward, skip=skip)
        (lp[read].sum() + ent[read].sum() + v[read].sum()).backward()
        grads = [
            p.grad.clone()
            for p in [*actor.parameters(), *critic.parameters()]
            if p.grad is not None
        ]
        results.append((lp, ent, v, grads))
    (lp0, ent0, v0, g0), (lp1, ent1, v1, g1) = results
    for a, b in ((lp1, lp0), (ent1, ent0), (v1, v0)):
        torch.testing.assert_close(a[read], b[read], atol=1e-10, rtol=1e-10)
    # columns past a row's end (and skipped ones) read 0
    assert float(lp1.detach()[~read].abs().sum()) == 0.0
    assert len(g1) == len(g0) > 0
    for a, b in zip(g1, g0, strict=True):
        # a shared prefix's gradient is summed over its rows before its backward, through Qwen2's
        # RMSNorm, which computes in float32 even in a float64 model: float32 rounding of the whole
        # tensor (as far as the padded pass's own shared prefix lands from its unshared pass)
        assert float((a - b).norm()) <= 1e-6 * float(b.norm()) + 1e-12
    assert actor.config._attn_implementation == IMPLEMENTATION  # switched on the first packed pass


def test_the_packed_attention_is_plain_sdpa_outside_a_packed_pass(nets):
    actor, _ = nets
    ids, att = rows_of([12, 7, 9])
    use_packed_attention(actor)
    with torch.no_grad():
        got = actor(input_ids=ids, attention_mask=att).logits  # padding mask given: built as SDPA's
        actor.config._attn_implementation = "sdpa"
        want = actor(input_ids=ids, attention_mask=att).logits
        use_packed_attention(actor)
    assert torch.equal(got, want)


def test_packing_refuses_attention_it_cannot_run(tiny_path):
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(tiny_path, attn_implementation="eager")
    with pytest.raises(
        ValueError, match="needs the 'sdpa' attention implementation; the model runs 'eager'"
    ):
        use_packed_attention(eager)


def test_token_slices_by_hand():
    rows = torch.arange(5)
    lengths = torch.tensor([10, 8, 5, 3, 2])  # already longest first
    # padded: a chunk costs rows x longest: [10] (2 x 10 > 16), [8, 5] (2 x 8 = 16), [3, 2] (adding
    # 3: 3 x 8 > 16)
    assert [c.tolist() for c in token_slices(rows, lengths, 16, packed=False)] == [
        [0],
        [1, 2],
        [3, 4],
    ]
    # packed: the sum of lengths: [10] (18 > 16), [8, 5, 3] (16), [2]
    assert [c.tolist() for c in token_slices(rows, lengths, 16, packed=True)] == [
        [0],
        [1, 2, 3],
        [4],
    ]
    # a row over the budget runs alone; rows in the order given
    assert [c.tolist() for c in token_slices(rows, lengths, 4, packed=True)] == [
        [0],
        [1],
        [2],
        [3],
        [4],
    ]
    # rows kept in the order given; a chunk's cost uses its longest row wherever it is: 2 x 3 <= 6,
    # then 3 x 3 > 6
    assert [
        c.tolist() for c in token_slices(torch.tensor([4, 3, 2]), lengths, 6, packed=False)
    ] == [[4, 3], [2]]
    # no budget: micro_batch_size rows each
    assert [c.tolist() for c in plan_micro_batches(rows, lengths, 2)] == [[0, 1], [2, 3], [4]]


def test_score_batch_by_token_budget_and_packed_matches_by_rows(nets):
    actor, critic = nets
    ids, att = rows_of([5, 40, 9, 2, 27, 33], T=40)
    real = att[:, 1:].bool()
    ref_lp, ref_ent = score_batch(actor, ids, att, 2, kind="actor", with_entropy=True)
    ref_v, _ = score_batch(critic, ids, att, 2, kind="critic")
    for tokens, packed in ((60, False), (60, True), (1, True)):
        lp, ent = score_batch(
            actor,
            ids,
            att,
            2,
            kind="actor",
            with_entropy=True,
            micro_batch_tokens=tokens,
            forward=ForwardSettings(pack=packed),
        )
        v, _ = score_batch(
            critic,
            ids,
            att,
            2,
            kind="critic",
            micro_batch_tokens=tokens,
            forward=ForwardSettings(pack=packed),
        )
        for a, b in ((lp, ref_lp), (ent, ref_ent), (v, ref_v)):
            torch.testing.assert_close(a[real], b[real], atol=1e-10, rtol=1e-10)


def test_packed_lora_actor_and_shared_base_critic_equal_the_padded_ones(tiny_path):
    """Under LoRA (a PEFT wrapper, and a critic that is the actor's base with its own adapter) the
    packed pass is the padded one too."""
    from ragen_lightning.models import lora
    from ragen_lightning.models.build import build_lora_models

    actor, critic, _ = build_lora_models(
        str(tiny_path),
        None,
        "float32",
        lora.LoraSettings(rank=4, alpha=8.0, shared_base=True),
        with_critic=True,
        with_reference=False,
    )
    torch.manual_seed(0)
    for _, p in actor.named_parameters():  # non-zero adapters, so they take part
        p.data.normal_(0, 0.05) if p.requires_grad else None
    critic.value_head.weight.data.normal_(0, 0.1)
    ids, att = rows_of([30, 45, 38, 21], common=20, groups=2)
    read = att[:, 1:].bool()
    with torch.no_grad():
        forwards = [ForwardSettings(share_prefix=True, pack=packed) for packed in (False, True)]
        outs = [
            (
                actor_outputs(actor, ids, att, forward, with_entropy=False, skip=22)[0],
                critic_values(critic, ids, att, forward, skip=22),
            )
            for forward in forwards
        ]
    (lp0, v0), (lp1, v1) = outs
    read[:, :22] = False
    torch.testing.assert_close(lp1[read], lp0[read], atol=2e-5, rtol=0)
    torch.testing.assert_close(v1[read], v0[read], atol=2e-5, rtol=1e-5)
    assert float(v0[read].abs().max()) > 1e-3  # the critic's values are not all 0


def test_packing_runs_only_where_it_saves_tokens():
    from ragen_lightning.starpo.scoring import PACK_SAVING, cheaper_packing

    same, att = rows_of([40, 40, 40, 40])  # nothing to save: the padded pass runs
    assert cheaper_packing(same, att, limit=0, prefix=0) is None
    varied, att = rows_of([40, 20, 30, 10])  # 100 tokens packed vs 160 padded
    assert cheaper_packing(varied, att, limit=0, prefix=0).input_ids.shape[1] == 100
    # rows sharing a 24-token prefix, of one length: the padded pass shares it too (24 + 4 x 16 = 88
    # tokens, as many as packed), so it runs; two groups of two: the padded pass shares nothing
    # (160), packing 2 x 24 + 4 x 16
    one, att1 = rows_of([40, 40, 40, 40], common=24)
    assert cheaper_packing(one, att1, limit=30, prefix=24) is None
    two, att2 = rows_of([40, 40, 40, 40], common=24, groups=2)
    assert (
        cheaper_packing(two, att2, limit=30, prefix=0).input_ids.shape[1]
        == 112
        <= PACK_SAVING * 160
    )
