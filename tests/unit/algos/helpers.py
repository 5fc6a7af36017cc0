"""Assertion helper shared by the algos tests."""

import torch


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    """``actual`` equals the hand-computed ``expected`` (a number, list or tensor) to float32
    precision."""
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-6
    )
