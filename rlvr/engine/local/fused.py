"""Fused projections for the embedded engine's own copy of a Llama/Qwen/Mistral/Gemma-style model.

Each decoder layer of these models runs q, k and v on the same hidden states, and gate and up on
the same MLP input: five GEMMs where two wider ones do the same arithmetic (vLLM's ``qkv_proj`` and
``gate_up_proj``). ``fuse_projections`` stacks each such group's weights (and biases) into one
contiguous tensor and swaps the group's ``nn.Linear`` modules for ``FusedSlice`` modules whose
``weight``/``bias`` are views into it: the module tree, its parameter names and the model's own
``forward`` are unchanged, a weight update that ``copy_``-s into ``...q_proj.weight`` writes the
fused tensor, and the first member called on an input runs the group's one GEMM; the others take
their columns of that output (keyed by the input tensor's identity, so a member called on another
input still gets its own correct output).

Exactness: the same dot products, blocked differently by the GEMM kernel, so the last bits of a
logit can differ from the unfused model (float tolerance, as between batch sizes); one model's
results are deterministic either way.

Off by default (``EmbeddedEngine(fuse_projections=True)`` turns it on): on this project's CPU (AVX2,
one thread) the wider GEMMs run at the same rate as the separate ones, and the strided slices the
fused output hands on make the rest of the layer slower (SmolLM2-135M decode 0.96x; docs/benchmarks.md).

Only for a module the engine owns: the trainer's module (``share_weights``) or one whose tensors
are partly the trainer's (a LoRA policy's frozen base) is left as it is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The model types whose attention calls q/k/v, and whose MLP calls gate/up, on one tensor each
# (checked in transformers' modeling files: ``self.q_proj(hidden_states)`` ... and
# ``self.act_fn(self.gate_proj(x)) * self.up_proj(x)``).
FUSABLE_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text"})
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class FusedGroup:
    """One weight [sum of the members' out features, in features] (and bias) for projections that
    read the same input, and the output of the last input until every member has taken its slice."""

    def __init__(self, linears: list[nn.Linear]):
        self.weight = torch.cat([m.weight.detach() for m in linears])
        self.bias = torch.cat([m.bias.detach() for m in linears]) if linears[0].bias is not None else None
        edges = [0]
        for m in linears:
            edges.append(edges[-1] + m.out_features)
        self.bounds = list(zip(edges[:-1], edges[1:]))
        self.members: list[FusedSlice] = []
        self._x: torch.Tensor | None = None
        self._out: torch.Tensor | None = None
        self._left = 0

    def take(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Member ``i``'s output for ``x``: its columns of the group's GEMM, run once per input."""
        if self._x is not x or self._left == 0:
            self._out, self._x, self._left = F.linear(x, self.weight, self.bias), x, len(self.bounds)
        self._left -= 1
        lo, hi = self.bounds[i]
        out = self._out[..., lo:hi]
        if self._left == 0:  # every member served: hold no activations between forwards
            self._x = self._out = None
        return out

    def rebind(self) -> None:
        """Point every member's weight (and bias) at fresh views into newly allocated fused tensors
        (after the engine woke from sleep; the next weight update fills them)."""
        self.weight = self.weight.new_empty(self.bounds[-1][1], self.members[0].in_features)
        self.bias = self.bias.new_empty(self.bounds[-1][1]) if self.bias is not None else None
        for m, (lo, hi) in zip(self.members, self.bounds, strict=True):
            m.weight.data = self.weight[lo:hi]
            if self.bias is not None:
                m.bias.data = self.bias[lo:hi]

    def release(self) -> None:
        """Free the fused tensors (the engine sleeps; its members' weights were freed already)."""
        self.weight, self.bias = self.weight.new_empty(0), None if self.bias is None else self.bias.new_empty(0)
        self._x = self._out = None


class FusedSlice(nn.Module):
    """Stands in for one ``nn.Linear`` of a fused group: same parameter names and shapes, weights
    that are views into the group's tensor, output that is its columns of the group's GEMM."""

    def __init__(self, group: FusedGroup, index: int, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features, self.index = linear.in_features, linear.out_features, index
        lo, hi = group.bounds[index]
        self.weight = nn.Parameter(group.weight[lo:hi], requires_grad=False)
        self.bias = nn.Parameter(group.bias[lo:hi], requires_grad=False) if group.bias is not None else None
        self.group = group  # not a Module: no parameters of its own, so state_dict names stay the model's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.take(x, self.index)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fused member {self.index}"


def fuse_projections(model: nn.Module) -> list[FusedGroup]:
    """Fuse q/k/v and gate/up in every module of ``model`` that has them as plain ``nn.Linear`` on
    one input width with biases all present or all absent; return the groups (none for a model type
    outside ``FUSABLE_MODEL_TYPES``). The module must be the engine's own and frozen."""
    config = getattr(model, "config", None)
    model_type = getattr(getattr(config, "text_config", None), "model_type", None) or getattr(config, "model_type", None)
    if model_type not in FUSABLE_MODEL_TYPES:
        return []
    groups = []
    for module in list(model.modules()):
        for names in GROUPS:
            linears = [getattr(module, n, None) for n in names]
            if not all(type(m) is nn.Linear for m in linears):
                continue
            if len({m.in_features for m in linears}) != 1 or len({m.bias is None for m in linears}) != 1:
                continue
            group = FusedGroup(linears)
            for i, (name, linear) in enumerate(zip(names, linears, strict=True)):
                member = FusedSlice(group, i, linear)
                group.members.append(member)
                setattr(module, name, member)
            groups.append(group)
    return groups
