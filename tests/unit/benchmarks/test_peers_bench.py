"""benchmarks/peers.py: both sides get the same rows, and the update comparison runs on CPU (tiny
sizes)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import load_script

pytest.importorskip("trl", reason="the bench extra (trl) is in the README's install line")


def load():
    return load_script("benchmarks/peers.py", "bench_peers")


def test_fixed_batch_gives_both_sides_the_same_rows_and_grpo_advantages(tiny_tokenizer):
    bench = load()
    batch, trl = bench.fixed_batch(
        tiny_tokenizer, rows=8, group_size=4, prompt_len=20, completion_len=5
    )
    ids = torch.cat([trl["prompt_ids"], trl["completion_ids"]], 1)
    assert torch.equal(batch.input_ids, ids) and batch.input_ids.shape == (8, 25)
    # trained = the completion
    assert batch.loss_mask[:, 20:].all() and not batch.loss_mask[:, :20].any()
    # a group shares its prompt
    assert torch.equal(batch.input_ids[0, :20], batch.input_ids[3, :20])
    # TRL's advantages are the GRPO advantages of the scores this project reads: (score - group
    # mean) / group std
    g = batch.scores.view(2, 4)
    expected = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).flatten()
    assert torch.allclose(trl["advantages"], expected) and float(trl["num_items_in_batch"]) == 8 * 5
    distinct, _ = bench.fixed_batch(
        tiny_tokenizer, rows=8, group_size=4, prompt_len=20, completion_len=5, distinct=True
    )
    assert len({int(t) for t in distinct.input_ids[:, 0]}) == 8  # no two rows share a prefix


def test_varied_lengths_give_both_sides_the_same_real_tokens(tiny_tokenizer):
    """``--lengths varied``: this project's right-padded rows hold exactly TRL's unpadded prompt +
    completion."""
    bench = load()
    for distinct in (False, True):
        batch, trl = bench.fixed_batch(
            tiny_tokenizer,
            rows=8,
            group_size=4,
            prompt_len=20,
            completion_len=8,
            distinct=distinct,
            varied=True,
        )
        lengths = batch.attention_mask.sum(-1)
        assert len(set(lengths.tolist())) > 2  # lengths do vary
        for i in range(8):
            prompt = trl["prompt_ids"][i][trl["prompt_mask"][i].bool()]
            completion = trl["completion_ids"][i][trl["completion_mask"][i].bool()]
            assert torch.equal(batch.input_ids[i, : lengths[i]], torch.cat([prompt, completion]))
            assert (
                batch.loss_mask[i].sum() == len(completion)
                and 10 <= len(prompt) <= 20
                and 2 <= len(completion)
            )
        assert float(trl["num_items_in_batch"]) == float(trl["completion_mask"].sum())
        firsts = {tuple(batch.input_ids[i, :10].tolist()) for i in range(8)}
        assert len(firsts) == (8 if distinct else 2)  # a group's rows still share their prompt


@pytest.mark.slow
def test_update_comparison_runs_on_cpu(capsys, tiny_path):
    bench = load()
    bench.main(
        [
            "--part",
            "update",
            "--model",
            str(tiny_path),
            "--rows",
            "4",
            "--group-size",
            "2",
            "--micro-batch",
            "2",
            "--prompt-len",
            "16",
            "--completion-len",
            "4",
            "--repeats",
            "1",
            "--steps",
            "1",
        ]
    )
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "s / update" not in line]
    assert [r.split(" | ")[0] for r in rows] == [
        "| this project",
        "| TRL GRPOTrainer",
        "| this project, micro_batch_tokens 40",
        "| this project, micro_batch_tokens 40, pack",
        "| this project, micro_batch_threads 2 (torch threads 1 each)",
        # the budget: --micro-batch rows of prompt + completion tokens
        "| TRL GRPOTrainer, torch threads 1",
    ]
    # vs TRL; vs this project's default
    assert " | 1.00x | " in rows[1] and rows[0].endswith("| 1.00x |")


@pytest.mark.slow
def test_the_two_updates_are_the_same_update(capsys, tiny_path):
    bench = load()
    bench.main(
        [
            "--check",
            "--lr",
            "1e-3",
            "--model",
            str(tiny_path),
            "--rows",
            "4",
            "--group-size",
            "2",
            "--micro-batch",
            "2",
            "--prompt-len",
            "16",
            "--completion-len",
            "4",
        ]
    )
    line = capsys.readouterr().out.strip().splitlines()[-1]
    diff, mine, theirs = (
        float(x)
        for x in __import__("re").findall(
            r"changes: (\S+) x lr; gradient norms (\S+) .* and (\S+) \(TRL\)", line
        )[0]
    )
    # every weight moved the same way (a flipped gradient sign would differ by 2 lr) and the
    # gradients are equal
    assert diff < 0.1 and mine == pytest.approx(theirs, rel=1e-4) and mine > 0
    # varied lengths, this project packed with a token budget, TRL padded: the same update too
    bench.main(
        [
            "--check",
            "--lr",
            "1e-3",
            "--model",
            str(tiny_path),
            "--rows",
            "4",
            "--group-size",
            "2",
            "--micro-batch",
            "2",
            "--prompt-len",
            "16",
            "--completion-len",
            "8",
            "--lengths",
            "varied",
            "--pack",
            "--micro-batch-tokens",
            "40",
        ]
    )
    line = capsys.readouterr().out.strip().splitlines()[-1]
    diff, mine, theirs = (
        float(x)
        for x in __import__("re").findall(
            r"changes: (\S+) x lr; gradient norms (\S+) .* and (\S+) \(TRL\)", line
        )[0]
    )
    assert diff < 0.1 and mine == pytest.approx(theirs, rel=1e-4) and mine > 0
