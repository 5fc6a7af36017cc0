"""algos.logits: entropy and log-probs from logits on hand-computed values, chunking equivalence,
dtype and -inf."""

from __future__ import annotations

import math

import pytest
import torch

from ragen_lightning.algos.logits import entropy_from_logits, logprobs_from_logits
from tests.unit.algos.helpers import close

T = torch.tensor


def test_entropy_hand_values():
    # uniform over 4: ln 4; p = [.25, .75] (logits [0, ln 3]): .25 ln 4 + .75 ln(4/3) = .5623351
    close(entropy_from_logits(torch.zeros(4)), math.log(4.0))
    close(entropy_from_logits(T([0.0, math.log(3.0)])), 0.5623351)


def test_entropy_extreme_and_masked_logits():
    ninf = float("-inf")
    logits = T(
        [[1e4, -1e4, 0.0], [1e4, 1e4, -1e4], [0.0, ninf, ninf], [0.0, 0.0, ninf]],
        requires_grad=True,
    )
    # one-hot -> 0; two equal maxima -> ln 2; -inf entries are excluded
    h = entropy_from_logits(logits)
    close(h.detach(), [0.0, math.log(2.0), 0.0, math.log(2.0)], atol=1e-6)
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_matches_direct_computation_and_chunking():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 5, 11, generator=gen, dtype=torch.float64) * 3
    p = torch.softmax(logits, -1)
    direct = -(p * torch.log(p)).sum(-1)
    close(entropy_from_logits(logits), direct, atol=1e-10)
    close(entropy_from_logits(logits, chunk_size=4), direct, atol=1e-10)
    assert entropy_from_logits(logits.to(torch.bfloat16)).dtype == torch.float32
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(logits, chunk_size=0)


def test_logprobs_from_logits():
    # log softmax([0, ln 3])[1] = ln .75
    close(logprobs_from_logits(T([[0.0, math.log(3.0)]]), T([1])), [math.log(0.75)])
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(2, 7, 13, generator=gen)
    labels = torch.randint(0, 13, (2, 7), generator=gen)
    expected = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    close(logprobs_from_logits(logits, labels, chunk_size=3), expected, atol=1e-5)
