"""Learning-rate schedules over optimizer steps (Megatron's names, as slime's flags use them)."""

from __future__ import annotations

import math


def lr_at(step: int, total_steps: int, lr: float, min_lr: float, style: str, warmup: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based) of ``total_steps``.

    Linear warm-up from 0 over ``warmup`` steps, then ``constant``, ``linear`` or ``cosine`` decay
    from ``lr`` to ``min_lr`` at the last step.

    >>> [round(lr_at(s, 5, 1.0, 0.0, "linear", 0), 3) for s in range(5)]
    [1.0, 0.75, 0.5, 0.25, 0.0]
    >>> [round(lr_at(s, 4, 1.0, 0.0, "cosine", 2), 3) for s in range(4)]
    [0.5, 1.0, 1.0, 0.0]
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    if style == "constant":
        return lr
    span = max(total_steps - 1 - warmup, 1)
    progress = min(max((step - warmup) / span, 0.0), 1.0)
    if style == "linear":
        return min_lr + (lr - min_lr) * (1.0 - progress)
    if style == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown --lr-decay-style {style!r}; valid: constant, linear, cosine")
