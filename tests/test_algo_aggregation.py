"""Aggregation: hand values, micro-batch invariance of loss and gradient, empty rows."""

import pytest
import torch

from rlvr.algo import aggregate_loss, global_denominator, masked_mean, masked_whiten

X = torch.tensor([[2.0, 4.0, 100.0], [6.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_masked_mean_values_and_empty_rows():
    assert masked_mean(X, M).item() == 4.0  # (2 + 4 + 6) / 3
    assert masked_mean(X, M, dim=1).tolist() == [3.0, 6.0, 0.0]  # empty row -> 0, not NaN
    assert masked_mean(X, torch.zeros_like(M)).item() == 0.0


def test_aggregate_per_sample_and_per_token():
    # per sample: (3 + 6 + 0) / 3 samples; per token: (2 + 4 + 6) / 3 tokens
    assert aggregate_loss(X, M, per_token=False, denominator=3).item() == 3.0
    assert aggregate_loss(X, M, per_token=True, denominator=3).item() == 4.0
    assert global_denominator([M[:2], M[2:]], per_token=False) == 3.0
    assert global_denominator([M[:2], M[2:]], per_token=True) == 3.0


@pytest.mark.parametrize("per_token", [False, True])
def test_micro_batches_sum_to_the_global_batch(per_token):
    torch.manual_seed(0)
    w = torch.randn(6, 7, requires_grad=True)
    mask = (torch.rand(6, 7) > 0.3).float()
    mask[4] = 0  # an empty sample
    denom = global_denominator([mask], per_token)
    whole = aggregate_loss(w * 3.0, mask, per_token, denom)
    (g_whole,) = torch.autograd.grad(whole, w)
    parts = [slice(0, 1), slice(1, 4), slice(4, 6)]
    split = sum(aggregate_loss(w[s] * 3.0, mask[s], per_token, denom) for s in parts)
    (g_split,) = torch.autograd.grad(split, w)
    assert torch.allclose(whole, split, atol=1e-6)
    assert torch.allclose(g_whole, g_split, atol=1e-6)
    assert torch.isfinite(g_whole).all()


def test_masked_whiten_hand_values():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # masked mean 2, unbiased var 1 -> (x - 2) / 1
    assert torch.allclose(masked_whiten(x, m), torch.tensor([[-1.0, 0.0, 1.0, 98.0]]), atol=1e-6)
    assert torch.allclose(masked_whiten(x, m, shift_mean=False), torch.tensor([[1.0, 2.0, 3.0, 100.0]]), atol=1e-6)
    with pytest.raises(ValueError, match="no entries"):
        masked_whiten(x, torch.zeros_like(m))


def test_aggregate_rejects_bad_denominator():
    with pytest.raises(ValueError):
        aggregate_loss(X, M, per_token=False, denominator=0)
