"""``--async --deterministic-mode``: a pipelined producer whose schedule is fixed by the rollout ids.

``AsyncProducer`` starts groups whenever there is room and applies a weight push the moment it
arrives, so which tokens a version samples depends on thread timing. ``PipelinedProducer`` keeps
the overlap of sampling and training (slime's ``train_async.py``: rollout ``r + 1`` is sampled
while rollout ``r`` trains) with a schedule that is a function of the ids alone:

- rollout ``r`` is generated whole (``Rollout.generate``: deterministic collection, one engine
  call per round) with the engine holding exactly version ``due(r) = max(start, r - K)``
  (``--max-staleness K``; K = 0 is the synchronous schedule, K = 1 one rollout ahead);
- a weight push is queued, never dropped, and applied just before the first rollout it is due
  for: a push of version ``v`` reaches the engine right before rollout ``v + K`` starts;
- ``wait_for_weights`` (before an evaluation) returns once the newest push is in the engine,
  which happens after the rollouts due before it are generated; an evaluation then runs beside
  the next rollout, in calls of its own.

A checkpoint after ``done`` rollouts holds the batches already made for the rollouts after it
(sampled with versions older than the checkpoint's weights, which a resumed run could not
re-create) and the id of the next one to generate (``checkpoint_state``), taken once the producer
is idle with the checkpoint's version in the engine. A run resumed from it (``state=``) trains
those batches as they were and continues the same schedule, so it logs what the uninterrupted
run logged. Weights are pushed every rollout (``--update-weights-interval 1``, which the config
requires with this producer).
"""

from __future__ import annotations

from collections import deque

from rlvr.core.types import RolloutBatch, Sample
from rlvr.rollout.producer import BatchSource, untrained_groups
from rlvr.rollout.producer_thread import ProducerThread, weights_snapshot


class PipelinedProducer(BatchSource):
    """Rollouts on a thread beside the trainer, each at the weight version its id is due (module
    docstring). ``make(r)`` generates rollout ``r``; ``rollout.update_weights(w, v)`` loads a push
    into the engine."""

    def __init__(self, rollout, make, max_staleness: int, start: int = 0, stop: int | None = None,
                 state: dict | None = None):
        self.rollout, self.make, self.max_staleness, self.start = rollout, make, max_staleness, start
        self.stop = stop  # --num-rollout: no rollout at or after it is made
        self.thread = ProducerThread("rlvr-pipelined-rollout", "the rollout producer", 600)
        self._cv = self.thread.cv  # guards the state below and the thread's ready batches
        self._next_id = start
        if state is not None:  # resumed: the batches the checkpoint holds, the next id it names
            self.thread.ready = {b["rollout_id"]: RolloutBatch.from_dict(b) for b in state["ready"]}
            self._next_id = state["next_id"]
        self.engine_version = start
        self._pushes: deque[tuple[dict, int]] = deque()  # queued in version order, applied when due
        self._pushed = start  # the newest version the trainer pushed
        self.thread.start(self._main)

    def due(self, rollout_id: int) -> int:
        """The weight version rollout ``rollout_id`` is sampled with."""
        return max(self.start, rollout_id - self.max_staleness)

    # ---- what the driver calls -------------------------------------------------------------
    def next_batch(self, rollout_id: int) -> RolloutBatch:
        return self.thread.take(rollout_id)

    def update_weights(self, weights, version: int) -> None:
        with self._cv:
            if version <= self._pushed:
                raise ValueError(f"weights pushed out of order: version {version} after {self._pushed}")
            self._pushes.append((weights_snapshot(weights), version))
            self._pushed = version
            self._cv.notify_all()

    def wait_for_weights(self) -> None:
        with self._cv:
            self._wait_in_engine()

    def data_state(self) -> dict:
        with self._cv:
            self._wait_in_engine()
            return self.rollout.data_state()

    def checkpoint_state(self) -> dict:
        """The data source's state, the made but untrained batches and the next id to generate,
        taken at one moment (module docstring)."""
        with self._cv:
            self._wait_in_engine()
            ready = self.thread.ready
            return {"data_source": self.rollout.data_state(),
                    "pipeline": {"next_id": self._next_id, "ready": [ready[r].to_dict() for r in sorted(ready)]}}

    def pending_groups(self) -> list[list[Sample]]:
        with self._cv:
            return untrained_groups(self.thread.made())

    def close(self) -> None:
        self.thread.close()

    # ---- the producer's thread ---------------------------------------------------------------
    def _wait_in_engine(self) -> None:
        """Until the newest push is in the engine and no rollout is being made. Holds ``_cv``."""
        self.thread.wait(lambda: self.engine_version >= self._pushed and not self.thread.busy)
        self.thread.raise_if_failed()

    def _next_step(self):
        """What the thread does next: ("push", weights, version), ("make", id) or None (closing).
        Holds ``_cv``."""
        while True:
            if self.thread.closing:
                return None
            target, more = self.due(self._next_id), self.stop is None or self._next_id < self.stop
            # A push is applied right before the first rollout due at its version, or at once when
            # no rollout is left to make (an evaluation or the last checkpoint waits for it).
            if self._pushes and (self._pushes[0][1] <= target or not more):
                weights, version = self._pushes.popleft()
                return "push", weights, version
            if self.engine_version == target and more:
                self.thread.busy = True
                return "make", self._next_id
            self._cv.wait()

    def _main(self) -> None:
        while True:
            with self._cv:
                step = self._next_step()
            if step is None:
                return
            if step[0] == "push":
                self.rollout.update_weights(step[1], step[2])
                with self._cv:
                    self.engine_version = step[2]
                    self._cv.notify_all()
                continue
            rollout_id = step[1]
            batch = self.make(rollout_id)
            batch.metrics["rollout/engine_version"] = float(self.engine_version)
            with self._cv:
                self.thread.ready[rollout_id] = batch
                self._next_id, self.thread.busy = rollout_id + 1, False
                self._cv.notify_all()
