"""The bad-step guard: a non-finite loss or gradient norm never reaches the weights.

Before each optimizer step the trainer asks ``bad_step_reason(loss, grad_norm)``; on a reason it
skips the step (gradients dropped, weights and optimizer state untouched) and the guard records
it. A run of ``max_consecutive`` skipped steps in a row means training cannot recover by itself;
``raise_if_exhausted`` then stops the run naming the rollout where the streak began (Megatron
skips a step on a NaN/inf gradient the same way; the stop with a pointer is rlvr's addition).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Callable

from rlvr.core.errors import TrainingStopped

log = logging.getLogger(__name__)


def bad_step_reason(loss: float, grad_norm: float) -> str | None:
    """Why this step must be skipped, or None when loss and gradient norm are finite.

    >>> bad_step_reason(0.5, 1.0) is None
    True
    >>> bad_step_reason(float("nan"), float("nan"))
    'non-finite loss (nan)'
    >>> bad_step_reason(0.5, float("inf"))
    'non-finite gradient norm (inf)'
    """
    if not math.isfinite(loss):
        return f"non-finite loss ({loss})"
    if not math.isfinite(grad_norm):
        return f"non-finite gradient norm ({grad_norm})"
    return None


@dataclass
class BadStepGuard:
    max_consecutive: int
    streak: list[tuple[int, int, str]] = field(default_factory=list)  # (rollout_id, step, reason)

    def record(self, rollout_id: int, step: int, reason: str | None) -> None:
        """Note one optimizer step's outcome (``reason`` None = it was taken)."""
        if reason is None:
            self.streak.clear()
            return
        self.streak.append((rollout_id, step, reason))
        log.warning("rollout %d, train step %d: optimizer step skipped, %s; weights unchanged "
                    "(%d in a row, the run stops at %d)", rollout_id, step, reason, len(self.streak),
                    self.max_consecutive)

    def raise_if_exhausted(self, where: Callable[[int], str] | None = None) -> None:
        """Raise ``TrainingStopped`` after ``max_consecutive`` skipped steps in a row; ``where(rollout_id)``
        may say where that rollout's samples were saved."""
        stop_if_exhausted(self.streak, self.max_consecutive, where)


def stop_if_exhausted(streak: list, max_consecutive: int, where: Callable[[int], str] | None = None) -> None:
    """``TrainingStopped`` when ``streak`` (``BadStepGuard.streak``: ``(rollout_id, step, reason)``
    of each skipped step in a row, as a trainer reports it) holds ``max_consecutive`` or more; the
    one decision for a local trainer and for the Ray trainer, whose rank 0 reports its streak.

    >>> stop_if_exhausted([(3, 7, "non-finite loss (nan)")], 2)
    >>> stop_if_exhausted([(3, 7, "non-finite loss (nan)"), (4, 8, "non-finite loss (nan)")], 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rlvr.core.errors.TrainingStopped: 2 optimizer steps in a row were skipped ...began at rollout 3 (train step 7: ...
    """
    if len(streak) < max_consecutive:
        return
    first_rollout, first_step, reason = streak[0]
    hint = f"; its samples: {where(first_rollout)}" if where is not None else ""
    raise TrainingStopped(
        f"{len(streak)} optimizer steps in a row were skipped (--max-consecutive-skipped-steps "
        f"{max_consecutive}); the streak began at rollout {first_rollout} (train step {first_step}: "
        f"{reason}){hint}. Inspect that rollout's rewards and responses, or lower --lr"
    )
