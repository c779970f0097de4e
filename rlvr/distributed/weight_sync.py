"""Weights from training rank 0 to every engine, through Ray's object store (one node: shared memory).

Rank 0 returns the whole policy (gathered from FSDP2's shards when sharded) from an actor method:
Ray stores it once in the object store and the driver receives only an ``ObjectRef`` — the
weights never pass through the driver. The rollout manager hands the ref to each engine actor,
which reads the tensors from the store and copies them into its model (``update_weights``, with
the new version). The loop times the whole hand-over as ``perf/update_weights_time``.

``--check-weight-update-equal``: rank 0 also returns ``checksum`` of what it sent, and every engine
returns the checksum of what it then holds; a mismatch stops the run.

Across nodes the object store moves the bytes over the network; ``--weight-sync broadcast``
(``rlvr.distributed.broadcast``) streams them instead through a process group of rank 0 and the
engines (NCCL between GPUs), the default for disaggregated GPU engines.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch


def checksum(named_tensors: Mapping[str, torch.Tensor]) -> str:
    """blake2b of the names, dtypes, shapes and bytes, in name order: equal iff bit-identical.

    >>> a = {"w": torch.ones(2), "b": torch.zeros(1)}
    >>> checksum(a) == checksum({"b": torch.zeros(1), "w": torch.ones(2)})
    True
    >>> checksum(a) == checksum({"w": torch.tensor([1.0, 1.0 + 1e-7]), "b": torch.zeros(1)})
    False
    """
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(named_tensors):
        t = named_tensors[name].detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def to_store(named_tensors: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Tensors as numpy arrays where the dtype allows (not bfloat16): Ray stores numpy buffers
    out of band and readers map them from shared memory without a copy, where a pickled tensor
    is copied once more on every read."""
    return {k: v.detach().cpu().numpy() if v.dtype != torch.bfloat16 else v.detach().cpu()
            for k, v in named_tensors.items()}


def from_store(named: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """``to_store``'s inverse: read-only tensors over the store's memory (copy them before writing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "not writable": only read, by copy_ into the model
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in named.items()}


@dataclass(frozen=True)
class WeightsRef:
    """What ``RayTrainer.weights()`` returns: the object-store ref of rank 0's weights and, with
    ``--check-weight-update-equal``, the ref of their checksum."""

    weights: Any  # ray.ObjectRef[dict[str, Tensor]]
    checksum: Any = None  # ray.ObjectRef[str] | None
    others: list = field(default_factory=list)  # the other ranks' calls (FSDP2 gathers need them all)
    broadcast: bool = False  # --weight-sync broadcast: ``weights`` is None, rank 0 is streaming them


class WeightMismatch(RuntimeError):
    """An engine holds weights other than the ones the trainer sent."""
