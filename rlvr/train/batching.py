"""Splitting a global batch into micro-batches.

``first_fit`` is slime's dynamic-batch count (seed 000 §2.4): walk the samples in order and put
each into the first micro-batch whose token total stays within the cap. A sample longer than
the cap on its own cannot be placed; that is an error here, with the numbers to change.
``fixed_size`` chunks by a sample count. Both return lists of indices, never an empty list.
``pad_right`` and ``token_batch`` build the right-padded tensors a micro-batch runs on.
"""

from __future__ import annotations

import torch

from rlvr.types import Sample


def first_fit(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped into bins of total length <= ``max_tokens``, first bin that fits.

    >>> first_fit([5, 3, 4, 2], 8)
    [[0, 1], [2, 3]]
    >>> first_fit([6, 6, 2], 8)
    [[0, 2], [1]]
    """
    bins: list[list[int]] = []
    totals: list[int] = []
    for i, n in enumerate(lengths):
        if n > max_tokens:
            raise ValueError(
                f"a sample of {n} tokens exceeds --max-tokens-per-gpu {max_tokens}; raise it or lower "
                "--rollout-max-response-len"
            )
        for b, total in enumerate(totals):
            if total + n <= max_tokens:
                bins[b].append(i)
                totals[b] += n
                break
        else:
            bins.append([i])
            totals.append(n)
    return bins


def fixed_size(n_items: int, size: int) -> list[list[int]]:
    """Consecutive chunks of ``size`` indices (the last may be shorter).

    >>> fixed_size(5, 2)
    [[0, 1], [2, 3], [4]]
    """
    return [list(range(s, min(s + size, n_items))) for s in range(0, n_items, size)]


def pad_right(rows: list[list[float]] | list[list[int]], width: int, value: float = 0.0, dtype=torch.float32):
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def token_batch(samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``[b, L]`` of prompt + response, right-padded."""
    lengths = [s.total_length for s in samples]
    seq = pad_right([s.prompt_ids + s.response_ids for s in samples], max(lengths), dtype=torch.long)
    attn = pad_right([[1] * n for n in lengths], max(lengths), dtype=torch.long)
    return seq, attn
