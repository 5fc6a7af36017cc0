"""SFT loss against hand-computed numbers, batching, seeds, the Lightning module and the
demonstration data module."""

from __future__ import annotations

import math

import pytest
import torch

import envs  # noqa: F401  (registers the ragen/* ids)
from ragen_lightning.rollout.seeds import episode_seeds
from ragen_lightning.rollout.settings import EpisodeSettings
from ragen_lightning.sft.module import (
    Demonstration,
    DemonstrationDataModule,
    SFTBatch,
    SFTModule,
    build_demonstrations,
    causal_lm_sft_loss,
    collate,
    lr_factor,
    sft_loss,
    token_cross_entropy,
)
from ragen_lightning.sft.training import shuffled_batches, train_sft


def test_sft_loss_by_hand_masks_targets_only():
    # V = 3, T = 4. Targets on the target axis: loss_mask[t] = 1 for t = 1 and t = 3.
    #   t = 1: token 1, predicted by logits[0] = [0, ln 3, 0] -> p = 3 / 5 -> nll = -ln 0.6 = 0.5108
    #   t = 3: token 1, predicted by logits[2] = [0, 0, 0]    -> p = 1 / 3 -> nll = ln 3    = 1.0986
    #   logits[1] predicts the masked t = 2 and holds NaN/inf: it must not leak; logits[3] predicts
    #   nothing.
    # loss = (0.5108 + 1.0986) / 2 = 0.8047; accuracy: argmax(logits[0]) = 1 right, argmax([0,0,0])
    # = 0 wrong -> 0.5
    logits = torch.tensor(
        [
            [
                [0.0, math.log(3.0), 0.0],
                [float("nan"), float("inf"), 0.0],
                [0.0, 0.0, 0.0],
                [float("nan"), 0.0, 0.0],
            ]
        ],
        requires_grad=True,
    )
    input_ids = torch.tensor([[2, 1, 0, 1]])
    loss_mask = torch.tensor([[0, 1, 0, 1]])
    loss, metrics = sft_loss(logits, input_ids, loss_mask)
    expected = (-math.log(0.6) + math.log(3.0)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["sft/token_accuracy"].item() == pytest.approx(0.5)
    assert metrics["sft/num_tokens"].item() == 2
    loss.backward()
    assert (
        torch.isfinite(logits.grad).all()
        and logits.grad[0, 1].abs().sum() == 0
        and logits.grad[0, 3].abs().sum() == 0
    )
    # d loss / d logits[0] = (softmax - onehot) / 2 = ([0.2, 0.6, 0.2] - [0, 1, 0]) / 2
    assert logits.grad[0, 0].tolist() == pytest.approx([0.1, -0.2, 0.1], abs=1e-6)


def test_sft_loss_all_zero_mask_is_zero_and_attached():
    logits = torch.randn(2, 3, 5, requires_grad=True)
    loss, metrics = token_cross_entropy(
        logits, torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3)
    )
    assert loss.item() == 0.0 and loss.requires_grad and metrics["sft/num_tokens"].item() == 0


def test_collate_right_pads():
    batch = collate(
        [Demonstration((5, 6, 7), (0, 1, 1)), Demonstration((8,), (0,))], pad_token_id=9
    )
    assert batch.input_ids.tolist() == [[5, 6, 7], [8, 9, 9]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 1, 1], [0, 0, 0]]


def test_lr_factor_warmup_then_cosine():
    assert lr_factor(0, 10, 110, "cosine") == pytest.approx(0.1)  # (0 + 1) / 10
    assert lr_factor(9, 10, 110, "cosine") == pytest.approx(1.0)
    assert lr_factor(60, 10, 110, "cosine") == pytest.approx(0.55)  # halfway: 0.1 + 0.9 * 0.5
    assert lr_factor(110, 10, 110, "cosine") == pytest.approx(0.1)
    assert lr_factor(60, 10, 110, "constant") == 1.0


def test_shuffled_batches_cover_every_index_once_and_mix_lengths():
    batches = shuffled_batches(10, 4, torch.Generator().manual_seed(0))
    assert [len(b) for b in batches] == [4, 4, 2] and sorted(i for b in batches for i in b) == list(
        range(10)
    )
    assert batches == shuffled_batches(10, 4, torch.Generator().manual_seed(0))  # seeded
    # the regression: batches grouped by length held one target each (length follows the target); 50
    # short and 50 long items in batches of 10: some batch must mix them (all-pure has probability
    # ~1e-13 under a shuffle)
    long = set(range(50, 100))
    mixed = [
        b
        for b in shuffled_batches(100, 10, torch.Generator().manual_seed(1))
        if 0 < len(long & set(b)) < 10
    ]
    assert len(mixed) >= 5


@pytest.fixture(scope="module")
def demos(tiny_tokenizer):
    return build_demonstrations(
        "ragen/SimpleSokoban-v0", tiny_tokenizer, episode_seeds(0, 12, "train")
    )


def test_sparse_logits_path_equals_full_logits(tiny_path, tiny_tokenizer, demos):
    from ragen_lightning.models import load_causal_lm

    model = load_causal_lm(str(tiny_path))
    items, stats = demos
    assert stats["demo/samples"] == 12 and stats["demo/expert_success_rate"] > 0.8
    batch = collate(items[:4], tiny_tokenizer.pad_token_id)
    sparse, m1 = causal_lm_sft_loss(model, batch)
    full_logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    full, m2 = sft_loss(full_logits, batch.input_ids, batch.loss_mask)
    assert sparse.item() == pytest.approx(full.item(), rel=1e-5)
    assert m1["sft/num_tokens"].item() == batch.loss_mask[:, 1:].sum().item()
    assert m1["sft/token_accuracy"].item() == pytest.approx(m2["sft/token_accuracy"].item())


def test_shared_prefix_gives_the_same_loss_and_gradients(tiny_path, tiny_tokenizer, demos):
    """Demonstrations open with the same system prompt: running it once gives the plain call's loss
    and gradients."""
    from ragen_lightning.models import load_causal_lm
    from ragen_lightning.models.forward import shared_prefix

    model = load_causal_lm(str(tiny_path))
    items, _ = demos
    batch = collate(items[:4], tiny_tokenizer.pad_token_id)
    first = int(batch.loss_mask.bool().any(0).nonzero()[0])
    # the system prompt at least
    assert shared_prefix(batch.input_ids, batch.attention_mask, first - 1) > 100
    results = []
    for share in (False, True):
        model.zero_grad()
        loss, metrics = causal_lm_sft_loss(model, batch, share_prefix=share)
        loss.backward()
        results.append(
            (
                loss.item(),
                metrics["sft/token_accuracy"].item(),
                [p.grad.clone() for p in model.parameters()],
            )
        )
    (l0, a0, g0), (l1, a1, g1) = results
    assert l1 == pytest.approx(l0, rel=1e-6) and a1 == a0
    for x, y in zip(g1, g0, strict=True):
        assert float((x - y).norm()) <= 1e-5 * float(y.norm()) + 1e-9


def test_a_few_steps_reduce_the_loss(tiny_path, tiny_tokenizer, demos):
    from ragen_lightning.models import load_causal_lm

    torch.manual_seed(0)
    model = load_causal_lm(str(tiny_path))
    items, _ = demos
    batch = collate(items[:8], tiny_tokenizer.pad_token_id)
    before = causal_lm_sft_loss(model, batch)[0].item()
    train_sft(
        model, items, tiny_tokenizer.pad_token_id, steps=12, lr=1e-2, batch_size=4, warmup_steps=2
    )
    with torch.no_grad():
        after = causal_lm_sft_loss(model, batch)[0].item()
    assert after < 0.75 * before


def test_datamodule_builds_held_out_padded_batches(tiny_path):
    dm = DemonstrationDataModule(
        "ragen/Bandit-v0",
        model=str(tiny_path),
        num_episodes=6,
        val_episodes=3,
        seed=1,
        episode=EpisodeSettings(max_turns=1, max_actions_per_turn=1, max_actions_per_episode=1),
        batch_size=4,
    )
    dm.setup("fit")
    assert len(dm.train_demos) == 6 and len(dm.val_demos) == 3
    assert dm.stats["demo/expert_success_rate"] == 1.0
    batch = next(iter(dm.train_dataloader()))
    assert isinstance(batch, SFTBatch) and batch.input_ids.shape[0] == 4
    lengths = batch.attention_mask.sum(1)
    # right padding: real tokens first, then pads with mask 0
    for row, n in enumerate(lengths.tolist()):
        assert batch.attention_mask[row, :n].all() and not batch.attention_mask[row, n:].any()
        assert not batch.loss_mask[row, n:].any() and batch.loss_mask[row, :n].any()
    again = DemonstrationDataModule(
        "ragen/Bandit-v0",
        model=str(tiny_path),
        num_episodes=6,
        val_episodes=3,
        seed=1,
        episode=EpisodeSettings(max_turns=1, max_actions_per_turn=1, max_actions_per_episode=1),
        batch_size=4,
    )
    again.setup("fit")
    # seeded shuffling
    assert torch.equal(next(iter(again.train_dataloader())).input_ids, batch.input_ids)


def test_datamodule_errors_name_the_problem(tiny_path):
    with pytest.raises(ValueError, match="ragen/NoSuchEnv-v0"):
        DemonstrationDataModule("ragen/NoSuchEnv-v0", model=str(tiny_path))
    with pytest.raises(ValueError, match="num_episodes"):
        DemonstrationDataModule("ragen/Bandit-v0", model=str(tiny_path), num_episodes=0)
    # a one-action budget never solves a uniform-depth Sokoban level (min_solution_steps=2; RAGEN's
    # generator, the presets' default, has 1-step levels)
    dm = DemonstrationDataModule(
        "ragen/Sokoban-v0",
        model=str(tiny_path),
        num_episodes=3,
        val_episodes=0,
        episode=EpisodeSettings(max_actions_per_episode=1),
        only_successful=True,
    )
    with pytest.raises(ValueError, match="no demonstrations for ragen/Sokoban-v0.*only_successful"):
        dm.setup("fit")


def test_module_runs_under_trainer(tiny_path):
    import lightning as L

    module = SFTModule(str(tiny_path), lr=3e-3, warmup_steps=1)
    dm = DemonstrationDataModule(
        "ragen/Bandit-v0",
        model=str(tiny_path),
        num_episodes=8,
        val_episodes=2,
        episode=EpisodeSettings(max_turns=1, max_actions_per_turn=1, max_actions_per_episode=1),
        batch_size=2,
    )
    trainer = L.Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        val_check_interval=3,
    )
    trainer.fit(module, dm)
    assert trainer.global_step == 3
    metrics = trainer.callback_metrics
    assert torch.isfinite(metrics["sft/loss"]) and 0.0 <= metrics["sft/token_accuracy"] <= 1.0
    assert torch.isfinite(metrics["sft/val_loss"])


def test_lora_trains_adapters_only_and_exports_merged(tiny_path, tmp_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    module = SFTModule(str(tiny_path), lora_rank=4, lora_alpha=8)
    trainable = [n for n, p in module.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # make the adapters do something, then check the merged export reproduces it
    with torch.no_grad():
        for n, p in module.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    out = module.save_pretrained(tmp_path / "export")
    merged = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([tiny_tokenizer.encode("<think>box</think>", add_special_tokens=False)])
    with torch.no_grad():
        assert torch.allclose(
            merged(input_ids=ids).logits, module.model(input_ids=ids).logits, atol=1e-5
        )
    assert (out / "tokenizer.json").is_file()


class _CharTokenizer:
    """One character per id (id = code point): decode joins them."""

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_reading_clauses_cut_every_turn_after_its_first_semicolon():
    from ragen_lightning.sft.experts import reading_clauses

    text = "Pab;cd#ef;g"  # prompt "P", turn "ab;cd", user "#", turn "ef;g"
    mask = (0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1)
    (cut,) = reading_clauses([Demonstration(tuple(map(ord, text)), mask)], _CharTokenizer())
    # each turn keeps "<clause>;"; the context between turns stays; the sequence ends after the last
    # trained token
    assert "".join(map(chr, cut.input_ids)) == "Pab;cd#ef;"
    assert cut.loss_mask == (0, 1, 1, 1, 0, 0, 0, 1, 1, 1)
    # a turn without the separator is its own clause
    (whole,) = reading_clauses([Demonstration(tuple(map(ord, "Pxy")), (0, 1, 1))], _CharTokenizer())
    assert whole.loss_mask == (0, 1, 1) and len(whole.input_ids) == 3


def test_reading_phase_trains_only_the_clause_then_the_whole_response(
    tiny_path, tiny_tokenizer, demos
):
    """Steps inside the reading phase leave the loss on the moves after ';' untouched by design: a
    phase of reading steps lowers the clause's loss more than the same steps on whole responses do,
    and the later steps use the whole responses."""
    from ragen_lightning.models import load_causal_lm
    from ragen_lightning.sft.experts import reading_clauses

    items, _ = demos
    clauses = reading_clauses(items, tiny_tokenizer)
    assert all(sum(c.loss_mask) < sum(d.loss_mask) for c, d in zip(clauses, items))
    probe = collate(clauses[:8], tiny_tokenizer.pad_token_id)

    def clause_loss_after(reading_steps):
        torch.manual_seed(0)
        model = load_causal_lm(str(tiny_path))
        losses = train_sft(
            model,
            items,
            tiny_tokenizer.pad_token_id,
            steps=9,
            lr=1e-2,
            batch_size=4,
            warmup_steps=2,
            reading_steps=reading_steps,
            reading_demos=clauses,
        )
        with torch.no_grad():
            return causal_lm_sft_loss(model, probe)[0].item(), losses

    whole, whole_losses = clause_loss_after(0)
    reading, reading_losses = clause_loss_after(8)
    assert reading < whole
    assert reading_losses[:8] != whole_losses[:8]  # other targets from the first step on
    with pytest.raises(ValueError, match="no demonstrations"):
        train_sft(
            load_causal_lm(str(tiny_path)),
            items,
            tiny_tokenizer.pad_token_id,
            steps=2,
            lr=1e-3,
            batch_size=4,
            reading_steps=1,
        )


def test_threaded_sft_backward_gives_the_whole_batchs_gradient_and_metrics(tiny_path):
    from transformers import AutoModelForCausalLM

    from ragen_lightning.sft.module import Demonstration
    from ragen_lightning.sft.training import sft_backward

    g = torch.Generator().manual_seed(3)
    # a shared prefix, as the system prompt is
    prompt = torch.randint(3, 300, (20,), generator=g).tolist()
    demos = []
    # unequal lengths and trained-token counts
    for n, trained in ((9, 4), (3, 3), (14, 2), (6, 6), (11, 5)):
        tail = torch.randint(3, 300, (n,), generator=g).tolist()
        demos.append(
            Demonstration(tuple(prompt + tail), tuple([0] * (20 + n - trained) + [1] * trained))
        )
    results = []
    for threads in (1, 2, 3):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_path)
        loss, metrics = sft_backward(model, demos, 0, threads)
        results.append((loss, metrics, {k: p.grad.clone() for k, p in model.named_parameters()}))
    (loss, metrics, grads) = results[0]
    assert metrics["sft/num_tokens"].item() == 4 + 3 + 2 + 6 + 5
    for other_loss, other_metrics, other_grads in results[1:]:
        # parts weighted by their share of the 20 trained tokens: the token mean of the whole batch
        torch.testing.assert_close(other_loss, loss, atol=1e-6, rtol=1e-5)
        for name in ("sft/loss", "sft/token_accuracy", "sft/num_tokens"):
            torch.testing.assert_close(
                other_metrics[name].float(), metrics[name].float(), atol=1e-6, rtol=1e-5
            )
        for k in grads:
            torch.testing.assert_close(other_grads[k], grads[k], atol=1e-6, rtol=1e-4, msg=k)


def test_on_step_sees_every_step_and_stops_the_run_where_it_says(tiny_path, tiny_tokenizer, demos):
    from ragen_lightning.models import load_causal_lm

    items, _ = demos

    def run(stop_at):
        torch.manual_seed(0)
        model = load_causal_lm(str(tiny_path))
        seen = []

        def on_step(step, loss):
            seen.append((step, loss, model.training))
            return step == stop_at

        losses = train_sft(
            model,
            items,
            tiny_tokenizer.pad_token_id,
            steps=5,
            lr=1e-2,
            batch_size=4,
            on_step=on_step,
        )
        return losses, seen, model.training

    full, full_seen, _ = run(None)
    cut, cut_seen, training = run(3)
    assert [s for s, _, _ in full_seen] == [1, 2, 3, 4, 5] and [
        loss for _, loss, _ in full_seen
    ] == full
    assert cut == full[:3] and [s for s, _, _ in cut_seen] == [1, 2, 3]  # the same steps, then stop
    assert all(t for *_, t in cut_seen) and not training  # train mode in the hook, eval after


def test_per_episode_successes_are_the_rate_episode_by_episode(tiny_path):
    from ragen_lightning.rollout.seeds import episode_seeds
    from ragen_lightning.sft.evaluation import evaluate_policy

    episode = EpisodeSettings(max_turns=1, max_actions_per_turn=1, max_actions_per_episode=1)
    kw = dict(num_episodes=6, seed=2, exclude_seeds=[5], episode=episode)
    out = evaluate_policy(str(tiny_path), "ragen/Bandit-v0", per_episode=True, **kw)
    assert out["seeds"] == episode_seeds(2, 6, "eval", exclude=[5])
    assert sum(out["successes"]) / 6 == out["success_rate"] and set(out["successes"]) <= {0, 1}
    assert "successes" not in evaluate_policy(str(tiny_path), "ragen/Bandit-v0", **kw)


def test_a_callers_optimizer_is_the_one_stepped(tiny_path, tiny_tokenizer, demos):
    from ragen_lightning.models import load_causal_lm

    items, _ = demos
    model = load_causal_lm(str(tiny_path))
    before = [p.detach().clone() for p in model.parameters()]
    frozen = torch.optim.SGD(model.parameters(), lr=0.0)  # its rate, not lr=1e-2, applies
    train_sft(
        model, items, tiny_tokenizer.pad_token_id, steps=2, lr=1e-2, batch_size=4, optimizer=frozen
    )
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    adam = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_sft(
        model, items, tiny_tokenizer.pad_token_id, steps=2, lr=1e-2, batch_size=4, optimizer=adam
    )
    assert int(adam.state[next(model.parameters())]["step"]) == 2
