"""One optimizer step over the micro-batches of a global batch, the same for the policy and the critic.

``accumulate`` runs forward/backward on every micro-batch and sums the losses and metrics; the
caller's ``loss_fn`` has already divided each micro-batch's loss by the *global* batch's
denominator (``aggregate_loss``), so the summed gradient is the one-batch gradient (DESIGN "Batch
sizes"). ``optimizer_step`` then measures the gradient norm, sets the scheduled learning rate,
skips the step when the loss or the norm is not finite (weights and optimizer state untouched;
``guard.py`` decides when to stop), clips and steps.

What differs between the two models is data, not branches: a ``Learner`` names the module, its
optimizer, the tensors the optimizer updates (float32 masters under ``--bf16``) and the
data-parallel strategy its gradients go through (``parallel.py``; the critic's is ``SingleProcess``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch

from rlvr.algo import aggregate_loss
from rlvr.train.guard import bad_step_reason
from rlvr.train.parallel import Parallel


def adamw(params, lr: float, betas: tuple[float, float], weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over ``params``; each group's ``initial_lr`` is what the LR schedule scales."""
    params = list(params)
    # The fused kernel (one pass over all tensors) where it is available: CPU and CUDA.
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype == torch.float32 for p in params)
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)
    for group in opt.param_groups:
        group["initial_lr"] = lr
    return opt


@dataclass
class Learner:
    """A module trained by its own optimizer.

    ``params`` are the module's trainable parameters, ``master`` what the optimizer updates: the
    same list, or float32 copies of ``params`` under ``--bf16`` (gradients are copied onto them
    before the step, the weights back after it). ``wrapped`` is the module the forward goes
    through under ``parallel`` (DDP's ``no_sync`` needs it).
    """

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    params: list[torch.Tensor]
    master: list[torch.Tensor]
    parallel: Parallel
    wrapped: torch.nn.Module


LossFn = Callable[[list[int]], "tuple[torch.Tensor, dict[str, torch.Tensor]]"]


def accumulate(learner: Learner, mbs: list[list[int]], loss_fn: LossFn, mask: torch.Tensor, per_token: bool,
               denominator: float) -> dict[str, float]:
    """Gradients of the global batch made of micro-batches ``mbs`` (sample indices), accumulated.

    ``loss_fn(mb) -> (scalar loss, per-token metrics [b, T])``: the loss already aggregated with the
    global ``denominator``; the metrics are aggregated here the same way (``mask`` [B, T]).
    Returns ``loss`` and every metric summed over the micro-batches (and over the ranks). With no
    micro-batch at all every gradient is set to zero, so the optimizer steps as it would on a zero
    gradient (every rank gets none together: the trainer keeps ranks' micro-batch counts equal).
    """
    learner.optimizer.zero_grad(set_to_none=True)
    learner.module.zero_grad(set_to_none=True)
    totals: dict[str, float] = defaultdict(float)
    for k, mb in enumerate(mbs):
        with learner.parallel.no_sync(learner.wrapped, last=k == len(mbs) - 1):
            loss, tok_metrics = loss_fn(mb)
            if not loss.requires_grad:  # no response token in the micro-batch: a zero gradient, so
                loss = loss + sum(p.sum() for p in learner.params) * 0.0  # every rank still runs backward
            # Data-parallel: DDP/FSDP2 average the ranks' gradients; the loss is already global.
            (loss * learner.parallel.loss_scale).backward()
        totals["loss"] += float(loss.detach())
        for name, v in tok_metrics.items():
            totals[name] += float(aggregate_loss(v.detach(), mask[mb], per_token, denominator))
    if not mbs:  # nothing to run (every sample silent): the step a zero gradient would have made,
        totals["loss"] = 0.0  # since AdamW skips a parameter without a gradient (no moment decay, no weight decay)
        for p in learner.params:
            p.grad = torch.zeros_like(p)
    # Data-parallel: every rank holds its share of the global batch's sums.
    return dict(learner.parallel.sum_metrics(dict(totals)))


def optimizer_step(learner: Learner, totals: dict[str, float], lr_scale: float, clip_grad: float) -> str | None:
    """Step ``learner``'s optimizer on the accumulated gradients at ``initial_lr * lr_scale``.

    Adds ``grad_norm`` and ``lr`` to ``totals``. Returns why the step was skipped (non-finite loss
    or gradient norm; gradients are dropped, weights and optimizer state stay), else None.
    """
    if learner.master is not learner.params:  # --bf16: float32 grads on the masters
        for m, p in zip(learner.master, learner.params):
            m.grad = p.grad.float() if p.grad is not None else None
    grads = [p.grad for p in learner.master if p.grad is not None]
    grad_norm = torch.nn.utils.get_total_norm(grads)  # FSDP2: a replicated DTensor (clipping takes it)
    totals["grad_norm"] = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    for group in learner.optimizer.param_groups:
        group["lr"] = group["initial_lr"] * lr_scale
    totals["lr"] = learner.optimizer.param_groups[0]["lr"]
    reason = bad_step_reason(totals["loss"], totals["grad_norm"])
    if reason is not None:
        learner.optimizer.zero_grad(set_to_none=True)
        learner.module.zero_grad(set_to_none=True)
        return reason
    if clip_grad > 0:
        torch.nn.utils.clip_grads_with_norm_(learner.master, clip_grad, grad_norm)
    learner.optimizer.step()
    if learner.master is not learner.params:
        with torch.no_grad():
            for m, p in zip(learner.master, learner.params):
                p.copy_(m)
    return None
