"""The one test seam: what tests may reach into a run to do, named as such.

Production code calls these at fixed points; outside tests they do nothing.

* ``crash_point(name)``: crash tests SIGKILL the process at a named point (``rollout:3``,
  ``save:2``) by setting ``RLVR_TEST_SIGKILL_AT`` in the run's environment, to prove that a
  resumed run logs the same values as one never stopped.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

SIGKILL_AT_ENV = "RLVR_TEST_SIGKILL_AT"


def crash_point(point: str) -> None:
    """SIGKILL this process when ``RLVR_TEST_SIGKILL_AT`` equals ``point`` (crash tests)."""
    if os.environ.get(SIGKILL_AT_ENV) == point:
        log.warning("%s=%s: killing this process", SIGKILL_AT_ENV, point)
        os.kill(os.getpid(), signal.SIGKILL)
