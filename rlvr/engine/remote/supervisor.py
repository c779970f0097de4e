"""The engine supervisor: engines that outlive their engines dying, over any transport.

``EngineSupervisor`` is an ``Engine`` (``rlvr.engine.base``) over N engines it launches through a
``Transport`` -- how one kind of engine is started, probed, killed, fed weights and sent work.
There are two: ``rlvr.engine.remote.processes.ServeProcesses`` (``rlvr serve`` subprocesses on 127.0.0.1,
over SGLang's HTTP protocol: local mode with ``--rollout-num-engines`` > 1 or
``--use-fault-tolerance``) and ``rlvr.distributed.engines.RayActors`` (embedded-engine
actors under ``--ray --use-fault-tolerance``). The policy below is written once, here, for both.

Calls go to the live engine with the fewest outstanding requests among those the failure policy
allows (``rlvr.engine.remote.failures``: a call is retried elsewhere, an engine that failed a call is
avoided until it answers a probe or ``--rollout-health-check-timeout`` has passed, a call is given
up after enough attempts for every engine to use all its restarts -- the policy
``rlvr.engine.remote.client.HttpEngine`` follows too), the turns of one session
(multi-turn sample) to one engine while it is up (``rlvr.engine.remote.balance``). A
transport either sends each request on its own (``batched = False``: HTTP, where a prompt group's
requests spread over the engines) or a whole prompt group in one call (``batched = True``: an
engine actor prefills the group's prompt once).

Fault tolerance (slime's ``--use-fault-tolerance``): a monitor thread checks each
engine every ``min(interval, timeout) / 4`` seconds and probes it every
``--rollout-health-check-interval`` seconds. An engine is *down* when its process has exited, or
a probe has gone unanswered for ``--rollout-health-check-timeout`` seconds (hung: SIGSTOPped,
deadlocked), or a probe failed, or a call to it failed in the transport (``EngineDown``: refused
or dropped connection, HTTP 5xx, an actor that died; a failure that does not prove the engine
dead makes the monitor probe it at once). A hung engine is detected within interval + timeout.
A down engine is:

1. taken out of the balance; its in-flight calls are cut off and *re-issued* from their prompts
   to another engine (or to this one once it is back). A call's result is taken from exactly one
   attempt -- one that returned while its engine was up -- so no sample is lost or delivered
   twice; its tokens carry the weight version of the engine that answered.
2. killed (SIGKILL or ``ray.kill``: a hung process does not exit on its own) and restarted by the
   transport on a thread of its own (the monitor goes on checking the others); the newest weights
   pushed so far are loaded into it -- again if a push lands while it loads -- before it takes work.
3. removed for good once it has been restarted ``--rollout-max-engine-restarts`` times; the run
   goes on with the others, and fails with ``EnginesLost`` when none is left.

The monitor survives its own errors: an exception while checking one engine (a transport bug,
an injected ``rlvr.core.testing.fault_point("engine-monitor")``) is logged and the next check goes on.
Without fault tolerance (several local engines only) a down engine is removed, not restarted.
``stats()`` feeds ``rollout/engine_restarts``, ``rollout/engine_reissued_requests`` and
``rollout/engines_up`` into every rollout's metrics; ``events`` records every down / restarted /
removed with time, slot, pid and reason, and each is logged at WARNING.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from rlvr.engine.remote.balance import Affinity
from rlvr.engine.base import Engine, GenerateRequest, GenerateResult
from rlvr.engine.remote.failures import FailurePolicy, error_results
from rlvr.config.engine import EngineConfig
from rlvr.core.testing import fault_point

log = logging.getLogger(__name__)


class EngineDown(Exception):
    """A transport's word that a call failed because of its engine, not the request (refused or
    dropped connection, HTTP 5xx, an actor that died). ``dead``: the engine is certainly gone, so
    it is taken down at once; otherwise it is probed now and the monitor decides."""

    def __init__(self, reason: str, dead: bool = False):
        super().__init__(reason)
        self.reason, self.dead = reason, dead


class EnginesLost(RuntimeError):
    """Every engine was removed after --rollout-max-engine-restarts restarts."""


class Probe(Protocol):
    """A health probe in flight (``concurrent.futures.Future`` has this shape)."""

    def done(self) -> bool: ...

    def result(self) -> Any:
        """Returns once the engine answered (asleep counts as an answer); raises when it failed."""
        ...


class Transport(Protocol):
    """How the supervisor reaches one kind of engine. A *handle* names one running incarnation of
    an engine (a process, an actor); every method but ``launch`` and ``close`` takes one."""

    batched: bool  # True: one send carries a whole prompt group; False: one request

    def launch(self, index: int, restarts: int) -> Any:
        """Start engine ``index`` (its ``restarts``-th replacement); may return before it is ready."""
        ...

    def wait_ready(self, handle: Any, index: int) -> int:
        """Block until the engine answers; its process id. Raises when it cannot come up."""
        ...

    def exit_code(self, handle: Any) -> int | None:
        """The process's exit status once it has ended; None while it runs or when unknowable."""
        ...

    def probe(self, handle: Any, timeout: float) -> Probe:
        """Start one health probe (answered within ``timeout`` or failed)."""
        ...

    def kill(self, handle: Any, graceful: bool = False) -> None:
        """Stop the engine for sure (SIGKILL: a stopped process ignores anything else)."""
        ...

    def stage_weights(self, weights: Any, version: int) -> Any:
        """Make ``weights`` ready to push (written once for all engines); the payload to push."""
        ...

    def push_weights(self, handle: Any, payload: Any, version: int, **kwargs) -> Any:
        """Load staged weights into one engine; raises ``EngineDown`` when it failed to."""
        ...

    async def send(self, handle: Any, requests: list[GenerateRequest]) -> list[GenerateResult]:
        """Sample ``requests`` on one engine; raises ``EngineDown`` when the engine failed them."""
        ...

    def abort(self, handle: Any, rid: str | None) -> None:
        """Abort one engine's requests (or the one with ``rid``); raises ``EngineDown``."""
        ...

    def close(self) -> None: ...


@dataclass
class Slot:
    """One engine position: its current incarnation (``handle``, ``pid``) and its history."""

    index: int
    handle: Any = None
    pid: int | None = None
    up: bool = False
    removed: bool = False
    restarting: bool = False  # a restart thread is bringing it back
    restarts: int = 0
    incarnation: int = 0
    outstanding: int = 0
    probe: Probe | None = None  # the probe in flight
    probe_started: float = 0.0  # monotonic time the probe in flight started
    last_probe: float = 0.0
    down_waiters: list = field(default_factory=list)  # (loop, future) of attempts to cut off when it goes down


DOWN = object()  # ``on_live``'s result for an engine that is (or went) down
STARTUP_TIMEOUT = 180.0  # seconds an engine may take to come up (torch import on a busy CPU)


class EngineSupervisor(Engine):
    """``Engine`` over supervised engines reached through ``transport``; see the module docstring.
    ``settings`` is the ``engine`` config group; ``num_engines`` defaults to its ``--rollout-num-engines``."""

    def __init__(self, transport: Transport, settings: EngineConfig, num_engines: int | None = None):
        self.transport, self.fault_tolerance = transport, settings.use_fault_tolerance
        self.interval, self.timeout = settings.rollout_health_check_interval, settings.rollout_health_check_timeout
        self.max_restarts = settings.rollout_max_engine_restarts
        self.slots = [Slot(i) for i in range(num_engines or settings.rollout_num_engines)]
        # engines are (slot, incarnation): a restarted engine is a new one, untried and not avoided
        n = len(self.slots)
        self.policy = FailurePolicy(attempts=self.max_restarts * n + n + 1, avoid_for=self.timeout)
        self.restarts = 0  # engine restarts so far (all slots)
        self.reissued = 0  # requests re-issued after their engine went down
        self.events: list[dict] = []  # every down / restarted / removed, for tests and logs
        self._lock = threading.RLock()
        self._version = 0
        self._weights: Any = None  # the newest staged weights, loaded into a restarted engine
        self._abort_epoch = 0  # calls submitted before the last abort() come back aborted when re-issued
        self._aborted_rids: set[str] = set()
        self._closed = threading.Event()
        self._pool = ThreadPoolExecutor(len(self.slots), thread_name_prefix="rlvr-engine-call")
        self.affinity = Affinity()  # session -> slot index
        handles = [transport.launch(slot.index, 0) for slot in self.slots]  # all start at once, then each is awaited
        try:
            for slot, handle in zip(self.slots, handles):
                slot.pid = transport.wait_ready(handle, slot.index)
                slot.handle, slot.up, slot.last_probe = handle, True, time.monotonic()
        except BaseException:
            for handle in handles:
                transport.kill(handle)
            transport.close()
            self._pool.shutdown(wait=False)
            raise
        atexit.register(self.close)
        self._monitor = threading.Thread(target=self._monitor_loop, name="rlvr-engine-monitor", daemon=True)
        if self.fault_tolerance or len(self.slots) > 1:
            self._monitor.start()
        log.info("engines up: pids %s", [s.pid for s in self.slots])

    # ---- Engine protocol ----------------------------------------------------------------
    async def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        """One result per request, in order; each call re-issued until an engine that is still up answers it.
        A call re-issued after ``abort()`` (or holding a request aborted by rid) comes back aborted."""
        if not requests:
            return []
        epoch = self._abort_epoch
        if self.transport.batched:
            return await self._call(requests, epoch)
        parts = await asyncio.gather(*(self._call([r], epoch) for r in requests))
        return [r for part in parts for r in part]

    def update_weights(self, weights: Any, version: int, **kwargs) -> list:
        """Stage the weights once and load them into every live engine (``kwargs`` go to the
        transport); an engine that fails to load them is taken down (and restarted with them).
        Returns what each engine that loaded them answered."""
        payload = self.transport.stage_weights(weights, version)
        with self._lock:
            self._weights, self._version = payload, version
        out = self.on_live(lambda _, h: self.transport.push_weights(h, payload, version, **kwargs), "weight update",
                           down_on_failure=True)
        return [r for r in out if r is not DOWN]

    def abort(self, rid: str | None = None) -> None:
        with self._lock:
            if rid is None:
                self._abort_epoch += 1
            else:
                self._aborted_rids.add(rid)
        self.on_live(lambda _, h: self.transport.abort(h, rid), "abort")

    def health(self) -> bool:
        return any(s.up for s in self.slots)

    def stats(self) -> dict[str, float]:
        """Cumulative counters for the rollout's metrics."""
        with self._lock:
            return {"rollout/engine_restarts": float(self.restarts),
                    "rollout/engine_reissued_requests": float(self.reissued),
                    "rollout/engines_up": float(sum(s.up for s in self.slots))}

    def close(self) -> None:
        if self._closed.is_set():
            return
        with self._lock:  # a restart in progress sees the flag before it installs its engine
            self._closed.set()
        for slot in self.slots:
            if slot.handle is not None:
                try:
                    self.transport.kill(slot.handle, graceful=True)
                except Exception:  # already gone with its node or cluster: nothing left to stop
                    log.debug("closing engine %d failed", slot.index, exc_info=True)
        self.transport.close()
        self._pool.shutdown(wait=False)

    # ---- for engine groups built on this one (the Ray side) --------------------------------
    def on_live(self, fn: Callable[[int, Any], Any], what: str, down_on_failure: bool = False) -> list:
        """``fn(index, handle)`` on every live engine at once; ``DOWN`` for an engine that is (or went)
        down. An engine whose call raises ``EngineDown`` is taken down if ``down_on_failure`` or
        it is certainly dead, else probed now."""
        with self._lock:
            if self._closed.is_set():
                return [DOWN for _ in self.slots]
            calls = [(s, s.incarnation, self._pool.submit(fn, s.index, s.handle) if s.up else None) for s in self.slots]
        out = []
        for slot, incarnation, future in calls:
            try:
                out.append(DOWN if future is None else future.result())
            except EngineDown as e:
                log.warning("engine %d: %s failed: %s", slot.index, what, e.reason)
                self._suspect(slot, incarnation, EngineDown(f"{what} failed: {e.reason}", e.dead or down_on_failure))
                out.append(DOWN)
        return out

    def replace(self, i: int) -> None:
        """Take engine ``i`` down now (as if it had died) and wait for its replacement."""
        slot = self.slots[i]
        self._on_down(slot, "restart requested", slot.incarnation)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not (slot.up or slot.removed) and time.monotonic() < deadline:
            time.sleep(0.05)

    # ---- calls ----------------------------------------------------------------------------
    async def _call(self, requests: list[GenerateRequest], epoch: int) -> list[GenerateResult]:
        """One call (a request, or a prompt group), re-issued until an engine that is up answers it."""
        loop, errors, tried = asyncio.get_running_loop(), [], set()
        for attempt in range(self.policy.attempts):
            if self._abort_epoch != epoch or any(q.rid in self._aborted_rids for q in requests):
                return [GenerateResult(q.rid, [], [], "abort", self._version) for q in requests]
            slot = await self._pick(requests[0].session, tried)
            if slot is None:  # closed
                break
            down = loop.create_future()
            with self._lock:
                if not slot.up:  # went down since it was picked
                    continue
                incarnation, handle = slot.incarnation, slot.handle
                slot.outstanding += len(requests)
                slot.down_waiters.append((loop, down))
            call = asyncio.ensure_future(self.transport.send(handle, requests))
            try:
                await asyncio.wait({call, down}, return_when=asyncio.FIRST_COMPLETED)
                if not down.done():
                    try:
                        out = call.result()  # any other exception is the engine's own: it stops the run
                        self.policy.answered((slot.index, incarnation))
                        return out
                    except EngineDown as e:
                        reason = e.reason
                        self._suspect(slot, incarnation, e)
                else:  # cut off with its engine: whatever it might still return is not taken
                    reason = "engine went down"
                    call.cancel()
                    await asyncio.gather(call, return_exceptions=True)
            finally:
                with self._lock:
                    slot.outstanding -= len(requests)
                    if (loop, down) in slot.down_waiters:
                        slot.down_waiters.remove((loop, down))
            errors.append(f"engine {slot.index}: {reason}")
            tried.add((slot.index, incarnation))
            self.policy.failed((slot.index, incarnation))
            with self._lock:
                self.reissued += len(requests)
            log.warning("%d requests (%s...) lost with engine %d (%s); re-issuing them (attempt %d)",
                        len(requests), requests[0].rid, slot.index, reason, attempt + 2)
            await asyncio.sleep(0.05)
        log.error("requests %s... failed on every engine: %s", requests[0].rid, errors)
        return error_results(requests, errors or ["the engines were closed"], self._version)

    async def _pick(self, session: str = "", tried: frozenset | set = frozenset()) -> Slot | None:
        """Among the live engines the failure policy allows a call that already tried ``tried``,
        the session's engine, else the one with the fewest outstanding requests; waits while there
        is none (all restarting, or all avoided); None once closed; ``EnginesLost`` once every
        engine is removed."""
        while True:
            with self._lock:
                live = [(s.index, s.incarnation) for s in self.slots if s.up]
                allowed = [index for index, _ in self.policy.choices(live, tried)]
                i = self.affinity.pick(session, allowed, lambda i: self.slots[i].outstanding)
                if i is not None:
                    return self.slots[i]
                if self._closed.is_set():
                    return None
                if all(s.removed for s in self.slots):
                    raise EnginesLost(f"every engine was removed after --rollout-max-engine-restarts "
                                      f"{self.max_restarts} restarts: no engine is left to sample from")
            await asyncio.sleep(0.05)

    # ---- supervision (monitor thread) ---------------------------------------------------
    def _monitor_loop(self) -> None:
        tick = min(self.interval, self.timeout) / 4
        while not self._closed.wait(tick):
            for slot in self.slots:
                for step in (self._check, self._restart_if_due):
                    try:
                        step(slot)
                    except Exception:  # a monitor that dies silently would end fault tolerance: log, go on
                        log.exception("engine %d: %s raised; the monitor goes on", slot.index, step.__name__)

    def _check(self, slot: Slot) -> None:
        """Down if its process exited, its probe failed or has been unanswered for longer than the
        timeout; otherwise start the next probe when one is due."""
        fault_point("engine-monitor")
        with self._lock:
            if not slot.up:
                return
            now, incarnation, reason = time.monotonic(), slot.incarnation, None
            if (code := self.transport.exit_code(slot.handle)) is not None:
                reason = f"process exited with {code}"
            elif slot.probe is not None and slot.probe.done():
                try:
                    slot.probe.result()
                    slot.probe = None
                    self.policy.answered((slot.index, slot.incarnation))
                except Exception as e:
                    reason = f"health probe failed: {e}"
            elif slot.probe is not None and now - slot.probe_started > self.timeout:
                reason = f"health probe unanswered for {now - slot.probe_started:.1f} s"
            elif slot.probe is None and now - slot.last_probe >= self.interval:
                slot.probe = self.transport.probe(slot.handle, self.timeout + 1.0)
                slot.probe_started = slot.last_probe = now
        if reason is not None:
            self._on_down(slot, reason, incarnation)

    def _suspect(self, slot: Slot, incarnation: int, e: EngineDown) -> None:
        """A call failed in the transport: down at once if the engine is certainly dead (so no other
        call is sent there meanwhile), else probe it at the next check (the monitor decides)."""
        with self._lock:
            if slot.incarnation != incarnation or not slot.up:
                return
            code = self.transport.exit_code(slot.handle)
            dead = e.dead or code is not None
            if not dead and slot.probe is None:
                slot.last_probe = 0.0
        if dead:
            self._on_down(slot, e.reason if code is None else f"process exited with {code} ({e.reason})", incarnation)

    def _on_down(self, slot: Slot, reason: str, incarnation: int) -> None:
        """Take the engine out, cut off its in-flight calls (they are re-issued), kill it."""
        with self._lock:
            if not slot.up or slot.incarnation != incarnation:
                return  # already handled (the monitor and a failed call may both see one death)
            slot.up, slot.incarnation, slot.probe = False, slot.incarnation + 1, None
            slot.removed = slot.removed or not self.fault_tolerance
            waiters, slot.down_waiters = slot.down_waiters, []
            self.events.append({"time": time.time(), "slot": slot.index, "pid": slot.pid, "event": "down",
                                "reason": reason})
        log.warning("engine %d (pid %s) is down: %s; %d calls in flight will be re-issued",
                    slot.index, slot.pid, reason, len(waiters))
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_settle, fut)
            except RuntimeError:  # that loop has closed
                pass
        self.transport.kill(slot.handle)

    def _restart_if_due(self, slot: Slot) -> None:
        with self._lock:
            due = self.fault_tolerance and not (slot.up or slot.removed or slot.restarting or self._closed.is_set())
            slot.restarting = slot.restarting or due
        if due:  # on a thread of its own: the checks of the others go on
            threading.Thread(target=self._restart_thread, args=(slot,), daemon=True).start()

    def _restart_thread(self, slot: Slot) -> None:
        try:
            self._restart(slot)
        except Exception as e:  # still down: the monitor tries again (and counts it)
            if not self._closed.is_set():
                log.error("engine %d failed to restart: %r", slot.index, e)
        finally:
            with self._lock:
                slot.restarting = False

    def _take_restart(self, slot: Slot) -> bool:
        """Count one more restart of ``slot``; False (and the slot removed for good) once it has
        used its ``--rollout-max-engine-restarts``."""
        with self._lock:
            if slot.restarts >= self.max_restarts:
                slot.removed = True
                self.events.append({"time": time.time(), "slot": slot.index, "pid": None, "event": "removed",
                                    "reason": f"restarted {slot.restarts} times"})
                left = sum(not s.removed for s in self.slots)
            else:
                slot.restarts += 1
                self.restarts += 1
                return True
        log.error("engine %d keeps dying (restarted %d times, --rollout-max-engine-restarts): removed; %d left",
                  slot.index, slot.restarts, left)
        return False

    def _restart(self, slot: Slot) -> None:
        """A new incarnation of ``slot`` with the newest weights, installed unless closed meanwhile."""
        if not self._take_restart(slot):
            return
        t0, handle = time.monotonic(), None
        try:
            handle = self.transport.launch(slot.index, slot.restarts)
            pid = self.transport.wait_ready(handle, slot.index)
            while True:  # the newest weights; again if a push landed while these were loading
                with self._lock:
                    payload, version = self._weights, self._version
                if payload is not None:
                    try:
                        self.transport.push_weights(handle, payload, version)
                    except EngineDown:
                        if self._version == version:
                            raise
                        continue  # those weights were replaced meanwhile: push the newer ones
                with self._lock:
                    if self._closed.is_set():  # it must not outlive the run
                        raise RuntimeError("closed while it was starting")
                    if self._version == version:
                        slot.handle, slot.pid, slot.up = handle, pid, True
                        slot.probe, slot.last_probe = None, time.monotonic()
                        self.events.append({"time": time.time(), "slot": slot.index, "pid": pid,
                                            "event": "restarted", "reason": f"weights v{version}"})
                        break
        except BaseException:
            if handle is not None:
                self.transport.kill(handle)
            raise
        log.warning("engine %d restarted as pid %d with weights v%d in %.1f s (restart %d of at most %d)",
                    slot.index, pid, version, time.monotonic() - t0, slot.restarts, self.max_restarts)


def _settle(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
