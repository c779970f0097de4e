"""Where the driver's batches come from: synchronously, or from an asynchronous producer.

The driver (``rlvr.loop.run``) asks a *batch source* for rollout ``r``'s batch, trains on it and
hands the new weights back; the two sources here are the strategy ``--async`` picks (STYLE
point 4: async is a strategy passed to the same driver, not a second loop):

    batch = source.next_batch(r)                 # RolloutBatch, trained at policy version r
    source.update_weights(weights, version=r + 1)  # every --update-weights-interval rollouts

``SyncBatches`` generates rollout ``r`` when asked (the engine idles while the trainer trains).

``AsyncProducer`` (seed 003 §3.2, slime's fully-async rollout) runs a thread with its own
asyncio loop beside the trainer. It keeps ``--rollout-concurrency`` prompt *groups* in flight
(each group is ``--n-samples-per-prompt`` requests, graded as soon as its last response is back)
and files finished groups in a buffer; ``next_batch`` returns as soon as
``--rollout-batch-size`` groups are ready. Every token carries the weight version that sampled
it (the engine returns one per token); a sample's *staleness* when trained at version ``r`` is
``r - min(its token versions)``.

The staleness bound ``--max-staleness K`` is kept twice:
- admission (AReaL's rule, Fu et al. 2025): a group is started only if, were it delivered in
  submission order, the batch it lands in would be trained at a version at most ``K`` ahead of the
  engine's weights: ``next_batch_version + ahead // batch_size - engine_version <= K`` with
  ``ahead`` the groups already in flight or ready. ``K = 0`` therefore waits for each push, which
  makes training exactly on-policy.
- at delivery: groups finish out of order (the long tail), so ``next_batch`` takes the ready
  groups with the oldest tokens first, and a group that would still exceed ``K`` is never
  trained: it is reset and *re-generated* from its prompt (``rollout/stale_regenerated_groups``).
  Nothing is dropped silently; every group drawn from the data source is trained exactly once,
  or is still pending when the run ends (``pending_groups``).

A weight push reaches the engine from the producer's thread. ``--weight-update-inflight abort``
aborts the requests in flight, applies the weights and continues them as partial rollouts (their
later tokens carry the new version; ``--mask-offpolicy-in-partial-rollout`` masks the older ones);
``finish`` stops starting groups, lets the ones in flight finish on the old weights, then applies
the weights (the trainer does not wait in either case). Off-policy corrections (TIS/ICE-POP/OPSM)
need nothing more: each sample keeps the engine's log-probs (q) of the weights that sampled it.

Seam for Ray: the producer needs only an object with ``Rollout``'s methods ``next_groups``,
``run_group``, ``sampling_params``, ``make_batch``, ``group_filter``, ``data_source`` and
``engine`` (``abort``, ``update_weights``); a rollout-manager actor can host it unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Mapping

import torch

from rlvr.types import RolloutBatch, Sample, Status, sample_from_dict, sample_to_dict

log = logging.getLogger(__name__)

# Counted between two batches and logged with the second: groups re-generated for staleness,
# samples aborted at weight pushes, groups the dynamic filter dropped, aborted samples continued.
COUNTS = ("rollout/stale_regenerated_groups", "rollout/aborted", "rollout/dynamic_filter/dropped_groups",
          "rollout/partial_rollout/resumed")


def min_version(group: list[Sample], default: int) -> int:
    """The oldest weight version among a group's tokens (``default`` when it has none yet)."""
    return min((min(s.weight_versions) for s in group if s.weight_versions), default=default)


def fresh_copy(group: list[Sample]) -> list[Sample]:
    """The group as it was drawn: prompt, label, metadata and uids, no response."""
    keep = ("prompt", "prompt_ids", "label", "metadata", "group_index", "index", "prompt_index", "uid")
    return [Sample(**{k: sample_to_dict(s)[k] for k in keep}) for s in group]


class SyncBatches:
    """The synchronous source: rollout ``r`` is generated when the driver asks for it."""

    def __init__(self, rollout, next_batch):
        self.rollout, self._next_batch = rollout, next_batch

    def next_batch(self, rollout_id: int) -> RolloutBatch:
        return self._next_batch(rollout_id)

    def update_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        self.rollout.update_weights(weights, version)

    def wait_for_weights(self) -> None:
        pass

    def data_state(self) -> dict:
        return self.rollout.data_source.state_dict()

    def pending_groups(self) -> list[list[Sample]]:
        return []

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncProducer:
    """Rollout on a thread of its own; see the module docstring for the contract."""

    def __init__(self, rollout, concurrency: int, max_staleness: int, inflight: str = "abort", version: int = 0):
        if inflight not in ("abort", "finish"):
            raise ValueError(f"inflight must be 'abort' or 'finish', got {inflight!r}")
        self.rollout, self.concurrency, self.max_staleness, self.inflight = rollout, concurrency, max_staleness, inflight
        self.batch_size = rollout.cfg.rollout_batch_size
        self._cv = threading.Condition()  # guards everything below the trainer thread also reads
        self._ready: list[list[Sample]] = []  # finished, graded groups
        self._retry: deque[list[Sample]] = deque()  # groups to continue (aborted) or re-generate (stale)
        self._in_flight: dict[asyncio.Task, list[Sample]] = {}
        self._next_version = version  # the policy version the next batch is trained at
        self.engine_version = version  # the weights the engine holds
        self._pending_weights: tuple[dict[str, torch.Tensor], int] | None = None
        self._counts = dict.fromkeys(COUNTS, 0.0)  # since the last batch was taken
        self._error: BaseException | None = None
        self._closing = False
        self._last_take = time.perf_counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(started,), name="rlvr-producer", daemon=True)
        self._thread.start()
        started.wait()

    # ---- what the driver calls (trainer thread) ---------------------------------------------
    def next_batch(self, rollout_id: int) -> RolloutBatch:
        """The next ``--rollout-batch-size`` ready groups, to be trained at version ``rollout_id``."""
        t0 = time.perf_counter()
        with self._cv:
            self._next_version = rollout_id
            while True:
                if self._error is not None:
                    raise RuntimeError("the rollout producer failed") from self._error
                self._regenerate_stale(rollout_id)
                if len(self._ready) >= self.batch_size:
                    break
                self._cv.wait(timeout=1.0)
            # Oldest tokens first; equally old groups in draw order (a group's uid is its draw number).
            self._ready.sort(key=lambda g: (min_version(g, self.engine_version), int(g[0].group_uid or 0)))
            groups, self._ready = self._ready[: self.batch_size], self._ready[self.batch_size:]
            self._next_version = rollout_id + 1
            extra, self._counts = self._counts, dict.fromkeys(COUNTS, 0.0)
            extra |= {"rollout/in_flight_groups": float(len(self._in_flight)),
                              "rollout/ready_groups": float(len(self._ready)),
                              "rollout/engine_version": float(self.engine_version),
                              "perf/rollout_wait_time": time.perf_counter() - t0}
        self._notify()  # room for more groups
        now = time.perf_counter()
        elapsed, self._last_take = now - self._last_take, now
        return self.rollout.make_batch(rollout_id, groups, elapsed, extra)

    def update_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Hand the producer new weights; it applies them to the engine on its own thread (a copy
        is taken: the trainer goes on changing its parameters)."""
        snapshot = {k: v.detach().clone() for k, v in weights.items()}
        with self._cv:
            self._pending_weights = (snapshot, version)  # a newer push supersedes one not yet applied
        self._notify()

    def wait_for_weights(self) -> None:
        """Block until the last pushed weights are on the engine (before an eval)."""
        with self._cv:
            while self._pending_weights is not None and self._error is None:
                self._cv.wait(timeout=1.0)

    def pending_groups(self) -> list[list[Sample]]:
        """Groups drawn but not yet trained (ready, in flight, waiting to be retried), fresh."""
        with self._cv:
            groups = list(self._ready) + list(self._in_flight.values()) + list(self._retry)
            return [fresh_copy(g) for g in groups]

    def data_state(self) -> dict:
        """The data source's state with every untrained group in its buffer: a run resumed from a
        checkpoint taken now generates them again, so none is lost."""
        with self._cv:
            state = self.rollout.data_source.state_dict()
        pending = [[sample_to_dict(s) for s in g] for g in self.pending_groups()]
        return state | {"buffer": pending + state["buffer"]}

    def close(self) -> None:
        """Abort what is in flight and stop the thread."""
        with self._cv:
            self._closing = True
        self._notify()
        self._thread.join(timeout=120)
        if self._thread.is_alive():
            log.error("the rollout producer did not stop within 120 s")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the producer thread ------------------------------------------------------------------
    def _notify(self) -> None:
        with self._cv:
            self._cv.notify_all()
        if self._loop is not None and self._wake is not None:
            try:
                self._loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:  # the loop has closed
                pass

    def _main(self, started: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._wake = asyncio.Event()
        started.set()
        try:
            self._loop.run_until_complete(self._produce())
        except BaseException as e:  # contained: the trainer's next_batch raises it
            log.exception("the rollout producer failed")
            with self._cv:
                self._error = e
                self._cv.notify_all()
        finally:
            self._loop.close()

    async def _produce(self) -> None:
        params = self.rollout.sampling_params()
        while True:
            self._wake.clear()  # before reading the state: a notify from now on is not lost
            with self._cv:
                closing, update = self._closing, self._pending_weights
            if closing:
                return await self._stop_in_flight()
            if update is not None:
                if self.inflight == "abort":
                    await self._stop_in_flight()
                if not self._in_flight:  # "finish": only once the ones in flight are done
                    await self._apply(*update)
                    continue
            else:
                while self._admissible():
                    self._launch(self._next_group(), params)
            waiter = asyncio.ensure_future(self._wake.wait())
            done, _ = await asyncio.wait({*self._in_flight, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            for task in done - {waiter}:
                self._file(task)

    def _admissible(self) -> bool:
        """May one more group start now without risking staleness above K (module docstring)?"""
        with self._cv:
            if len(self._in_flight) >= self.concurrency:
                return False
            return self._landing_version() - self.engine_version <= self.max_staleness

    def _landing_version(self) -> int:
        """The version a group started now is trained at, if groups are delivered in the order
        they start. Holds ``_cv``."""
        return self._next_version + (len(self._ready) + len(self._in_flight)) // self.batch_size

    def _next_group(self) -> list[Sample]:
        """A group to continue or re-generate, else a resumed run's pending group, else a new one."""
        with self._cv:
            if self._retry:
                group = self._retry.popleft()
                if self._landing_version() - min_version(group, self.engine_version) > self.max_staleness:
                    group = self._stale_reset(group)  # its older tokens would break the bound
                return group
            buffered = self.rollout.data_source.take_partial(1)
            return buffered[0] if buffered else self.rollout.next_groups(1)[0]

    def _launch(self, group: list[Sample], params) -> None:
        task = asyncio.ensure_future(self.rollout.run_group(group, params, True))
        with self._cv:
            self._counts["rollout/partial_rollout/resumed"] += sum(s.status == Status.ABORTED for s in group)
            self._in_flight[task] = group

    def _file(self, task: asyncio.Task) -> None:
        """A group came back: ready, aborted (to be continued), or dropped by the dynamic filter."""
        with self._cv:
            group = self._in_flight.pop(task)
            task.result()  # an engine failure of the whole call propagates (and stops the run)
            if any(s.status == Status.ABORTED for s in group):
                self._counts["rollout/aborted"] += sum(s.status == Status.ABORTED for s in group)
                self._retry.append(group)
            elif self.rollout.group_filter is not None and not self.rollout.group_filter(group):
                self._counts["rollout/dynamic_filter/dropped_groups"] += 1
            else:
                self._ready.append(group)
            self._cv.notify_all()

    def _regenerate_stale(self, version: int) -> None:
        """Reset ready groups that would be trained more than K versions after their oldest
        token, and queue them to be sampled again from their prompt. Holds ``_cv``."""
        stale = [g for g in self._ready if version - min_version(g, version) > self.max_staleness]
        if not stale:
            return
        self._ready = [g for g in self._ready if not any(g is s for s in stale)]
        self._retry.extendleft(self._stale_reset(g) for g in reversed(stale))
        log.info("%d groups would be trained more than --max-staleness %d versions old; re-generating them",
                 len(stale), self.max_staleness)
        self._notify()

    async def _stop_in_flight(self) -> None:
        """Abort every request in flight and file the groups (aborted ones go to the retry queue)."""
        if not self._in_flight:
            return
        self.rollout.engine.abort()
        done, _ = await asyncio.wait(set(self._in_flight))
        for task in done:
            self._file(task)

    async def _apply(self, weights: dict[str, torch.Tensor], version: int) -> None:
        t0 = time.perf_counter()
        await asyncio.to_thread(self.rollout.engine.update_weights, weights, version)
        with self._cv:
            if self._pending_weights is not None and self._pending_weights[1] == version:
                self._pending_weights = None
            self.engine_version = version
            self._cv.notify_all()
        log.debug("weights v%d on the engine in %.2f s", version, time.perf_counter() - t0)

    def _stale_reset(self, group: list[Sample]) -> list[Sample]:
        """The group with its responses dropped, to be sampled again (counted). Holds ``_cv``."""
        self._counts["rollout/stale_regenerated_groups"] += 1
        return fresh_copy(group)


__all__ = ["AsyncProducer", "SyncBatches", "fresh_copy", "min_version", "sample_from_dict"]
