"""Mixture-of-experts routers: find them, record the experts they choose, replay recorded choices.

R3 (rollout routing replay): the engine records, for every token position and every MoE
layer, the identities of the top-k experts its router chose; the trainer's forward then uses
exactly those experts instead of its own top-k, so a routing flip between engine and trainer
(different precision, different kernels) cannot change which experts compute a token. Only the
*identities* are replayed: the gate weights of the replayed experts are recomputed from the
trainer's own router logits with the model's own gate rule (softmax over all experts, the chosen
ones picked, renormalised when the family does), so gradients flow through the router and the
selected experts as in an ordinary forward.

A family's gate rule is registered in ``GATE_RULES`` under its router class name (transformers'
``*TopKRouter`` modules, which return ``(logits, scores, indices)``); a MoE model whose router is
not registered is refused by name rather than replayed with a wrong rule. Recording and replay are
forward hooks on the router modules of one model instance (the engine's copy records, the
trainer's replays), so neither touches the other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from rlvr.core.registry import Registry

# (router module, router logits [N, E], expert indices [N, k]) -> gate weights [N, k] in the logits' dtype
GateRule = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
GATE_RULES: Registry[GateRule] = Registry("MoE router", flag="--use-rollout-routing-replay")

# Config fields that say a model has routed experts (a dense model has none of them, or 0).
_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _softmax_topk(logits: torch.Tensor, indices: torch.Tensor, normalise: bool, cast: bool) -> torch.Tensor:
    probs = torch.softmax(logits.float(), dim=-1)
    picked = probs.gather(-1, indices)
    if normalise:
        picked = picked / picked.sum(dim=-1, keepdim=True)
    return picked.to(logits.dtype) if cast else picked


# softmax over all experts in float32, top-k, renormalised over the k when config.norm_topk_prob and
# cast back to the logits' dtype (Qwen2/3-MoE, OLMoE); Mixtral always renormalises and keeps float32
for _name in ("Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "OlmoeTopKRouter"):
    GATE_RULES.register(_name)(lambda r, lg, idx: _softmax_topk(lg, idx, r.norm_topk_prob, cast=True))
GATE_RULES.register("MixtralTopKRouter")(lambda r, lg, idx: _softmax_topk(lg, idx, True, cast=False))


def has_routed_experts(checkpoint: str | Path) -> bool:
    """Whether a HF checkpoint directory's ``config.json`` declares routed experts."""
    config = json.loads((Path(checkpoint) / "config.json").read_text())
    config = config.get("text_config", config)
    return any(int(config.get(f) or 0) > 0 for f in _EXPERT_FIELDS)


def moe_routers(model: torch.nn.Module, flag: str = "--use-rollout-routing-replay") -> list[torch.nn.Module]:
    """The model's router modules in layer order. Raises ValueError naming ``flag`` for a dense
    model (nothing to replay) and for a MoE model whose router class has no registered gate rule."""
    routers = [m for m in model.modules() if type(m).__name__ in GATE_RULES]
    if routers:
        return routers
    config = getattr(model, "config", None)
    experts = max((int(getattr(config, f, 0) or 0) for f in _EXPERT_FIELDS), default=0)
    if experts == 0:
        raise ValueError(f"{flag}: {type(model).__name__} is a dense model (no routed experts): routing replay "
                         "has nothing to replay; drop the flag")
    seen = sorted({type(m).__name__ for m in model.modules() if type(m).__name__.endswith("Router")})
    raise ValueError(f"{flag}: {type(model).__name__}'s router ({', '.join(seen) or 'unknown'}) has no registered "
                     f"gate rule (known: {', '.join(GATE_RULES.names())}); register it in rlvr.models.moe.GATE_RULES")


def routing_shape(model: torch.nn.Module) -> tuple[int, int]:
    """(MoE layers, experts per token) of a MoE model."""
    routers = moe_routers(model)
    return len(routers), int(routers[0].top_k)


def index_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer type that holds expert ids (what samples store)."""
    return torch.uint8 if num_experts <= 255 else torch.int16


class RoutingRecorder:
    """Forward hooks that keep the expert indices each router chose in the last forward.

    ``take(n_positions)`` -> ``[n_positions, layers, k]`` (the flattened ``[batch * seq]`` positions
    of the last forward, in the router's order) and forgets them. One thread per model instance."""

    def __init__(self, model: torch.nn.Module):
        self.routers = moe_routers(model, "--enable-return-routed-experts")
        self.dtype = index_dtype(int(self.routers[0].num_experts))
        self._last: list[torch.Tensor | None] = [None] * len(self.routers)
        self.handles = [r.register_forward_hook(self._hook(j)) for j, r in enumerate(self.routers)]

    def _hook(self, j: int):
        def hook(module, args, output):
            if module is self.routers[j]:  # not a deep copy of the model (it copies the hooks too)
                self._last[j] = output[2].detach()
        return hook

    def take(self) -> torch.Tensor:
        if any(x is None for x in self._last):
            raise RuntimeError("RoutingRecorder.take: no forward recorded since the last take")
        out = torch.stack(self._last, dim=1).to("cpu", self.dtype)  # type: ignore[arg-type]
        self._last = [None] * len(self.routers)
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class RoutingReplay:
    """Forward hooks that make the routers use recorded experts (R3).

    ``plan`` ([positions, layers, k] long, set before a forward; -1 where the model keeps its own
    choice, e.g. padding) replaces each router's top-k indices; the gate weights are recomputed from
    the router's own logits with its family's rule (``GATE_RULES``). The plan stays until the next
    one is set, so a recomputation in backward (activation checkpointing) replays the same experts.
    ``replay=False`` only measures. Counters: ``(token, layer)`` pairs replayed, and how many of
    them the model's own top-k would have routed differently (as sets)."""

    def __init__(self, model: torch.nn.Module, replay: bool = True):
        self.routers = moe_routers(model)
        self.rules = [GATE_RULES[type(r).__name__] for r in self.routers]
        self.replay = replay
        self.plan: torch.Tensor | None = None
        self.pairs = 0
        self.differing = 0
        self.handles = [r.register_forward_hook(self._hook(j)) for j, r in enumerate(self.routers)]

    def _hook(self, j: int):
        def hook(module, args, output):
            if self.plan is None or module is not self.routers[j]:  # unset, or a deep copy of the model
                return None
            logits, _, own = output
            want = self.plan[:, j, :].to(own.device, torch.long)
            if want.shape != own.shape:
                raise ValueError(f"routing replay: plan has {tuple(want.shape)} experts for layer {j}, "
                                 f"the router chose {tuple(own.shape)}")
            recorded = (want >= 0).all(-1)
            differ = (want.sort(-1).values != own.sort(-1).values).any(-1) & recorded
            self.pairs += int(recorded.sum())
            self.differing += int(differ.sum())
            if not self.replay:
                return None
            idx = torch.where(recorded.unsqueeze(-1), want, own)
            return logits, self.rules[j](module, logits, idx), idx
        return hook

    def counts(self, reset: bool = True) -> tuple[int, int]:
        """(pairs replayed, pairs whose own choice differed) since the last reset."""
        out = (self.pairs, self.differing)
        if reset:
            self.pairs = self.differing = 0
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
