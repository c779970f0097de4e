"""R3 in the trainer (``--use-rollout-routing-replay``): every forward over rollout samples uses the
experts the engine's routers chose (``Sample.rollout_routed_experts``) instead of its own top-k.

The hooks are ``rlvr.models.moe.RoutingReplay``'s; this module installs them on the policy and on
the reference model (both compute log-probs of the engine's tokens, so both replay) and builds a
forward's plan from the micro-batch layout (``TokenBatch.origin``: which sample and position each
input position is). The PPO critic is a separate value model and routes on its own.

Prompt tokens are replayed too (as slime does when the engine returns them, which SGLang and the
embedded engine do): the engine records the prefill's routing, and a prompt shared by a GRPO group
in a packed micro-batch takes its first sample's (the engine prefills a group's prompt once, so the
samples of a group agree). A sample must carry routing for every position the trainer feeds
(``len(prompt) + len(response) - 1``); one that does not is refused by name. The one position no
engine ran -- a response's last token, fed only in the padded reference layout, where nothing
scored depends on it -- keeps the trainer's own routing.

Metrics: ``train/routing_replay_differ_frac``, the fraction of (token, MoE layer) pairs whose own
top-k set differs from the engine's (what R3 removes; with R3 the experts used are the engine's).
"""

from __future__ import annotations

import logging

import torch

from rlvr.models.moe import RoutingReplay
from rlvr.core.types import Sample

log = logging.getLogger(__name__)

ATTRIBUTE = "rlvr_routing_replay"  # where a model keeps its RoutingReplay


def install(*models: torch.nn.Module | None) -> list[RoutingReplay]:
    """Replay hooks on each given model (None skipped); raises ValueError for a dense model."""
    out = []
    for m in models:
        if m is not None:
            replay = RoutingReplay(m)
            setattr(m, ATTRIBUTE, replay)
            out.append(replay)
    return out


def replay_plan(batch, samples: list[Sample], layers: int, top_k: int) -> torch.Tensor:
    """``[slots, layers, top_k]`` long: the engine's experts at every input position of ``batch``
    (its ``origin``), -1 where the trainer keeps its own choice."""
    plan = torch.full((batch.origin.shape[0], layers, top_k), -1, dtype=torch.long)
    for i, s in enumerate(samples):
        routes = s.rollout_routed_experts
        need = s.total_length - 1
        if routes is None or routes.shape[0] < need or tuple(routes.shape[1:]) != (layers, top_k):
            got = None if routes is None else tuple(routes.shape)
            raise ValueError(f"--use-rollout-routing-replay: sample {s.uid or s.index} carries routed experts {got}, "
                             f"needs [{need}, {layers}, {top_k}] (prompt + response - 1 positions); the engine must "
                             "record them (embedded engine, or rlvr serve / SGLang with --enable-return-routed-experts)")
        at = (batch.origin[:, 0] == i) & (batch.origin[:, 1] < need)
        plan[at] = routes[batch.origin[at, 1]].long()
    return plan


def set_replay_plan(model: torch.nn.Module, batch, samples: list[Sample]) -> None:
    """Before a forward of ``model`` over ``batch``: point its replay hooks at the samples' routing
    (nothing when the model has none installed)."""
    replay: RoutingReplay | None = getattr(model, ATTRIBUTE, None)
    if replay is not None:
        replay.plan = replay_plan(batch, samples, len(replay.routers), int(replay.routers[0].top_k))


def storage_bytes(samples: list[Sample]) -> int:
    """Bytes the rollout's recorded routing takes (tokens x MoE layers x top-k x item size)."""
    return sum(s.rollout_routed_experts.numel() * s.rollout_routed_experts.element_size()
               for s in samples if s.rollout_routed_experts is not None)


def rollout_metrics(replay: RoutingReplay, samples: list[Sample]) -> dict[str, float]:
    """``train/routing_replay_differ_frac`` since the last call, and the routing's storage size."""
    pairs, differing = replay.counts()
    size = storage_bytes(samples)
    log.info("R3: the rollout's routed experts take %.1f KiB (positions x MoE layers x top-k = %d ids)",
             size / 1024, sum(s.rollout_routed_experts.numel() for s in samples if s.rollout_routed_experts is not None))
    return {"train/routing_replay_differ_frac": differing / max(pairs, 1),
            "train/routing_replay_bytes": float(size)}
