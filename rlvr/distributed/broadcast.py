"""Weights from training rank 0 to the engines by a torch.distributed broadcast (``--weight-sync broadcast``).

The other way (``object_store``, ``rlvr.distributed.weight_sync``) puts rank 0's weights in Ray's
object store, which on one node is shared memory and across nodes a copy per reading node. This
one is slime's disaggregated path (weights streamed to the engines after each step):
rank 0 and the M engine actors form a process group of their own (rank 0 = training rank 0,
rank 1 + i = engine i; NCCL between GPUs, gloo on CPU, ``rlvr.core.device.process_group_backend``),
separate from the training ranks' group, rendezvousing on a TCP store that training rank 0 hosts.

Every push streams bucket by bucket: consecutive tensors of one dtype are flattened into one
buffer of at most ``--update-weight-buffer-size`` bytes (a larger tensor goes alone), broadcast
from rank 0, and each engine copies the views of its buffer into its model before the next
bucket arrives (``EmbeddedEngine.update_weights`` reads the stream lazily), so an engine never
holds a second copy of the whole model. Both ends cut the buckets from the same ``TensorSpec``
list (names, shapes, dtypes of what ``Trainer.weights()`` returns), fixed when the group forms.

An engine re-created after the group formed cannot join it, so config validation refuses
``broadcast`` with ``--use-fault-tolerance``; with ``--colocate`` (engines share the ranks'
devices) and ``--async`` (the producer pushes from its own thread) too. An engine that dies
mid-push stops the run: its actor error surfaces at once, and rank 0's half-done broadcast fails
when the group's timeout (10 minutes) runs out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator, Mapping

import torch
import torch.distributed as dist

STORE_PREFIX = "rlvr-weights"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def specs_of(named: Mapping[str, torch.Tensor]) -> list[TensorSpec]:
    return [TensorSpec(n, tuple(t.shape), t.dtype) for n, t in named.items()]


def buckets(specs: list[TensorSpec], buffer_bytes: int) -> list[list[int]]:
    """Indices of ``specs`` in broadcast order: runs of consecutive tensors of one dtype, each run
    at most ``buffer_bytes`` (a tensor larger than that is a bucket of its own).

    >>> f32, i64 = torch.float32, torch.int64
    >>> s = [TensorSpec("a", (4,), f32), TensorSpec("b", (4,), f32), TensorSpec("c", (2,), i64),
    ...      TensorSpec("d", (100,), f32), TensorSpec("e", (1,), f32)]
    >>> buckets(s, 32)
    [[0, 1], [2], [3], [4]]
    """
    out: list[list[int]] = []
    size = 0
    for i, s in enumerate(specs):
        if out and specs[out[-1][-1]].dtype == s.dtype and size + s.nbytes <= buffer_bytes:
            out[-1].append(i)
            size += s.nbytes
        else:
            out.append([i])
            size = s.nbytes
    return out


class WeightBroadcast:
    """One member of the broadcast group: rank 0 sends (``send``), engines receive (``receive``).
    Constructing it is the rendezvous: every member must construct at the same time."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, device: torch.device,
                 timeout: timedelta = timedelta(minutes=10)):
        from rlvr.core.device import process_group_backend

        self.device = torch.device(device)
        store = dist.PrefixStore(STORE_PREFIX, dist.TCPStore(host, port, world_size, is_master=rank == 0,
                                                             timeout=timeout))
        if process_group_backend(self.device) == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(store, rank, world_size, options)
        else:
            self.group = dist.ProcessGroupGloo(store, rank, world_size, timeout)

    def send(self, named: Mapping[str, torch.Tensor], specs: list[TensorSpec], buffer_bytes: int) -> int:
        """Rank 0: broadcast ``named`` (whole tensors, the ``specs``' names) bucket by bucket;
        returns the bytes sent."""
        sent = 0
        for bucket in buckets(specs, buffer_bytes):
            parts = [named[specs[i].name].detach().reshape(-1) for i in bucket]
            flat = torch.cat(parts).to(self.device) if len(parts) > 1 else parts[0].to(self.device).contiguous()
            self.group.broadcast(flat, 0).wait()
            sent += flat.numel() * flat.element_size()
        return sent

    def receive(self, specs: list[TensorSpec], buffer_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
        """An engine: ``(name, tensor)`` pairs as the buckets arrive (views of the bucket's buffer:
        copy them before the next one is drawn)."""
        for bucket in buckets(specs, buffer_bytes):
            flat = torch.empty(sum(specs[i].numel for i in bucket), dtype=specs[bucket[0]].dtype, device=self.device)
            self.group.broadcast(flat, 0).wait()
            offset = 0
            for i in bucket:
                s = specs[i]
                yield s.name, flat[offset: offset + s.numel].view(s.shape)
                offset += s.numel
