"""Splitting a global batch into micro-batches, and a rollout into data-parallel shares.

Dynamic batch size (``--use-dynamic-batch-size --max-tokens-per-gpu``) follows slime's two stages:
first-fit decides *how many* micro-batches are needed, Karmarkar–Karp decides
*which* samples go together so their token totals are balanced. slime's version has two known
failures, both impossible here by construction:

* KK optimises balance and knows nothing of the cap, so a balanced bucket can exceed
  ``max_tokens_per_gpu`` (an OOM, worse with padded attention). ``micro_batches`` repairs any such
  bucket by moving samples to buckets with room, and if that would need an extra bucket it keeps
  the first-fit assignment instead (always within the cap, same count).
* When data-parallel ranks agree on a larger count than a rank needs, slime's capped fallback can
  emit an *empty* bucket (whose ``torch.cat([])`` then fails). Here a count larger than the
  number of samples is an error that says so, and no returned bucket is ever empty.

Among the candidates with the minimal count (repaired KK, first-fit decreasing, first-fit in input
order) the most balanced one is returned, so the result is never less balanced than first-fit's.

A single sample longer than the cap cannot be placed anywhere: ``first_fit`` raises; the trainer
filters such samples out beforehand and counts them (``overlong``). ``fixed_size`` chunks by a
sample count (``--micro-batch-size``). ``pad_right`` builds right-padded per-token tensors.
"""

from __future__ import annotations

import heapq
import itertools
import logging

import torch

log = logging.getLogger(__name__)


def first_fit(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped into bins of total length <= ``max_tokens``: items in input order, each into
    the first bin that still fits it.

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


def first_fit_decreasing(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """``first_fit`` over the items sorted longest first (slime's count; never more bins than
    ``first_fit`` in input order for typical inputs). Returns original indices.

    >>> first_fit_decreasing([2, 6, 3, 5], 8)
    [[1, 0], [3, 2]]
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [[order[j] for j in b] for b in first_fit([lengths[i] for i in order], max_tokens)]


def balanced_partitions(lengths: list[int], k: int, equal_size: bool = False) -> list[list[int]]:
    """Karmarkar–Karp largest differencing method: indices split into ``k`` parts with token
    totals as equal as possible (Karmarkar & Karp 1982; the k-way form of verl's and slime's
    ``get_seqlen_balanced_partitions``).

    Each item starts as a partial solution of ``k`` parts (one holding the item); repeatedly the
    two partial solutions with the largest spread are merged, largest part with smallest. With
    ``equal_size`` every part gets ``len(lengths) / k`` items (the items are seeded k at a time, in
    sorted order). Parts come back sorted by their smallest index; a part is empty only when
    there are fewer items than ``k``.

    >>> balanced_partitions([3, 3, 2, 2, 2], 2)
    [[0, 2], [1, 3, 4]]
    >>> balanced_partitions([8, 1, 7, 2], 2, equal_size=True)
    [[0, 1], [2, 3]]
    """
    if k < 1:
        raise ValueError(f"balanced_partitions: k must be >= 1, got {k}")
    if equal_size and len(lengths) % k:
        raise ValueError(f"balanced_partitions: {len(lengths)} items cannot be split into {k} equal parts")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    counter = itertools.count()  # tie-breaker: heap entries never compare their lists
    heap: list = []

    def push(parts: list[tuple[int, list[int]]]) -> None:
        parts.sort(key=lambda p: -p[0])
        heapq.heappush(heap, (-(parts[0][0] - parts[-1][0]), next(counter), parts))

    step = k if equal_size else 1
    for start in range(0, len(order), step):
        seeds = [(lengths[i], [i]) for i in order[start : start + step]]
        push(seeds + [(0, []) for _ in range(k - len(seeds))])
    if not heap:
        return [[] for _ in range(k)]
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        push([(a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]) for j in range(k)])
    parts = [sorted(items) for _, items in heap[0][2]]
    return sorted(parts, key=lambda p: p[0] if p else len(lengths))


def spread(lengths: list[int], parts: list[list[int]]) -> int:
    """Largest minus smallest token total over ``parts`` (0 = perfectly balanced).

    >>> spread([3, 3, 2], [[0], [1, 2]])
    2
    """
    totals = [sum(lengths[i] for i in p) for p in parts]
    return max(totals) - min(totals)


def _repair(lengths: list[int], parts: list[list[int]], max_tokens: int) -> list[list[int]] | None:
    """Move samples out of over-cap parts into the emptiest part they fit in; None if some sample
    fits nowhere (the caller then falls back to first-fit). Empty parts are dropped."""
    parts = [list(p) for p in parts if p]
    totals = [sum(lengths[i] for i in p) for p in parts]
    for b in range(len(parts)):
        # Move the shortest samples first: the fewest tokens leave the balanced assignment.
        for i in sorted(parts[b], key=lambda i: lengths[i]):
            if totals[b] <= max_tokens:
                break
            room = [c for c in range(len(parts)) if c != b and totals[c] + lengths[i] <= max_tokens]
            if not room:
                return None
            c = min(room, key=lambda c: totals[c])
            parts[b].remove(i)
            parts[c].append(i)
            totals[b] -= lengths[i]
            totals[c] += lengths[i]
    return [sorted(p) for p in parts if p]


def micro_batches(lengths: list[int], max_tokens: int, min_count: int = 1) -> list[list[int]]:
    """Sample indices split into micro-batches of at most ``max_tokens`` tokens each, none empty,
    every index exactly once, as balanced as KK allows.

    The count is first-fit decreasing's, raised to ``min_count`` when data-parallel ranks must
    agree on a common count (it must not exceed the number of samples: an empty micro-batch is
    never produced). Every length must be <= ``max_tokens``.

    >>> micro_batches([3, 3, 2, 2, 2], 6)
    [[0, 1], [2, 3, 4]]
    >>> micro_batches([5, 1, 1, 1], 6, min_count=2)
    [[0], [1, 2, 3]]
    """
    if not lengths:
        return []
    ffd = first_fit_decreasing(lengths, max_tokens)  # raises on a sample over the cap
    k = max(len(ffd), min_count)
    if k > len(lengths):
        raise ValueError(
            f"cannot make {k} non-empty micro-batches from {len(lengths)} samples; a data-parallel "
            "rank needs at least as many samples as micro-batches (lower the rank count or raise the batch size)"
        )
    candidates = []
    kk = _repair(lengths, balanced_partitions(lengths, k), max_tokens)
    if kk is not None and len(kk) == k:
        candidates.append(kk)
    if len(ffd) == k:
        candidates += [ffd, first_fit(lengths, max_tokens)]
    candidates = [c for c in candidates if len(c) == k]
    if not candidates:  # min_count above the first-fit count and KK could not be repaired
        raise ValueError(f"cannot split {len(lengths)} samples into {k} micro-batches of <= {max_tokens} tokens")
    return min(candidates, key=lambda c: spread(lengths, c))


def fixed_size(n_items: int, size: int) -> list[list[int]]:
    """Consecutive chunks of ``size`` indices (the last may be shorter).

    >>> fixed_size(5, 2)
    [[0, 1], [2, 3], [4]]
    """
    return [list(range(s, min(s + size, n_items))) for s in range(0, n_items, size)]


def data_parallel_split(lengths: list[int], world_size: int, balance: bool) -> list[list[int]]:
    """A rollout's sample indices split across ``world_size`` data-parallel ranks, the same number
    each: by token count with KK (``--balance-data``, slime's ``_split_train_data_by_dp``) or in
    contiguous slices. The sample count must divide by ``world_size``.

    >>> data_parallel_split([9, 1, 8, 2], 2, balance=False)
    [[0, 1], [2, 3]]
    >>> data_parallel_split([9, 8, 2, 1], 2, balance=True)
    [[0, 3], [1, 2]]
    """
    n = len(lengths)
    if world_size < 1 or n % world_size:
        raise ValueError(f"{n} samples cannot be split evenly across {world_size} data-parallel ranks")
    if balance:
        return balanced_partitions(lengths, world_size, equal_size=True)
    share = n // world_size
    return [list(range(r * share, (r + 1) * share)) for r in range(world_size)]


def pad_right(rows: list[list[float]] | list[list[int]], width: int, value: float = 0.0, dtype=torch.float32):
    """``[len(rows), width]`` tensor, each row left-aligned and padded with ``value``."""
    out = torch.full((len(rows), width), value, dtype=dtype, device="cpu")  # on the host; callers move it once
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype, device="cpu")
    return out


# ---- the trainer's micro-batches ---------------------------------------------------------------
class MicroBatcher:
    """A rollout's samples into micro-batches as the config asks (``--use-dynamic-batch-size``'s
    token cap, or ``--micro-batch-size``), through a data-parallel strategy (``parallel.py``: this
    rank's share, as many micro-batches on every rank)."""

    def __init__(self, train, parallel, device: torch.device):
        self.cap = train.max_tokens_per_gpu
        self.dynamic, self.size = train.use_dynamic_batch_size, train.micro_batch_size
        self.dp, self.device = parallel, device

    def fitting(self, samples) -> set[int]:
        """Indices of the samples that fit one micro-batch; the others are logged and left out."""
        cap = self.cap if self.dynamic else None
        kept = {i for i, s in enumerate(samples) if cap is None or s.total_length <= cap}
        if len(kept) < len(samples):
            longest = max(s.total_length for s in samples)
            log.warning("%d of %d samples are longer than --max-tokens-per-gpu %d (longest %d tokens) and are "
                        "left out of training; raise the cap or lower --rollout-max-response-len",
                        len(samples) - len(kept), len(samples), cap, longest)
        return kept

    def split(self, samples, idx: list[int]) -> list[list[int]]:
        """Micro-batches of ``idx`` (data-parallel: of this rank's share, as many on every rank)."""
        idx = self.dp.share(idx, [samples[i].total_length for i in idx])
        lengths = [samples[i].total_length for i in idx]
        if self.dynamic:
            count = len(first_fit_decreasing(lengths, self.cap)) if lengths else 0
            bins = micro_batches(lengths, self.cap, self.dp.agree_count(count))
        else:
            bins = fixed_size(len(idx), self.size)
        if self.dp.agree_count(len(bins)) != len(bins):
            raise ValueError(f"rank {self.dp.rank}: {len(idx)} samples make {len(bins)} micro-batches, fewer than "
                             "another rank's; data-parallel ranks must run as many (raise the batch size)")
        return [[idx[j] for j in b] for b in bins]

    def forward_all(self, forward, samples, kept: set[int], width: int) -> torch.Tensor:
        """``forward(micro-batch samples) -> [b, width]`` run over the kept samples, micro-batched
        (rows of the others stay 0)."""
        out = torch.zeros(len(samples), width, device=self.device)
        for mb in self.split(samples, sorted(kept)):
            out[mb] = forward([samples[i] for i in mb]).float()
        return self.dp.all_reduce_sum_(out)

    def with_signal(self, idx: list[int], silent: set[int]) -> list[int]:
        """``idx`` without its silent samples. Data-parallel: as many as a multiple of the world
        size (silent ones put back, they add exact zeros), so every rank gets an equal share and
        so as many micro-batches, and every rank leaves the same ones out (the advantages are the
        same on every rank); with an uneven ``idx`` (overlong samples left out) nothing is left out."""
        trained = [i for i in idx if i not in silent]
        world = self.dp.world_size
        if world > 1 and len(idx) % world:
            return idx
        back = set([i for i in idx if i in silent][: -len(trained) % world])
        return [i for i in idx if i not in silent or i in back]
