"""Engine fault tolerance on Ray (``--ray --use-fault-tolerance``, issue 9): health-checked engine
actors, restarted when they die or hang, their in-flight requests re-issued.

``TolerantEngineGroup`` is an ``EngineGroup`` (the ``Engine`` protocol over M ``EngineActor``s)
whose engines are supervised from the rollout manager's process, with the local supervisor's
policy (``rlvr.engine.supervisor``, same flags, same metric names):

* a monitor thread sends ``actor.health.remote()`` to each live engine every
  ``--rollout-health-check-interval`` seconds. An engine is *down* when a call to it raises
  ``RayActorError`` (its process died: SIGKILL, OOM, segfault), or a probe has gone unanswered
  for ``--rollout-health-check-timeout`` seconds (hung: SIGSTOPped, deadlocked). Ray's
  ``ActorUnavailableError`` is a ``RayActorError`` too: the engine is replaced, not waited for. A probe that
  answers ``False`` (asleep while colocated) is an answer: the engine is alive.
* a down engine is taken out of the balance, its in-flight calls are cut off and *re-issued*
  (the whole prompt group, same rids) to the live engine with the fewest outstanding requests,
  or to the replacement; a call's result is taken from exactly one attempt -- one that
  returned while its engine was still up -- so no sample is lost or delivered twice.
* the actor is ``ray.kill``-ed (the raylet SIGKILLs a stopped process) and re-created by
  ``make(i)`` in the same bundle, on its own thread; it gets the newest weights and version
  before it takes requests (pushed again if a sync lands meanwhile).
* after ``--rollout-max-engine-restarts`` restarts of one engine it is removed; the run goes on
  with the others and fails with ``EnginesLost`` when none is left.

Why not a subclass of ``EngineSupervisor``: its seams are per request over HTTP (one
``_post_generate`` per request, weights written to disk), while an engine actor takes a whole
prompt group in one call (the prompt is prefilled once) and weights come from the object store;
overriding its generate, weight, abort and startup paths would leave little of it. What is
shared is the policy and the ``Slot`` record, which this module reuses.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError

from rlvr.distributed.rollout_manager import EngineGroup
from rlvr.engine.base import GenerateRequest, GenerateResult
from rlvr.engine.supervisor import RestartPolicy, Slot, _settle

log = logging.getLogger(__name__)

STARTUP_TIMEOUT = 180.0  # seconds a re-created engine actor may take to load (torch import on a busy CPU)


class EnginesLost(RuntimeError):
    """Every engine was removed after --rollout-max-engine-restarts restarts."""


class TolerantEngineGroup(RestartPolicy, EngineGroup):
    """``EngineGroup`` whose engines are health-checked, restarted and re-issued; see the module
    docstring. ``slots[i].proc`` is engine ``i``'s current actor handle, ``slots[i].url`` its pid."""

    def __init__(self, cfg, pg, p, cwd: str, n: int):
        super().__init__(cfg, pg, p, cwd, n)
        r = cfg.rollout
        self.interval, self.timeout = r.rollout_health_check_interval, r.rollout_health_check_timeout
        self.max_restarts = r.rollout_max_engine_restarts
        self.restarts = 0  # engine restarts so far (all slots)
        self.reissued = 0  # requests re-issued after their engine went down
        self.events: list[dict] = []  # every down / restarted / removed, with time, slot, pid, reason
        self._lock = threading.RLock()
        self._probes: dict[int, object] = {}  # slot -> health ref in flight
        self._abort_epoch = 0  # calls submitted before the last abort() come back aborted when re-issued
        self._aborted_rids: set[str] = set()
        self._closed = threading.Event()
        # Wait for every engine to load before the clock of the health checks starts.
        pids = ray.get([a.pid.remote() for a in self.actors], timeout=STARTUP_TIMEOUT)
        self.slots = [Slot(i, proc=a, url=str(pid), up=True, last_probe=time.monotonic())
                      for i, (a, pid) in enumerate(zip(self.actors, pids))]
        self._monitor = threading.Thread(target=self._monitor_loop, name="rlvr-engine-monitor", daemon=True)
        self._monitor.start()

    # ---- Engine protocol ----------------------------------------------------------------
    async def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        """One prompt group, re-issued until an engine that is still up answers it. A group
        re-issued after ``abort()``, or with a request aborted by rid, comes back aborted (no tokens:
        those it had were lost with its engine)."""
        if not requests:
            return []
        loop, epoch = asyncio.get_running_loop(), self._abort_epoch
        for attempt in range(self.max_restarts * len(self.slots) + len(self.slots) + 1):
            if self._abort_epoch != epoch or any(q.rid in self._aborted_rids for q in requests):
                return [GenerateResult(q.rid, [], [], "abort", self.version) for q in requests]
            slot = await self._pick()
            down = loop.create_future()
            with self._lock:
                if not slot.up:  # went down since it was picked
                    continue
                incarnation, actor = slot.incarnation, slot.proc
                slot.outstanding += len(requests)
                slot.down_waiters.append((loop, down))
            call = asyncio.ensure_future(actor.generate.remote(requests))
            try:
                await asyncio.wait({call, down}, return_when=asyncio.FIRST_COMPLETED)
                if not down.done():
                    try:
                        return call.result()  # an engine's own exception (RayTaskError) stops the run
                    except RayActorError as e:
                        reason = f"actor died: {type(e).__name__}"
                        self._on_down(slot, reason, incarnation)
                else:  # cut off with its engine: whatever it might still return is not taken
                    reason = "engine went down"
                    call.cancel()
                    await asyncio.gather(call, return_exceptions=True)
            finally:
                with self._lock:
                    slot.outstanding -= len(requests)
                    if (loop, down) in slot.down_waiters:
                        slot.down_waiters.remove((loop, down))
            with self._lock:
                self.reissued += len(requests)
            log.warning("%d requests (%s...) lost with engine %d (%s); re-issuing them (attempt %d)",
                        len(requests), requests[0].rid, slot.index, reason, attempt + 2)
        raise EnginesLost(f"requests {requests[0].rid}... failed on every engine attempt")

    def update_weights(self, weights_ref, version: int, with_checksum: bool = False) -> list[str | None]:
        """Load the weights into every live engine; one that dies meanwhile is restarted with them.
        Returns the checksums of the engines that loaded them."""
        with self._lock:
            self.weights_ref, self.version = weights_ref, version
        results = self._on_live("update_weights", weights_ref, version, with_checksum)
        return [s for s in results if s is not _DOWN]

    def abort(self, rid: str | None = None) -> None:
        with self._lock:
            if rid is None:
                self._abort_epoch += 1
            else:
                self._aborted_rids.add(rid)
        self._on_live("abort", rid)

    def sleep(self) -> None:
        self._on_live("sleep")

    def health(self) -> list[bool]:
        """Per engine: up (its actor answering, awake and holding weights); False while down."""
        return [r is True for r in self._on_live("health")]

    def rng_state(self) -> list[torch.Tensor | None]:
        """Per engine (None for one that is down: it restarts from a fresh stream)."""
        return [None if r is _DOWN else r for r in self._on_live("rng_state")]

    def set_rng_state(self, states) -> None:
        if isinstance(states, torch.Tensor):
            states = [states]
        if len(states) != len(self.slots):
            super().set_rng_state(states)  # raises the shape error
        for slot, state in zip(self.slots, states):
            if state is not None and slot.up:
                self._call(slot, "set_rng_state", state)

    def restart(self, i: int) -> None:
        """Replace engine ``i`` now (as if it had died) and wait for the replacement."""
        slot = self.slots[i]
        self._on_down(slot, "restart requested", slot.incarnation)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not slot.up and not slot.removed and time.monotonic() < deadline:
            time.sleep(0.05)

    def pids(self) -> list[int | None]:
        """Each engine's current process id (None while it is down)."""
        with self._lock:
            return [int(s.url) if s.up else None for s in self.slots]

    def close(self) -> None:
        self._closed.set()

    # ---- calls ----------------------------------------------------------------------------
    def _call(self, slot: Slot, method: str, *args):
        """``method`` on ``slot``'s actor; ``_DOWN`` (and the engine marked down) if the actor died."""
        incarnation = slot.incarnation
        try:
            return ray.get(getattr(slot.proc, method).remote(*args))
        except RayActorError as e:
            self._on_down(slot, f"actor died during {method}: {type(e).__name__}", incarnation)
            return _DOWN

    def _on_live(self, method: str, *args) -> list:
        """``method`` on every live engine at once; ``_DOWN`` for an engine that is (or went) down."""
        with self._lock:
            calls = [(s, s.incarnation, getattr(s.proc, method).remote(*args)) if s.up else (s, None, None)
                     for s in self.slots]
        out = []
        for slot, incarnation, ref in calls:
            if ref is None:
                out.append(_DOWN)
                continue
            try:
                out.append(ray.get(ref))
            except RayActorError as e:
                self._on_down(slot, f"actor died during {method}: {type(e).__name__}", incarnation)
                out.append(_DOWN)
        return out

    async def _pick(self) -> Slot:
        """The live engine with the fewest outstanding requests; waits while all are restarting."""
        while True:
            with self._lock:
                up = [s for s in self.slots if s.up]
                if up:
                    return min(up, key=lambda s: s.outstanding)
                if all(s.removed for s in self.slots):
                    raise EnginesLost(f"every engine was removed after --rollout-max-engine-restarts "
                                      f"{self.max_restarts} restarts: no engine is left to sample from")
            await asyncio.sleep(0.05)

    # ---- supervision (monitor thread) ---------------------------------------------------
    def _monitor_loop(self) -> None:
        tick = min(self.interval, self.timeout) / 4
        while not self._closed.wait(tick):
            for slot in self.slots:
                try:
                    with self._lock:
                        if slot.up:
                            self._check(slot)
                except Exception:  # a monitor that dies silently would end fault tolerance: log, go on
                    log.exception("health check of engine %d failed", slot.index)
            for slot in self.slots:
                with self._lock:
                    due = not (slot.up or slot.removed or slot.restarting)
                    slot.restarting = slot.restarting or due
                if due:  # each restart on a thread of its own: the checks of the others go on
                    threading.Thread(target=self._restart_thread, args=(slot,), daemon=True).start()

    def _check(self, slot: Slot) -> None:
        """(Under the lock; nothing here blocks.) Down if the probe in flight failed with the actor's death or has been unanswered for
        longer than the timeout; otherwise start the next probe when one is due."""
        now, incarnation = time.monotonic(), slot.incarnation
        ref = self._probes.get(slot.index)
        if ref is not None:
            done, _ = ray.wait([ref], timeout=0)
            if done:
                self._probes.pop(slot.index, None)
                slot.probe_started = None
                try:
                    ray.get(ref)  # True or False (asleep): either way the actor answered
                except RayActorError as e:
                    self._on_down(slot, f"actor died: {type(e).__name__}", incarnation)
            elif now - slot.probe_started > self.timeout:
                self._on_down(slot, f"health unanswered for {now - slot.probe_started:.1f} s", incarnation)
        elif now - slot.last_probe >= self.interval:
            self._probes[slot.index] = slot.proc.health.remote()
            slot.probe_started = slot.last_probe = now

    def _on_down(self, slot: Slot, reason: str, incarnation: int) -> None:
        """Take the engine out, cut off its in-flight calls (they are re-issued), kill its actor."""
        with self._lock:
            if not slot.up or slot.incarnation != incarnation:
                return  # already handled (the monitor and a failed call may both see one death)
            slot.up, slot.incarnation, slot.probe_started = False, slot.incarnation + 1, None
            self._probes.pop(slot.index, None)
            waiters, slot.down_waiters = slot.down_waiters, []
            self.events.append({"time": time.time(), "slot": slot.index, "pid": int(slot.url), "event": "down",
                                "reason": reason})
        log.warning("engine %d (pid %s) is down (%s); %d calls in flight will be re-issued; restarting it",
                    slot.index, slot.url, reason, len(waiters))
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_settle, fut)
            except RuntimeError:  # that loop has closed
                pass
        ray.kill(slot.proc)  # SIGKILL from the raylet if it does not exit: a stopped process cannot

    def _restart(self, slot: Slot) -> None:
        if not self._take_restart(slot):
            return
        t0 = time.monotonic()
        actor = self.make(slot.index)
        try:
            pid = ray.get(actor.pid.remote(), timeout=STARTUP_TIMEOUT)
            while True:  # the newest weights; again if a sync landed while these were loading
                with self._lock:
                    ref, version = self.weights_ref, self.version
                if ref is not None:
                    ray.get(actor.update_weights.remote(ref, version, False), timeout=STARTUP_TIMEOUT)
                with self._lock:
                    if self.version == version or self._closed.is_set():
                        slot.proc, slot.url, slot.up = actor, str(pid), True
                        self.actors[slot.index] = actor
                        slot.probe_started, slot.last_probe = None, time.monotonic()
                        self.events.append({"time": time.time(), "slot": slot.index, "pid": pid,
                                            "event": "restarted", "reason": f"weights v{version}"})
                        break
        except (RayActorError, GetTimeoutError) as e:
            ray.kill(actor)
            log.error("engine %d failed to restart: %r", slot.index, e)
            return  # still down: the monitor tries again (and counts it)
        log.warning("engine %d restarted as pid %d with weights v%d in %.1f s (restart %d of at most %d)",
                    slot.index, pid, version, time.monotonic() - t0, slot.restarts, self.max_restarts)


_DOWN = object()  # the result of a call on an engine that is down
