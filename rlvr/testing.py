"""The one test seam: what tests may reach into a run to do, named as such.

Production code calls these at fixed points; outside tests they do nothing.

* ``crash_point(name)``: crash tests SIGKILL the process at a named point (``rollout:3``,
  ``save:2``) by setting ``RLVR_TEST_SIGKILL_AT`` in the run's environment, to prove that a
  resumed run logs the same values as one never stopped.
* ``fault_point(name)``: fault-tolerance tests make code that must survive its own errors raise
  at a named point (``engine-monitor``: each health check of the engine supervisor's monitor) by
  setting ``RLVR_TEST_RAISE_AT=name:K``: every K-th time the point is reached it raises
  ``InjectedFault`` (K = 2: every other time).
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

SIGKILL_AT_ENV = "RLVR_TEST_SIGKILL_AT"
RAISE_AT_ENV = "RLVR_TEST_RAISE_AT"

_reached: dict[str, int] = {}  # fault point -> times reached in this process


class InjectedFault(RuntimeError):
    """Raised by ``fault_point`` on a test's request."""


def crash_point(point: str) -> None:
    """SIGKILL this process when ``RLVR_TEST_SIGKILL_AT`` equals ``point`` (crash tests)."""
    if os.environ.get(SIGKILL_AT_ENV) == point:
        log.warning("%s=%s: killing this process", SIGKILL_AT_ENV, point)
        os.kill(os.getpid(), signal.SIGKILL)


def fault_point(point: str) -> None:
    """Raise ``InjectedFault`` every K-th time ``point`` is reached when ``RLVR_TEST_RAISE_AT`` is ``point:K``.

    >>> os.environ[RAISE_AT_ENV] = "doctest-point:2"
    >>> fault_point("doctest-point"); fault_point("other-point")
    >>> fault_point("doctest-point")
    Traceback (most recent call last):
    ...
    rlvr.testing.InjectedFault: RLVR_TEST_RAISE_AT=doctest-point:2: injected at doctest-point (time 2)
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
