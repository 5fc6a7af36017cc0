"""Hand-computed checks of ``ragen_lightning.metrics.functional`` (RAGEN's collapse and
rollout-filter metrics)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from ragen_lightning.metrics.functional import (
    cross_logprob_matrices,
    ema_update,
    mean_token_entropy,
    mi_row_terms,
    mutual_information,
    token_entropy,
    within_group_reward_std,
)

# The 2x2 hand example: rows = reasonings z_0, z_1; columns = prompts x_0, x_1; z_m came from x_m.
#   ℓ = [[-1, -3], [-2, -0.5]], prompt_index = [0, 1]
#   a = [-1, -0.5]                                  mean(a) = -0.75
#   b_0 = log((e^-1 + e^-3)/2)   = -1 + log((1 + e^-2)/2)   = -1.5662192
#   b_1 = log((e^-2 + e^-0.5)/2) = -0.5 + log((1 + e^-1.5)/2) = -0.9917339
#   mean(b) = -1.2789765;  mi = -0.75 + 1.2789765 = 0.5289765;  log 2 = 0.6931472
#   population std(b) = |b_0 - b_1| / 2 = 0.2872426 mi_zscore = mean(a - b) / (std + 1e-3) =
#   0.5289765 / 0.2882426 = 1.8351780 argmax rows: [0, 1] = true -> accuracy 1, chance 1/2, above
#   1/2; @2: k_eff 2, chance min(1, 1/2·2) = 1
L2 = torch.tensor([[-1.0, -3.0], [-2.0, -0.5]])
IDX2 = torch.tensor([0, 1])
B0, B1 = -1.5662192, -0.9917339


def _f(x: torch.Tensor) -> float:
    return float(x)


def test_hand_2x2_mi_family():
    a, b = mi_row_terms(L2, IDX2)
    assert a.tolist() == [-1.0, -0.5]
    assert b.tolist() == pytest.approx([B0, B1], abs=1e-6)
    out = mutual_information(L2, IDX2)
    assert _f(out["matched_log_prob_mean"]) == -0.75
    assert _f(out["marginal_log_prob_mean"]) == pytest.approx(-1.2789765, abs=1e-6)
    assert _f(out["mi"]) == pytest.approx(0.5289765, abs=1e-6)
    assert _f(out["mi_upper_bound"]) == pytest.approx(math.log(2), abs=1e-7)
    assert _f(out["conditional_entropy"]) == 0.75
    assert _f(out["marginal_entropy"]) == pytest.approx(1.2789765, abs=1e-6)
    assert _f(out["marginal_std"]) == pytest.approx(0.2872426, abs=1e-6)
    assert _f(out["mi_zscore"]) == pytest.approx(1.8351780, abs=1e-5)
    assert _f(out["retrieval_accuracy"]) == 1.0
    assert _f(out["retrieval_chance_level"]) == 0.5
    assert _f(out["retrieval_above_chance"]) == 0.5
    assert _f(out["retrieval_accuracy@2"]) == 1.0
    assert _f(out["retrieval_chance_level@2"]) == 1.0
    assert _f(out["retrieval_above_chance@2"]) == 0.0
    assert all(v.dim() == 0 and not v.requires_grad for v in out.values())


def test_perfectly_input_dependent_matrix_reaches_log_n():
    # diag 0, off-diagonal -100: a = 0, b = log((1 + 2e^-100)/3) = -log 3 -> mi = log 3, every row
    # retrieved.
    ell = torch.full((3, 3), -100.0).fill_diagonal_(0.0)
    out = mutual_information(ell, torch.arange(3))
    assert _f(out["mi"]) == pytest.approx(math.log(3), abs=1e-6)
    assert _f(out["mi"]) == pytest.approx(_f(out["mi_upper_bound"]), abs=1e-6)
    assert _f(out["conditional_entropy"]) == 0.0
    assert _f(out["marginal_entropy"]) == pytest.approx(math.log(3), abs=1e-6)
    assert _f(out["retrieval_accuracy"]) == 1.0
    assert _f(out["retrieval_chance_level"]) == pytest.approx(1 / 3)
    assert _f(out["retrieval_above_chance"]) == pytest.approx(2 / 3)
    # b is the same for every row -> std 0 exactly, z-score = mean(a - b) / 1e-3 = log 3 / 1e-3
    assert _f(out["marginal_std"]) == 0.0
    assert _f(out["mi_zscore"]) == pytest.approx(math.log(3) / 1e-3, rel=1e-5)


def test_template_collapse_gives_zero_mi_and_chance_retrieval():
    # Every row constant across columns (the reasoning ignores the prompt); rows differ from each
    # other. b_m = a_m exactly -> mi = 0 exactly; conditional entropy = -mean(-1,-2,-3,-4) = 2.5
    # stays high.
    ell = torch.tensor([-1.0, -2.0, -3.0, -4.0])[:, None].expand(4, 4).contiguous()
    out = mutual_information(ell, torch.arange(4))
    assert torch.equal(out["mi"], torch.tensor(0.0))
    assert _f(out["conditional_entropy"]) == 2.5
    assert torch.equal(out["mi_zscore"], torch.tensor(0.0))
    # Ties -> lower column: every row predicts column 0; only row 0 (true 0) is right: 1/4 = chance
    # 1/4.
    assert _f(out["retrieval_accuracy"]) == 0.25 == _f(out["retrieval_chance_level"])
    assert _f(out["retrieval_above_chance"]) == 0.0
    # top-2 = columns {0, 1} for every row: rows 0, 1 hit -> 1/2 = chance@2 = min(1, 1/4·2)
    assert _f(out["retrieval_accuracy@2"]) == 0.5 == _f(out["retrieval_chance_level@2"])
    # k = 4 and 8 -> k_eff = 4 = N: everything hits, chance@k = min(1, 1/4·4) = 1
    assert _f(out["retrieval_accuracy@4"]) == 1.0 == _f(out["retrieval_chance_level@8"])


def test_tie_break_is_lower_column_first():
    ell = torch.tensor([[-1.0, -1.0, -1.0]])
    # true column 1: argmax picks 0 (miss) but top-2 = {0, 1} (hit); true column 2: only the top-3
    # holds it
    assert _f(mutual_information(ell, torch.tensor([1]))["retrieval_accuracy"]) == 0.0
    assert _f(mutual_information(ell, torch.tensor([1]))["retrieval_accuracy@2"]) == 1.0
    out = mutual_information(ell, torch.tensor([2]), topk=(2, 3))
    assert (_f(out["retrieval_accuracy@2"]), _f(out["retrieval_accuracy@3"])) == (
        0.0,
        1.0,
    )
    assert _f(out["retrieval_accuracy"]) == 0.0  # k = 1 is always reported


def test_identical_prompts_count_as_retrieved():
    # Columns 0 and 1 hold the same prompt (signature [7, 7, 9]). Row 0 (from x_0) prefers x_1, row
    # 1 prefers x_0.
    ell = torch.tensor([[-2.0, -1.0, -3.0], [-1.0, -2.0, -3.0], [-3.0, -2.0, -1.0]])
    idx = torch.arange(3)
    plain = mutual_information(ell, idx)
    assert _f(plain["retrieval_accuracy"]) == pytest.approx(1 / 3)  # only row 2
    assert _f(plain["retrieval_chance_level"]) == pytest.approx(1 / 3)
    sig = mutual_information(ell, idx, prompt_signature=torch.tensor([7, 7, 9]))
    assert _f(sig["retrieval_accuracy"]) == 1.0
    # chance = mean(2/3, 2/3, 1/3) = 5/9; chance@2 = min(1, 10/9) = 1
    assert _f(sig["retrieval_chance_level"]) == pytest.approx(5 / 9)
    assert _f(sig["retrieval_above_chance"]) == pytest.approx(4 / 9)
    assert _f(sig["retrieval_chance_level@2"]) == 1.0
    # the MI itself does not use signatures
    assert torch.equal(sig["mi"], plain["mi"])


def test_k_eff_clipping():
    # N = 3: k_eff(1, 2, 4, 8) = (1, 2, 3, 3). The true column 2 ranks third.
    out = mutual_information(torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([2]))
    acc = [
        _f(out[k])
        for k in (
            "retrieval_accuracy",
            "retrieval_accuracy@2",
            "retrieval_accuracy@4",
            "retrieval_accuracy@8",
        )
    ]
    assert acc == [0.0, 0.0, 1.0, 1.0]
    assert _f(out["retrieval_chance_level@4"]) == pytest.approx(1.0)  # min(1, 1/3·3)
    # N = 12 > 8: k = 16 is clipped to 8 (the RAGEN cap), chance@16 = 8/12; the 9th-ranked column is
    # missed.
    row = -torch.arange(12, dtype=torch.float32)[None]
    out = mutual_information(row, torch.tensor([8]), topk=(8, 16))
    assert _f(out["retrieval_accuracy@16"]) == 0.0
    assert _f(out["retrieval_chance_level@16"]) == pytest.approx(8 / 12)
    assert _f(out["retrieval_accuracy@8"]) == 0.0
    out = mutual_information(row, torch.tensor([7]), topk=(16,))
    assert _f(out["retrieval_accuracy@16"]) == 1.0


def test_single_column_and_empty_inputs():
    # N = 1: b = a, mi = 0 = log 1, retrieval trivially 1 = chance.
    out = mutual_information(torch.tensor([[-1.5], [-0.5]]), torch.tensor([0, 0]))
    assert _f(out["mi"]) == 0.0 and _f(out["mi_upper_bound"]) == 0.0
    assert _f(out["retrieval_accuracy"]) == 1.0 == _f(out["retrieval_chance_level@8"])
    # no rows: every value 0, nothing NaN
    out = mutual_information(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long))
    assert all(not torch.isnan(v) for v in out.values())
    assert (
        _f(out["mi"]) == 0.0
        and _f(out["retrieval_accuracy"]) == 0.0
        and _f(out["marginal_std_ema"]) == 0.0
    )


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="prompt_index"):
        mutual_information(L2, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="prompt_signature"):
        mutual_information(L2, IDX2, prompt_signature=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"\[M, N\]"):
        mutual_information(torch.zeros(3), torch.tensor([0, 1, 2]))


def test_token_mean_and_sequence_sum_variants():
    # z_0 has 2 tokens, z_1 has 3; padding holds NaN and must not leak.
    nan = float("nan")
    tok = torch.tensor(
        [
            [
                [-1.0, -2.0, nan],
                [-3.0, -1.0, nan],
            ],  # z_0 under x_0: sum -3, mean -1.5; under x_1: sum -4, mean -2
            [
                [-0.5, -0.5, -2.0],
                [-1.0, -1.0, -1.0],
            ],  # z_1 under x_0: sum -3, mean -1; under x_1: sum -3, mean -1
        ]
    )
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    token_mean, seq_sum = cross_logprob_matrices(tok, mask)
    assert seq_sum.tolist() == [[-3.0, -4.0], [-3.0, -3.0]]
    assert token_mean.tolist() == [[-1.5, -2.0], [-1.0, -1.0]]
    # seq variant: a = [-3, -3], b_0 = log((e^-3 + e^-4)/2), b_1 = -3 -> mi = -(log((1 + e^-1)/2))/2
    out = mutual_information(seq_sum, torch.tensor([0, 1]))
    assert _f(out["mi"]) == pytest.approx(-0.5 * math.log((1 + math.exp(-1)) / 2), abs=1e-6)


def test_ema_zscore_two_updates():
    assert _f(ema_update(None, torch.tensor(0.5))) == 0.5  # init = first value
    assert _f(ema_update(torch.tensor(0.5), torch.tensor(1.0))) == pytest.approx(
        0.55
    )  # 0.9·0.5 + 0.1·1.0
    # Update 1 on the 2x2 matrix, no state: σ_ema = σ = 0.2872426, z_ema = z = 1.8351780.
    first = mutual_information(L2, IDX2)
    assert _f(first["marginal_std_ema"]) == pytest.approx(0.2872426, abs=1e-6)
    assert _f(first["mi_zscore_ema"]) == pytest.approx(1.8351780, abs=1e-5)
    # Update 2 from a state of 0.5: σ_ema = 0.9·0.5 + 0.1·0.2872426 = 0.4787243,
    # z_ema = 0.5289765 / (0.4787243 + 1e-3) = 1.1026679; the batch z-score is unchanged.
    second = mutual_information(L2, IDX2, marginal_std_ema=torch.tensor(0.5))
    assert _f(second["marginal_std_ema"]) == pytest.approx(0.4787243, abs=1e-6)
    assert _f(second["mi_zscore_ema"]) == pytest.approx(1.1026679, abs=1e-5)
    assert _f(second["mi_zscore"]) == pytest.approx(1.8351780, abs=1e-5)
    # chained: feeding the first state back gives 0.9·σ + 0.1·σ = σ
    third = mutual_information(L2, IDX2, marginal_std_ema=first["marginal_std_ema"])
    assert _f(third["marginal_std_ema"]) == pytest.approx(0.2872426, abs=1e-6)


def test_within_group_reward_std():
    # [1,1,1] -> 0; [0,1,2] -> unbiased std 1; eight copies of 0.3 -> exactly 0 (plain torch.std
    # gives ~3e-8)
    std = within_group_reward_std(torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 2.0]]))
    assert std.tolist() == [0.0, 1.0]
    assert torch.equal(within_group_reward_std(torch.full((1, 8), 0.3)), torch.zeros(1))
    assert torch.equal(
        within_group_reward_std(torch.tensor([[0.7], [2.0]])), torch.zeros(2)
    )  # N = 1


def test_token_entropy_and_masked_mean():
    # logits [0, 0] -> log 2; [0, -inf] -> 0
    ent = token_entropy(torch.tensor([[[0.0, 0.0], [0.0, float("-inf")]]]))
    assert ent[0].tolist() == pytest.approx([math.log(2), 0.0])
    # masked mean over the first token only -> log 2; empty mask -> 0
    assert _f(mean_token_entropy(ent, torch.tensor([[1, 0]]))) == pytest.approx(math.log(2))
    assert _f(mean_token_entropy(ent, torch.tensor([[0, 0]]))) == 0.0


def test_functional_import_is_light():
    # A fresh interpreter: other tests here import torchmetrics. functional (and cross, the
    # teacher-forcing of the cross log-prob matrix, which takes any model object) must not pull in
    # lightning, vllm or torchmetrics (the Metric classes are loaded lazily by
    # ragen_lightning.metrics).
    forbidden = (
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "vllm",
        "transformers",
        "torchmetrics",
    )
    code = (
        "import json, sys; import ragen_lightning.metrics.functional, ragen_lightning.metrics.cross; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {forbidden!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
