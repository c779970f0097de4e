"""Where the driver's batches come from: synchronously, or from an asynchronous producer.

The driver (``rlvr.runtime.loop.run``) asks a *batch source* for rollout ``r``'s batch, trains on it and
hands the new weights back; the two sources here are the strategy ``--async`` picks (STYLE
point 4: async is a strategy passed to the same driver, not a second loop):

    batch = source.next_batch(r)                 # RolloutBatch, trained at policy version r
    source.update_weights(weights, version=r + 1)  # every --update-weights-interval rollouts

``SyncBatches`` generates rollout ``r`` when asked (the engine idles while the trainer trains).

``AsyncProducer`` (slime's fully-async rollout) runs a thread with its own
asyncio loop beside the trainer. It keeps ``--rollout-concurrency`` prompt *groups* in flight
(each group is ``--n-samples-per-prompt`` requests, graded as soon as its last response is back)
and files finished groups in a buffer; ``next_batch`` returns as soon as a batch of
``--rollout-batch-size`` groups is ready (see "batch selection" below). Every token carries the weight version that sampled
it (the engine returns one per token); a sample's *staleness* when trained at version ``r`` is
``r - min(its token versions)``.

The staleness bound ``--max-staleness K`` is a *deadline*: a group started while the engine
holds version ``e`` must be trained at a version ``<= e + K`` (its tokens are then at most K
versions old, whatever the order groups finish in). It is kept by:
- admission (AReaL's rule, Fu et al. 2025): a new group starts only if, trained after every
  group not yet trained, it would meet its deadline: ``next_version + ahead // batch_size - e
  <= K``. So the groups due by any version always fit the batches before it, and ``K = 0``
  waits for each push: exactly on-policy.
- batch selection: a batch takes the groups with the earliest deadlines. Groups due before the
  batch's last deadline must be in it -- the trainer waits for one still in flight -- so a long
  response (the tail) is trained late but within its deadline, never starved or re-generated
  away (which would bias training towards short responses); the rest of the batch is whichever
  groups due at that deadline are ready first.
- a last check: a group past its deadline anyway (a push that came late) is *re-generated* from
  its prompt, never trained (``rollout/stale_regenerated_groups``).
Nothing is dropped silently; every group drawn from the data source is trained exactly once, or
is still pending when the run ends (``pending_groups``; a checkpoint puts those back in the data
source's buffer, so a resumed run generates them again).

A weight push reaches the engine from the producer's thread. ``--weight-update-inflight abort``
aborts the requests in flight, applies the weights and continues them as partial rollouts (their
later tokens carry the new version; ``--mask-offpolicy-in-partial-rollout`` masks the older ones);
``finish`` stops starting groups, lets the ones in flight finish on the old weights, then applies
the weights (the trainer does not wait in either case). Off-policy corrections (TIS/ICE-POP/OPSM)
need nothing more: each sample keeps the engine's log-probs (q) of the weights that sampled it.

Seam for Ray: the producer needs only an object with ``Rollout``'s ``cfg`` and methods ``next_groups``,
``run_group``, ``sampling_params``, ``make_batch``, ``group_filter``, ``data_source`` and
``engine`` (``abort``, ``update_weights``); a rollout-manager actor can host it unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Mapping, Protocol

import torch

from rlvr.core.types import RolloutBatch, Sample, Status, sample_to_dict
from rlvr.rollout.producer_thread import ProducerThread

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


def untrained_groups(ready: Mapping[int, RolloutBatch]) -> list[list[Sample]]:
    """Fresh copies of the groups of batches made but not trained, in rollout order."""
    out = []
    for r in sorted(ready):
        b, n = ready[r], ready[r].n_samples_per_prompt
        out += [fresh_copy(b.samples[i: i + n]) for i in range(0, len(b.samples), n)]
    return out


def with_untrained(state: dict, groups: list[list[Sample]]) -> dict:
    """The data source's ``state`` with ``groups`` (made, not trained) first in its buffer, so a run
    resumed from it generates them again and none is lost."""
    return state | {"buffer": [[sample_to_dict(s) for s in g] for g in groups] + state["buffer"]}


class BatchSource(Protocol):
    """Where the driver gets its batches and sends its weights (``rlvr.runtime.loop``): the
    synchronous source, the async producer, the rollout-function producer and the Ray proxy.
    Sources subclass it for the ``with`` block (``close`` stops a source's thread, if any)."""

    def next_batch(self, rollout_id: int) -> RolloutBatch:
        """The batch trained at version ``rollout_id``."""
        ...

    def update_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Push the trainer's weights (``version``: the steps trained) to the engines."""
        ...

    def wait_for_weights(self) -> None:
        """Return once the last pushed weights are in the engines."""
        ...

    def data_state(self) -> dict:
        """The data source's state as of the batches handed out (for a checkpoint)."""
        ...

    def checkpoint_state(self) -> dict:
        """What a checkpoint keeps of the source, taken at one moment: ``{"data_source": ...}``
        (the pipelined producer adds its made batches: ``rlvr.rollout.pipeline``)."""
        return {"data_source": self.data_state()}

    def pending_groups(self) -> list[list[Sample]]:
        """Groups made but not trained when the run stops (kept in the checkpoint's data state)."""
        ...

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SyncBatches(BatchSource):
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
        return self.rollout.data_state()

    def pending_groups(self) -> list[list[Sample]]:
        return []


class AsyncProducer(BatchSource):
    """Rollout on a thread of its own; see the module docstring for the contract."""

    def __init__(self, rollout, concurrency: int, max_staleness: int, inflight: str = "abort", version: int = 0):
        if inflight not in ("abort", "finish"):
            raise ValueError(f"inflight must be 'abort' or 'finish', got {inflight!r}")
        self.rollout, self.concurrency, self.max_staleness, self.inflight = rollout, concurrency, max_staleness, inflight
        self.batch_size = rollout.cfg.rollout_batch_size
        # The loop the thread runs; made here so that a notify before the thread starts is kept.
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self.thread = ProducerThread("rlvr-producer", "the rollout producer", 120, wake=self._wake_loop)
        self._cv = self.thread.cv  # guards everything below the trainer thread also reads
        self._ready: list[list[Sample]] = []  # finished, graded groups
        self._retry: deque[list[Sample]] = deque()  # groups to continue (aborted) or re-generate (stale)
        self._in_flight: dict[asyncio.Task, list[Sample]] = {}
        # group uid -> the last version it may be trained at: K after the version it started on
        self._deadline: dict[str, int] = {}
        self._next_version = version  # the policy version the next batch is trained at
        self.engine_version = version  # the weights the engine holds
        self._counts = dict.fromkeys(COUNTS, 0.0)  # since the last batch was taken
        self._last_take = time.perf_counter()
        self.thread.start(self._main)

    # ---- what the driver calls (trainer thread) ---------------------------------------------
    def next_batch(self, rollout_id: int) -> RolloutBatch:
        """The next ``--rollout-batch-size`` ready groups, to be trained at version ``rollout_id``."""
        t0 = time.perf_counter()
        with self._cv:
            self._next_version = rollout_id
            while True:
                self.thread.raise_if_failed()
                self._regenerate_stale(rollout_id)
                groups = self._select()
                if groups is not None:
                    break
                self._cv.wait(timeout=1.0)
            taken = {id(g) for g in groups}
            self._ready = [g for g in self._ready if id(g) not in taken]
            for g in groups:
                del self._deadline[g[0].group_uid]
            self._next_version = rollout_id + 1
            extra, self._counts = self._counts, dict.fromkeys(COUNTS, 0.0)
            extra |= {"rollout/in_flight_groups": float(len(self._in_flight)),
                      "rollout/ready_groups": float(len(self._ready)),
                      "rollout/engine_version": float(self.engine_version),
                      "perf/rollout_wait_time": time.perf_counter() - t0}
        self.thread.notify()  # room for more groups
        now = time.perf_counter()
        elapsed, self._last_take = now - self._last_take, now
        return self.rollout.make_batch(rollout_id, groups, elapsed, extra)

    def _select(self) -> list[list[Sample]] | None:
        """The next batch, earliest deadlines first, or None while it is not complete. Holds ``_cv``.

        Among all groups not yet trained (ready, in flight, waiting to continue), the batch is
        the ``batch_size`` with the earliest deadlines: every group whose deadline is before the
        last one taken (D) must be in it -- the trainer waits for those still in flight, so a long
        response is trained late but never starved -- and the rest are ready groups due at D, in
        draw order (a group's uid is its draw number). Admission keeps the groups due by any
        version few enough to fit (module docstring)."""
        b = self.batch_size
        ready = {id(g) for g in self._ready}
        pending = self._ready + list(self._in_flight.values()) + list(self._retry)
        if len(pending) < b:
            return None
        order = sorted(pending, key=lambda g: (self._deadline[g[0].group_uid], id(g) not in ready))
        last = self._deadline[order[b - 1][0].group_uid]
        must = [g for g in order if self._deadline[g[0].group_uid] < last]
        if any(id(g) not in ready for g in must):
            return None
        due = sorted((g for g in self._ready if self._deadline[g[0].group_uid] == last), key=_draw)
        if len(must) + len(due) < b:
            return None
        return sorted(must, key=lambda g: (self._deadline[g[0].group_uid], _draw(g))) + due[: b - len(must)]

    def update_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Hand the producer new weights (a snapshot, superseding a push not yet applied); it
        applies them to the engine on its own thread."""
        self.thread.push(weights, version)

    def wait_for_weights(self) -> None:
        """Block until the last pushed weights are on the engine (before an eval)."""
        self.thread.wait_for_weights()

    def pending_groups(self) -> list[list[Sample]]:
        """Groups drawn but not yet trained (ready, in flight, waiting to be retried), fresh."""
        with self._cv:
            groups = list(self._ready) + list(self._in_flight.values()) + list(self._retry)
            return [fresh_copy(g) for g in groups]

    def data_state(self) -> dict:
        """The data source's state with every untrained group in its buffer: a run resumed from a
        checkpoint taken now generates them again, so none is lost."""
        with self._cv:
            state = self.rollout.data_state()
        return with_untrained(state, self.pending_groups())

    def close(self) -> None:
        """Abort what is in flight and stop the thread."""
        self.thread.close()

    # ---- the producer thread ------------------------------------------------------------------
    def _wake_loop(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._wake.set)
        except RuntimeError:  # the loop has closed
            pass

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._produce())
        finally:
            self._loop.close()

    async def _produce(self) -> None:
        params = self.rollout.sampling_params()
        while True:
            self._wake.clear()  # before reading the state: a notify from now on is not lost
            with self._cv:
                closing, update = self.thread.closing, self.thread.pending_weights
            if closing:
                return await self._stop_in_flight()
            if update is not None:
                if self.inflight == "abort":
                    await self._stop_in_flight()
                if not self._in_flight:  # "finish": only once the ones in flight are done
                    await self._apply(update)
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
        """May one more group start now without risking staleness above K (module docstring)?
        Continuations always may (within the concurrency): they were admitted before."""
        with self._cv:
            if len(self._in_flight) >= self.concurrency:
                return False
            return bool(self._retry) or self._landing_version() - self.engine_version <= self.max_staleness

    def _landing_version(self) -> int:
        """The version a new group started now is trained at if every group not yet trained is
        trained before it. Holds ``_cv``."""
        return self._next_version + (len(self._ready) + len(self._in_flight) + len(self._retry)) // self.batch_size

    def _next_group(self) -> list[Sample]:
        """A group to continue or re-generate, else a resumed run's pending group, else a new one."""
        with self._cv:
            if self._retry:  # a continuation keeps its deadline (admitted already)
                return self._retry.popleft()
            buffered = self.rollout.data_source.take_partial(1)
            group = buffered[0] if buffered else self.rollout.next_groups(1)[0]
            self._deadline[group[0].group_uid] = self.engine_version + self.max_staleness
            return group

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
                del self._deadline[group[0].group_uid]
            else:
                self._ready.append(group)
            self._cv.notify_all()

    def _regenerate_stale(self, version: int) -> None:
        """Reset ready groups that would be trained more than K versions after their oldest
        token, and queue them to be sampled again from their prompt. Holds ``_cv``."""
        late = [g for g in self._ready + list(self._retry) if self._deadline[g[0].group_uid] < version]
        stale = [g for g in late if version - min_version(g, version) > self.max_staleness]
        for g in late:  # ones without tokens yet just get a new deadline
            self._deadline[g[0].group_uid] = self.engine_version + self.max_staleness
        if not stale:
            return
        self._ready = [g for g in self._ready if not any(g is s for s in stale)]
        self._retry = deque(g for g in self._retry if not any(g is s for s in stale))
        self._retry.extendleft(self._stale_reset(g) for g in reversed(stale))
        log.info("%d groups would be trained more than --max-staleness %d versions old; re-generating them",
                 len(stale), self.max_staleness)
        self.thread.notify()

    async def _stop_in_flight(self) -> None:
        """Abort every request in flight and file the groups (aborted ones go to the retry queue)."""
        if not self._in_flight:
            return
        self.rollout.engine.abort()
        done, _ = await asyncio.wait(set(self._in_flight))
        for task in done:
            self._file(task)

    async def _apply(self, update: tuple[dict[str, torch.Tensor], int]) -> None:
        t0 = time.perf_counter()
        weights, version = update
        await asyncio.to_thread(self.rollout.engine.update_weights, weights, version)
        with self._cv:
            self.engine_version = version
            self.thread.loaded(update)
        log.debug("weights v%d on the engine in %.2f s", version, time.perf_counter() - t0)

    def _stale_reset(self, group: list[Sample]) -> list[Sample]:
        """The group with its responses dropped, to be sampled again (counted) with a new
        deadline. Holds ``_cv``."""
        self._counts["rollout/stale_regenerated_groups"] += 1
        self._deadline[group[0].group_uid] = self.engine_version + self.max_staleness
        return fresh_copy(group)


class RolloutFunctionProducer(BatchSource):
    """``--async`` for a ``--rollout-function-path`` function, which owns its whole rollout (slime's
    ``generate_rollout``): a thread calls it for the next rollouts ahead while the trainer trains.

    Rollout ``r`` starts only once the engine holds version ``>= r - K`` (``--max-staleness K``),
    so its tokens are at most K versions old when trained at version ``r``; ``K = 0`` waits for
    each push (on-policy). A push reaches the engine between two calls, never during one (the
    function's own requests and state are its business: ``--weight-update-inflight`` is moot).
    At most ``K + 1`` batches are ready or being made. Same contract as ``AsyncProducer``."""

    def __init__(self, rollout, max_staleness: int, version: int = 0):
        self.rollout, self.max_staleness = rollout, max_staleness
        self.thread = ProducerThread("rlvr-rollout-function", "the rollout function", 600)
        self._cv = self.thread.cv  # guards the state below and the thread's ready batches
        self._next_id = version  # the next rollout the thread generates
        self.engine_version = version
        self.thread.start(self._main)

    def next_batch(self, rollout_id: int) -> RolloutBatch:
        batch = self.thread.take(rollout_id)
        batch.metrics["rollout/engine_version"] = float(self.engine_version)
        return batch

    def update_weights(self, weights, version: int) -> None:
        self.thread.push(weights, version)

    def wait_for_weights(self) -> None:
        self.thread.wait_for_weights()

    def pending_groups(self) -> list[list[Sample]]:
        """The groups of batches made but not trained, fresh (taken between two calls)."""
        with self._cv:
            return untrained_groups(self.thread.made())

    def data_state(self) -> dict:
        """The data source's state with the untrained groups in its buffer (see ``AsyncProducer``),
        taken between two calls of the function, so no group it drew is missed."""
        with self._cv:
            pending = untrained_groups(self.thread.made())
            state = self.rollout.data_state()
        return with_untrained(state, pending)

    def close(self) -> None:
        self.thread.close()

    def _main(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self.thread.closing or self.thread.pending_weights is not None
                                  or self._may_start())
                if self.thread.closing:
                    return
                update = self.thread.pending_weights
                self.thread.busy = update is None
            if update is not None:
                self._load(update)
            else:
                self._generate()

    def _load(self, update: tuple) -> None:
        self.rollout.update_weights(*update)
        with self._cv:
            self.engine_version = update[1]
            self.thread.loaded(update)

    def _generate(self) -> None:
        batch = None
        try:
            batch = self.rollout.generate(self._next_id)
        finally:  # filed and marked idle at once: data_state never sees it in neither place
            with self._cv:
                self.thread.busy = False
                if batch is not None:
                    self.thread.ready[self._next_id] = batch
                    self._next_id += 1
                self._cv.notify_all()

    def _may_start(self) -> bool:
        """Rollout ``_next_id`` may start: within K versions of the engine's weights. Holds ``_cv``."""
        return self._next_id - self.engine_version <= self.max_staleness


def make_producer(rollout, concurrency: int, max_staleness: int, inflight: str = "abort", version: int = 0):
    """The ``--async`` producer of ``rollout``: ``RolloutFunctionProducer`` when a rollout function
    makes the whole rollout, else ``AsyncProducer`` (groups scheduled one by one)."""
    if getattr(getattr(rollout, "agent", None), "rollout_fn", None) is not None:
        return RolloutFunctionProducer(rollout, max_staleness, version)
    return AsyncProducer(rollout, concurrency, max_staleness, inflight, version)


def _draw(group: list[Sample]) -> int:
    """The draw number of a group (its uid): equally due groups are trained in draw order."""
    return int(group[0].group_uid or 0)


__all__ = ["AsyncProducer", "RolloutFunctionProducer", "SyncBatches", "fresh_copy", "make_producer", "min_version",
           "untrained_groups"]
