"""The plumbing the threaded batch sources share: ``AsyncProducer`` and ``RolloutFunctionProducer``
(``rlvr.rollout.producer``) and ``PipelinedProducer`` (``rlvr.rollout.pipeline``).

Each makes batches on a thread of its own while the trainer's thread takes them; they differ in
*what* they make (groups scheduled one by one on an asyncio loop, whole rollouts of a user's
function, whole rollouts on a fixed schedule) and in *when* they may start the next (their
staleness rules). What is the same lives in ``ProducerThread``, which a producer holds
(composition, not a base class):

- ``cv``, one condition variable guarding every piece of state both threads read, the producer's
  own included;
- the thread, started with the producer's body (``start``); an exception of the body is logged
  and kept (``error``), and the trainer's next wait raises ``RuntimeError("<what> failed")`` from
  it instead of waiting for a batch that never comes;
- ``closing``, set by ``close``, which wakes the thread (``notify``: the condition variable and,
  for a thread asleep in an asyncio loop, its ``wake`` callback) and joins it;
- the batches made and not yet taken, by rollout id (``ready``: how many may be made ahead is the
  producer's rule), and ``busy`` while one is being made, so that a checkpoint's state is taken
  between two (``made``);
- the newest weight push not yet in the engine (``pending_weights``: ``push``, ``loaded``,
  ``wait_for_weights``), for the producers where a newer push supersedes an older one (the
  pipelined producer queues its pushes instead: each is due before a given rollout).

Every wait on the trainer's side wakes at least once a second, so a failed thread is noticed even
if nothing notifies.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Mapping

from rlvr.core.types import RolloutBatch

log = logging.getLogger(__name__)


def weights_snapshot(weights):
    """What a producer keeps of a push until its thread loads it: live tensors (a mapping) are
    copied, since the trainer goes on changing its parameters; anything else -- under Ray, an
    object-store reference -- is a snapshot already and passes as it is."""
    return {k: v.detach().clone() for k, v in weights.items()} if isinstance(weights, Mapping) else weights


class ProducerThread:
    """A producer's thread and the state it shares with the trainer's (module docstring).

    ``what`` names the producer in its errors and logs ("the rollout producer"); ``join_timeout``
    is how long ``close`` waits for the thread; ``wake`` is called by ``notify`` after the
    condition variable, from either thread."""

    def __init__(self, name: str, what: str, join_timeout: float, wake: Callable[[], None] | None = None):
        self.cv = threading.Condition()
        self.ready: dict[int, RolloutBatch] = {}  # made, not yet taken (the whole-batch producers)
        self.busy = False  # a batch is being made
        self.closing = False
        self.error: BaseException | None = None
        self.pending_weights: tuple | None = None  # (weights, version) pushed, not yet in the engine
        self.what, self._join_timeout, self._wake = what, join_timeout, wake
        self._thread: threading.Thread | None = None
        self._name = name

    def start(self, body: Callable[[], None]) -> None:
        """Run ``body`` on the thread; it returns once ``closing`` is set (or raises)."""
        self._thread = threading.Thread(target=self._run, args=(body,), name=self._name, daemon=True)
        self._thread.start()

    def _run(self, body: Callable[[], None]) -> None:
        try:
            body()
        except BaseException as e:  # contained: the trainer's next wait raises it
            log.exception("%s failed", self.what)
            with self.cv:
                self.error, self.busy = e, False
                self.cv.notify_all()

    def notify(self) -> None:
        """Wake whoever waits: the trainer's thread on ``cv``, the producer's through ``wake``."""
        with self.cv:
            self.cv.notify_all()
        if self._wake is not None:
            self._wake()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"{self.what} failed") from self.error

    def wait(self, until: Callable[[], bool]) -> None:
        """Until ``until()`` holds or the thread has failed (the caller decides whether to raise).
        Holds ``cv``."""
        while not until() and self.error is None:
            self.cv.wait(timeout=1.0)

    def take(self, rollout_id: int) -> RolloutBatch:
        """Rollout ``rollout_id``'s batch once it is made, with the time the trainer waited for it
        (``perf/rollout_wait_time``); the thread's error if it failed first."""
        t0 = time.perf_counter()
        with self.cv:
            self.wait(lambda: rollout_id in self.ready)
            if rollout_id not in self.ready:
                self.raise_if_failed()
            batch = self.ready.pop(rollout_id)
            self.cv.notify_all()  # room for the next
        batch.metrics["perf/rollout_wait_time"] = time.perf_counter() - t0
        return batch

    def made(self) -> dict[int, RolloutBatch]:
        """The batches made and not taken, once none is being made. Holds ``cv``."""
        self.wait(lambda: not self.busy)
        return self.ready

    def push(self, weights, version: int) -> None:
        """Keep a snapshot of ``weights`` for the thread to load (superseding a push not yet loaded)
        and wake it."""
        with self.cv:
            self.pending_weights = (weights_snapshot(weights), version)
        self.notify()

    def loaded(self, update: tuple) -> None:
        """``update`` (what ``pending_weights`` held) is in the engine: clear it unless a newer push
        came meanwhile. Holds ``cv``."""
        if self.pending_weights is update:
            self.pending_weights = None
        self.cv.notify_all()

    def wait_for_weights(self) -> None:
        """Until the newest push is in the engine (or the thread has failed)."""
        with self.cv:
            self.wait(lambda: self.pending_weights is None)

    def close(self) -> None:
        """Tell the thread to stop, wake it and join it (logged when it outlives the timeout)."""
        with self.cv:
            self.closing = True
        self.notify()
        if self._thread is None:
            return
        self._thread.join(timeout=self._join_timeout)
        if self._thread.is_alive():
            log.error("%s did not stop within %.0f s", self.what, self._join_timeout)


__all__ = ["ProducerThread", "weights_snapshot"]
