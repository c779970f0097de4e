"""The one test seam: what tests may reach into a run to do, named as such.

Production code calls these at fixed points; outside tests they do nothing.

* ``crash_point(name)``: crash tests SIGKILL the process at a named point (``rollout:3``,
  ``save:2``) by setting ``RLVR_TEST_SIGKILL_AT`` in the run's environment, to prove that a
  resumed run logs the same values as one never stopped.
* ``trainer_seam()``: the trainer's test-only switches (``TrainerSeam``), production defaults
  unless a test changes them for a block with ``override_trainer(...)``: a hook on every
  micro-batch loss of the policy (guard tests poison a rollout with NaN), turning off the
  on-policy reuse of the training forward as p0 (tests compare it with a separate forward), and
  turning off the skip of samples without signal (tests and benchmarks compare it with the full path;
  ``RLVR_TEST_RUN_SILENT_SAMPLES=1`` in a run's environment does the same for a subprocess, for
  end-to-end tests of the tiny models, whose rollouts often have no reward variance at all, that
  check what the training forward computes).
  Process-local: a Ray training rank never sees a driver's override.
* ``fault_point(name)``: fault-tolerance tests make code that must survive its own errors raise
  at a named point (``engine-monitor``: each health check of the engine supervisor's monitor) by
  setting ``RLVR_TEST_RAISE_AT=name:K``: every K-th time the point is reached it raises
  ``InjectedFault`` (K = 2: every other time).
* ``logical_gpus()``: GPU placement tests on a CPU-only machine set ``RLVR_TEST_LOGICAL_GPUS=N``
  (and start Ray with ``num_gpus=N``): the GPU count checks see N GPUs, Ray hands out GPU bundles
  and ids, and every actor still computes on CPU (``rlvr.core.device.for_actor``) with gloo.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from torch import Tensor

log = logging.getLogger(__name__)

SIGKILL_AT_ENV = "RLVR_TEST_SIGKILL_AT"
RAISE_AT_ENV = "RLVR_TEST_RAISE_AT"
LOGICAL_GPUS_ENV = "RLVR_TEST_LOGICAL_GPUS"
RUN_SILENT_ENV = "RLVR_TEST_RUN_SILENT_SAMPLES"

_reached: dict[str, int] = {}  # fault point -> times reached in this process


class InjectedFault(RuntimeError):
    """Raised by ``fault_point`` on a test's request."""


def crash_point(point: str) -> None:
    """SIGKILL this process when ``RLVR_TEST_SIGKILL_AT`` equals ``point`` (crash tests)."""
    if os.environ.get(SIGKILL_AT_ENV) == point:
        log.warning("%s=%s: killing this process", SIGKILL_AT_ENV, point)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclasses.dataclass(frozen=True)
class TrainerSeam:
    """The trainer's test-only switches; the defaults are what production runs."""

    # (rollout id, a micro-batch's scalar policy loss) -> the loss to backpropagate.
    loss_hook: Callable[[int, Tensor], Tensor] | None = None
    # False: p0 always comes from a separate forward, never from the on-policy training forward.
    p0_from_train_forward: bool = True
    # False: samples without signal (``rlvr.algo.silent_samples``) run forward/backward like the rest.
    skip_silent_samples: bool = True


_trainer_seam = TrainerSeam()


def trainer_seam() -> TrainerSeam:
    """The switches the trainer reads now (``TrainerSeam()`` outside ``override_trainer``)."""
    return _trainer_seam


@contextlib.contextmanager
def override_trainer(**changes) -> Iterator[TrainerSeam]:
    """Within the block, the trainer reads ``TrainerSeam`` with ``changes`` (tests only).

    >>> with override_trainer(p0_from_train_forward=False):
    ...     trainer_seam().p0_from_train_forward
    False
    >>> trainer_seam().p0_from_train_forward
    True
    """
    global _trainer_seam
    before = _trainer_seam
    _trainer_seam = dataclasses.replace(before, **changes)
    try:
        yield _trainer_seam
    finally:
        _trainer_seam = before


def skip_silent_samples() -> bool:
    """Whether the trainer leaves samples without signal out of its forward/backward (the default)."""
    return _trainer_seam.skip_silent_samples and os.environ.get(RUN_SILENT_ENV) != "1"


def hook_loss(rollout_id: int, loss: Tensor) -> Tensor:
    """A policy micro-batch loss through the test hook (unchanged when none is set)."""
    hook = _trainer_seam.loss_hook
    return loss if hook is None else hook(rollout_id, loss)


def fault_point(point: str) -> None:
    """Raise ``InjectedFault`` every K-th time ``point`` is reached when ``RLVR_TEST_RAISE_AT`` is ``point:K``.

    >>> os.environ[RAISE_AT_ENV] = "doctest-point:2"
    >>> fault_point("doctest-point"); fault_point("other-point")
    >>> fault_point("doctest-point")
    Traceback (most recent call last):
    ...
    rlvr.core.testing.InjectedFault: RLVR_TEST_RAISE_AT=doctest-point:2: injected at doctest-point (time 2)
    >>> del os.environ[RAISE_AT_ENV]
    """
    spec = os.environ.get(RAISE_AT_ENV)
    if not spec:
        return
    name, _, every = spec.rpartition(":")
    if name != point:
        return
    _reached[point] = n = _reached.get(point, 0) + 1
    if n % int(every) == 0:
        raise InjectedFault(f"{RAISE_AT_ENV}={spec}: injected at {point} (time {n})")


def logical_gpus() -> int | None:
    """The GPU count a placement test pretends this machine has (``RLVR_TEST_LOGICAL_GPUS``), or
    None outside such tests. Compute stays on CPU whenever it is set.

    >>> os.environ[LOGICAL_GPUS_ENV] = "4"; logical_gpus()
    4
    >>> del os.environ[LOGICAL_GPUS_ENV]; logical_gpus() is None
    True
    """
    value = os.environ.get(LOGICAL_GPUS_ENV)
    return int(value) if value else None
