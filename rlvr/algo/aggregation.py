"""Masked reductions and loss aggregation that make gradient accumulation exact.

Contract: a per-token quantity ``x [B, T]`` with a loss mask ``mask [B, T]`` (1 on trained response
tokens, rows right-padded) is reduced to a scalar whose *sum over micro-batches* equals the value
the whole global batch would give in one piece (DESIGN "Batch sizes"). For that,
the normaliser is a property of the global batch, passed in as ``denominator``:

* per-sample mode (slime's default): ``sum_i mean_t(x_i) / n_samples_in_global_batch`` — each
  response weighs the same regardless of length (GRPO, DeepSeekMath eq. 3).
* per-token mode (``--calculate-per-token-loss``, DAPO's "token-level policy gradient loss"):
  ``sum_{i,t} x_it / n_masked_tokens_in_global_batch`` — each token weighs the same.

A sample with no masked token contributes 0 (its per-sample mean divides by ``max(count, 1)``, as
slime's ``clamp_min(loss_mask.sum(), 1)``), never NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x * mask`` over ``dim`` (all elements if None). Shapes: x, mask [B, T]."""
    prod = x * mask
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1; 0 where there are none.

    Args:
        x: [B, T] values. mask: [B, T] 0/1 (float or bool).
        dim: None for one scalar over everything; 1 for one mean per row ([B]).

    >>> masked_mean(torch.tensor([[1., 3., 9.]]), torch.tensor([[1., 1., 0.]])).item()
    2.0
    >>> masked_mean(torch.tensor([[1., 3.], [5., 7.]]), torch.tensor([[1., 0.], [0., 0.]]), dim=1)
    tensor([1., 0.])
    """
    mask = mask.to(x.dtype)
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1.0)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Whiten ``x`` with the mean and unbiased variance of its masked entries (``--normalize-advantages``).

    Matches slime's ``distributed_masked_whiten`` on one process: variance from sums and sums of
    squares, Bessel-corrected when at least 2 entries are masked, ``(x - mean) * rsqrt(var + eps)``
    with ``eps = 1e-8``; ``shift_mean=False`` adds the mean back. Entries outside the mask are
    transformed too (they are ignored downstream). Raises if nothing is masked, like slime.

    Args: x [B, T], mask [B, T]. Returns [B, T].
    """
    mask = mask.to(x.dtype)
    n = mask.sum()
    if n.item() == 0:
        raise ValueError("masked_whiten: the mask selects no entries (every loss_mask row is 0)")
    mean = masked_sum(x, mask) / n
    var = masked_sum(x * x, mask) / n - mean * mean
    if n.item() >= 2:
        var = var * n / (n - 1)  # Bessel's correction, as slime
    out = (x - mean) * torch.rsqrt(var + eps)
    return out if shift_mean else out + mean


def aggregate_loss(x: Tensor, mask: Tensor, per_token: bool, denominator: float) -> Tensor:
    """Reduce a per-token loss to the scalar this micro-batch contributes to the global batch.

    Args:
        x: [B, T] per-token loss (or metric).
        mask: [B, T] loss mask of this micro-batch.
        per_token: False = per-sample mean (slime default); True = ``--calculate-per-token-loss``.
        denominator: per-sample mode: number of samples in the global batch; per-token mode: number
            of masked tokens in the global batch (``global_denominator`` computes either).

    Returns:
        scalar. Summing it over the micro-batches of a global batch equals calling it once on the
        whole batch, so the accumulated gradient does not depend on the split.

    >>> x, m = torch.tensor([[2., 4.], [6., 0.]]), torch.tensor([[1., 1.], [1., 0.]])
    >>> aggregate_loss(x, m, per_token=False, denominator=2).item()  # (3 + 6) / 2
    4.5
    >>> aggregate_loss(x, m, per_token=True, denominator=3).item()   # (2 + 4 + 6) / 3
    4.0
    """
    if denominator <= 0:
        raise ValueError(f"aggregate_loss: denominator must be > 0, got {denominator}")
    if per_token:
        return masked_sum(x, mask.to(x.dtype)) / denominator
    return masked_mean(x, mask, dim=1).sum() / denominator


def global_denominator(masks: list[Tensor], per_token: bool) -> float:
    """The ``denominator`` for ``aggregate_loss`` from all micro-batch masks of one global batch.

    Per-sample: the number of rows; per-token: the number of masked tokens (at least 1).
    """
    if per_token:
        return max(float(sum(m.sum().item() for m in masks)), 1.0)
    return float(sum(m.shape[0] for m in masks))
