"""The policy's optimizer: AdamW, the float32 master weights under ``--bf16``, the LR schedule and
gradient clipping.

The master weights are the trainable parameters themselves in float32, or float32 copies of them
under ``--bf16`` (the model runs in bfloat16; ``step.optimizer_step`` copies the gradients onto
the masters before the step and the weights back after it). The learning rate of step ``s`` is
``schedule.lr_at`` over the run's ``total_steps`` optimizer steps.
"""

from __future__ import annotations

from functools import partial

import torch

from rlvr.train.schedule import lr_at
from rlvr.train.step import Learner, adamw, optimizer_step


def adamw_of(train, lr: float):
    """``params -> AdamW`` with ``train``'s betas and weight decay at ``lr`` (the policy's, the critic's)."""
    return partial(adamw, lr=lr, betas=(train.adam_beta1, train.adam_beta2), weight_decay=train.weight_decay)


class Optimizer:
    """AdamW over the policy's trainable parameters (``params``), stepping their ``master`` weights,
    at the scheduled learning rate, with ``--clip-grad``. ``adamw`` is the torch optimizer."""

    def __init__(self, model: torch.nn.Module, module: torch.nn.Module, parallel, train, total_steps: int):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = self.params if not train.bf16 else [
            p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.adamw = adamw_of(train, train.lr)(self.master)
        self.learner = Learner(model, self.adamw, self.params, self.master, parallel, module)
        self.total_steps = total_steps  # optimizer steps in the run, for the LR schedule
        self.lr, self.min_lr, self.decay, self.warmup = train.lr, train.min_lr, train.lr_decay_style, train.lr_warmup_iters
        self.clip_grad = train.clip_grad

    def lr_scale(self, step: int) -> float:
        """Step ``step``'s learning rate as a fraction of ``--lr`` (the critic's follows it too)."""
        return lr_at(step, self.total_steps, self.lr, self.min_lr, self.decay, self.warmup) / self.lr

    def step(self, totals: dict[str, float], step: int) -> str | None:
        """Optimizer step ``step`` on the accumulated gradients; why it was skipped, or None
        (``step.optimizer_step``)."""
        return optimizer_step(self.learner, totals, self.lr_scale(step), self.clip_grad)

    def masters(self) -> list[torch.Tensor] | None:
        """--bf16's float32 masters, for a checkpoint (None when they are the parameters)."""
        return None if self.master is self.params else [m.detach() for m in self.master]

    def load_masters(self, saved: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for m, saved_m in zip(self.master, saved, strict=True):
                m.copy_(saved_m)
