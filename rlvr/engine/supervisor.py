"""Engine processes that outlive their engines dying: launch, health-check, restart, re-issue.

``EngineSupervisor`` is an ``Engine`` (``rlvr.engine.base``) over ``--rollout-num-engines``
``rlvr serve`` subprocesses it launches on 127.0.0.1. Local mode uses it instead of the embedded
engine when there is more than one engine or with ``--use-fault-tolerance``.

Requests go to the live engine with the fewest outstanding (least-outstanding balance), as in
``HttpEngine``; the wire format is SGLang's (``client.sglang_payload`` / ``parse_output``).

Fault tolerance (slime's ``--use-fault-tolerance``, seed 000 §2.3): a monitor thread probes each
engine's ``/health`` every ``--rollout-health-check-interval`` seconds. An engine is *down* when
its process has exited, or a probe has gone unanswered for ``--rollout-health-check-timeout``
seconds (hung: e.g. SIGSTOPped, or deadlocked), or a request to it failed at the connection.
A hung engine is detected within interval + timeout of the moment it stopped answering. A down engine is:
1. taken out of the balance; the requests it had in flight are cancelled on the client side and
   *re-issued* from their prompt to another engine (or to this one once it is back). A request's
   result is taken from exactly one attempt -- the one that finished on a live engine -- so no
   sample is lost or delivered twice; its tokens carry the version of the engine that answered.
2. SIGKILLed (a hung process does not exit on its own) and restarted on a fresh port; the newest
   weights pushed so far are loaded into it before it takes requests.
3. removed for good once it has been restarted ``--rollout-max-engine-restarts`` times; the run goes
   on with the others, and fails loudly when none is left.
``stats()`` feeds ``rollout/engine_restarts``, ``rollout/engine_reissued_requests``,
``rollout/engines_up`` into every rollout's metrics; each event is logged with the pid and reason.

Seam for Ray: the restart policy (``_check``, ``_on_down``, ``_restart``) and the re-issue logic
(``_one``, ``_pick``) only use the transport methods ``_launch``, ``_wait_ready``, ``_exit_code``,
``_probe_once``, ``_kill``, ``_push_weights`` and ``_post_generate``; a subclass for engine actors
overrides those (a ``Slot``'s ``proc``/``url`` then hold the actor handle and its name) and keeps
the rest. Each restart runs on a thread of its own, so the monitor keeps checking the other engines.
(The Ray side, ``rlvr/distributed/engine_faults.py``, keeps this policy and ``Slot`` but not the
class: an engine actor takes a whole prompt group per call and its weights from the object store.)
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import aiohttp
import torch
from safetensors.torch import save_file

from rlvr.engine.base import GenerateRequest, GenerateResult
from rlvr.engine.client import parse_output, sglang_payload

log = logging.getLogger(__name__)

STARTUP_TIMEOUT = 180.0  # seconds an `rlvr serve` process may take to answer /health (torch import on a busy CPU)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Slot:
    """One engine position: its current process (incarnation) and its history."""

    index: int
    proc: subprocess.Popen | None = None
    url: str = ""
    up: bool = False
    removed: bool = False
    restarting: bool = False  # a restart thread is bringing it back
    restarts: int = 0
    incarnation: int = 0
    outstanding: int = 0
    probe_started: float | None = None  # monotonic time of the probe in flight, None when none is
    last_probe: float = 0.0
    down_waiters: list = field(default_factory=list)  # (loop, future) of attempts to cancel when it goes down


class RestartPolicy:
    """The restart bookkeeping both supervised engine groups share (this module's
    ``EngineSupervisor`` and the Ray side's ``TolerantEngineGroup``): the restart budget, the
    restart thread and the counters. The host class sets ``slots``, ``_lock`` (an RLock),
    ``max_restarts``, ``restarts``, ``reissued``, ``events`` and defines ``_restart(slot)``."""

    def stats(self) -> dict[str, float]:
        """Cumulative counters for the rollout's metrics."""
        with self._lock:
            return {"rollout/engine_restarts": float(self.restarts),
                    "rollout/engine_reissued_requests": float(self.reissued),
                    "rollout/engines_up": float(sum(s.up for s in self.slots))}

    def _restart_thread(self, slot: Slot) -> None:
        try:
            self._restart(slot)
        finally:
            with self._lock:
                slot.restarting = False

    def _take_restart(self, slot: Slot) -> bool:
        """Count one more restart of ``slot``; False (and the slot removed for good) once it has
        used its ``--rollout-max-engine-restarts``."""
        if slot.restarts >= self.max_restarts:
            slot.removed = True
            self.events.append({"time": time.time(), "slot": slot.index, "pid": None, "event": "removed",
                                "reason": f"restarted {slot.restarts} times"})
            log.error("engine %d keeps dying (restarted %d times, --rollout-max-engine-restarts): removed; %d left",
                      slot.index, slot.restarts, sum(not s.removed for s in self.slots))
            return False
        slot.restarts += 1
        with self._lock:
            self.restarts += 1
        return True


class EngineSupervisor(RestartPolicy):
    """``Engine`` over supervised ``rlvr serve`` processes; see the module docstring."""

    def __init__(self, checkpoint: str, num_engines: int = 1, *, fault_tolerance: bool = True,
                 health_check_interval: float = 5.0, health_check_timeout: float = 10.0, max_restarts: int = 3,
                 seed: int = 0, max_running_requests: int = 256, log_dir: str | Path | None = None,
                 request_timeout: float = 600.0):
        self.checkpoint, self.seed, self.max_running_requests = str(checkpoint), seed, max_running_requests
        self.fault_tolerance, self.max_restarts = fault_tolerance, max_restarts
        self.interval, self.timeout, self.request_timeout = health_check_interval, health_check_timeout, request_timeout
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="rlvr-engines-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.weights_dir = Path(tempfile.mkdtemp(prefix="rlvr-weights-"))
        self.slots = [Slot(i) for i in range(num_engines)]
        self.restarts = 0  # engine restarts so far (all slots)
        self.reissued = 0  # requests re-issued after their engine went down
        self.events: list[dict] = []  # (time, slot, pid, what) of every down/restart/removal, for tests and logs
        self._lock = threading.RLock()
        self._version = 0
        self._latest: Path | None = None  # newest pushed weights, loaded into a restarted engine
        self._abort_epoch = 0  # requests submitted before the last abort() come back aborted
        self._aborted_rids: set[str] = set()
        self._closed = threading.Event()
        procs = [self._launch(slot) for slot in self.slots]  # all start at once, then each is awaited
        try:
            for slot, (proc, url) in zip(self.slots, procs):
                self._wait_ready(proc, url, slot)
                slot.proc, slot.url, slot.up = proc, url, True
                slot.last_probe = time.monotonic()
        except RuntimeError:
            for proc, _ in procs:
                self._kill(proc)
            raise
        atexit.register(self.close)
        self._monitor = threading.Thread(target=self._monitor_loop, name="rlvr-engine-monitor", daemon=True)
        if fault_tolerance or num_engines > 1:
            self._monitor.start()
        log.info("engines up: %s", ", ".join(f"{s.url} (pid {s.proc.pid})" for s in self.slots))

    # ---- Engine protocol ----------------------------------------------------------------
    @property
    def weight_version(self) -> int:
        return self._version

    async def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        if not requests:
            return []
        epoch = self._abort_epoch
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
            return list(await asyncio.gather(*(self._one(session, r, epoch) for r in requests)))

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                       version: int) -> None:
        """Write the weights once (safetensors) and load them into every live engine; an engine
        that fails to load them is treated as down (restarted with these weights)."""
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        path = self.weights_dir / f"v{version}"
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().to("cpu").contiguous() for k, v in items}, str(path / "model.safetensors"))
        with self._lock:
            previous, self._latest, self._version = self._latest, path, version
            live = [s for s in self.slots if s.up]
        for slot in live:
            try:
                self._push_weights(slot.url, path, version)
            except (OSError, RuntimeError) as e:
                self._on_down(slot, f"weight update failed: {e!r}")
        if previous is not None and previous != path:
            shutil.rmtree(previous, ignore_errors=True)

    def abort(self, rid: str | None = None) -> None:
        with self._lock:
            if rid is None:
                self._abort_epoch += 1
            else:
                self._aborted_rids.add(rid)
            urls = [s.url for s in self.slots if s.up]
        for url in urls:
            try:
                _post(url, "/abort_request", {"abort_all": True} if rid is None else {"rid": rid}, timeout=5.0)
            except OSError as e:  # a dying engine: its requests are re-issued, and see the abort then
                log.warning("%s/abort_request failed: %r", url, e)

    def health(self) -> bool:
        return any(s.up for s in self.slots)

    def close(self) -> None:
        if self._closed.is_set():
            return
        with self._lock:  # a restart in progress sees the flag before it installs its process
            self._closed.set()
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                self._kill(slot.proc, graceful=True)
        shutil.rmtree(self.weights_dir, ignore_errors=True)

    # ---- requests -------------------------------------------------------------------------
    async def _one(self, session: aiohttp.ClientSession, req: GenerateRequest, epoch: int) -> GenerateResult:
        """One request, re-issued until an engine that is still up answers it."""
        loop = asyncio.get_running_loop()
        errors: list[str] = []
        budget = self.max_restarts * len(self.slots) + len(self.slots) + 1  # attempts before giving up
        for attempt in range(budget):
            if self._abort_epoch != epoch or req.rid in self._aborted_rids:
                return GenerateResult(req.rid, [], [], "abort", self._version)
            slot = await self._pick()
            if slot is None:
                break
            down = loop.create_future()
            with self._lock:
                incarnation = slot.incarnation
                slot.outstanding += 1
                slot.down_waiters.append((loop, down))
            post = asyncio.ensure_future(self._post_generate(session, slot.url, req))
            try:
                await asyncio.wait({post, down}, return_when=asyncio.FIRST_COMPLETED)
                if not down.done():  # then the post is done
                    if post.exception() is None:
                        out = post.result()
                        if out is not None:
                            return parse_output(req, out)
                        return GenerateResult(req.rid, [], [], "error", self._version, {"error": f"{slot.url}: HTTP 400"})
                    reason = repr(post.exception())
                else:  # whatever this attempt returns now is not taken: it was cut off with its engine
                    reason = "engine went down"
                    post.cancel()
                    await asyncio.gather(post, return_exceptions=True)
                errors.append(f"{slot.url}: {reason}")
                if not down.done():  # the connection failed: the monitor confirms and restarts
                    self._suspect(slot, incarnation, reason)
                with self._lock:
                    self.reissued += 1
                log.warning("request %s lost with engine %d (%s); re-issuing it (attempt %d)",
                            req.rid, slot.index, reason, attempt + 2)
                await asyncio.sleep(0.05)
            finally:
                with self._lock:
                    slot.outstanding -= 1
                    if (loop, down) in slot.down_waiters:
                        slot.down_waiters.remove((loop, down))
        log.error("request %s failed on every engine: %s", req.rid, errors)
        return GenerateResult(req.rid, [], [], "error", self._version, {"error": "; ".join(errors[-5:])})

    async def _post_generate(self, session: aiohttp.ClientSession, url: str, req: GenerateRequest) -> dict | None:
        """The server's answer, None on HTTP 400 (the request is bad: no retry helps); raises on
        anything that says the engine is in trouble."""
        async with session.post(url + "/generate", json=sglang_payload(req, req.rid)) as resp:
            if resp.status == 400:
                log.error("engine %s refused request %s: %s", url, req.rid, await resp.text())
                return None
            if resp.status >= 500:
                raise ConnectionError(f"HTTP {resp.status}: {await resp.text()}")
            return await resp.json()

    async def _pick(self) -> Slot | None:
        """The live engine with the fewest outstanding requests; waits while all are restarting;
        None once every engine is removed."""
        while True:
            with self._lock:
                up = [s for s in self.slots if s.up]
                if up:
                    return min(up, key=lambda s: s.outstanding)
                if all(s.removed for s in self.slots) or self._closed.is_set():
                    return None
            await asyncio.sleep(0.05)

    # ---- supervision (monitor thread) ---------------------------------------------------
    def _monitor_loop(self) -> None:
        tick = min(self.interval, self.timeout) / 4
        while not self._closed.wait(tick):
            for slot in self.slots:
                if slot.up:
                    self._check(slot)
            for slot in self.slots:
                with self._lock:
                    due = not (slot.up or slot.removed or slot.restarting) and self.fault_tolerance
                    slot.restarting = slot.restarting or due
                if due and not self._closed.is_set():  # each restart on a thread of its own: checks go on
                    threading.Thread(target=self._restart_thread, args=(slot,), daemon=True).start()

    def _check(self, slot: Slot) -> None:
        """Down if the process exited or a probe has been unanswered for longer than the timeout;
        otherwise start the next probe when one is due."""
        now = time.monotonic()
        if (code := self._exit_code(slot.proc)) is not None:
            return self._on_down(slot, f"process exited with {code}")
        if slot.probe_started is not None and now - slot.probe_started > self.timeout:
            return self._on_down(slot, f"/health unanswered for {now - slot.probe_started:.1f} s")
        if slot.probe_started is None and now - slot.last_probe >= self.interval:
            slot.probe_started = slot.last_probe = now
            threading.Thread(target=self._probe, args=(slot, slot.incarnation), daemon=True).start()

    def _probe(self, slot: Slot, incarnation: int) -> None:
        ok = self._probe_once(slot.url, self.timeout + 1.0)
        with self._lock:
            if slot.incarnation != incarnation:
                return
            if ok:
                slot.probe_started = None
            elif slot.up:  # refused / 503: no need to wait for the timeout
                slot.probe_started = -1e9

    def _suspect(self, slot: Slot, incarnation: int, reason: str) -> None:
        """A request failed at the connection: down at once if its process has exited (so no
        other request is sent there meanwhile), else probe it now (the monitor decides)."""
        with self._lock:
            if slot.incarnation != incarnation or not slot.up:
                return
            code = self._exit_code(slot.proc)
            if code is None and slot.probe_started is None:
                slot.last_probe = 0.0
        if code is not None:
            self._on_down(slot, f"process exited with {code} ({reason})")

    def _on_down(self, slot: Slot, reason: str) -> None:
        """Take the engine out, cancel its in-flight attempts (their requests are re-issued), kill it."""
        with self._lock:
            if not slot.up:
                return
            slot.up, slot.incarnation, slot.probe_started = False, slot.incarnation + 1, None
            waiters, slot.down_waiters = slot.down_waiters, []
            pid = slot.proc.pid if slot.proc else None
            self.events.append({"time": time.time(), "slot": slot.index, "pid": pid, "event": "down", "reason": reason})
        log.warning("engine %d (pid %s, %s) is down: %s; %d requests in flight will be re-issued",
                    slot.index, pid, slot.url, reason, len(waiters))
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_settle, fut)
            except RuntimeError:  # that loop has closed
                pass
        if slot.proc is not None:
            self._kill(slot.proc)
        if not self.fault_tolerance:
            slot.removed = True

    def _restart(self, slot: Slot) -> None:
        if not self._take_restart(slot):
            return
        t0, proc = time.monotonic(), None
        try:
            proc, url = self._launch(slot)
            self._wait_ready(proc, url, slot)
            with self._lock:
                latest, version = self._latest, self._version
            if latest is not None:
                self._push_weights(url, latest, version)
        except (OSError, RuntimeError) as e:
            if proc is not None:
                self._kill(proc)
            if not self._closed.is_set():
                log.error("engine %d failed to restart: %r", slot.index, e)
            return  # still down: the monitor tries again (and counts it)
        with self._lock:
            if self._closed.is_set():  # closed while it was starting: it must not outlive the run
                self._kill(proc)
                return
            slot.proc, slot.url, slot.up = proc, url, True
            slot.probe_started, slot.last_probe = None, time.monotonic()
            self.events.append({"time": time.time(), "slot": slot.index, "pid": proc.pid, "event": "restarted",
                                "reason": f"weights v{version}"})
        log.warning("engine %d restarted as pid %d on %s with weights v%d in %.1f s (restart %d of at most %d)",
                    slot.index, proc.pid, url, version, time.monotonic() - t0, slot.restarts, self.max_restarts)

    # ---- transport: `rlvr serve` processes over HTTP ----------------------------------------
    def _launch(self, slot: Slot) -> tuple[subprocess.Popen, str]:
        port = free_port()
        seed = self.seed + 1009 * slot.index + 7919 * slot.restarts
        cmd = [sys.executable, "-m", "rlvr.cli", "serve", "--hf-checkpoint", self.checkpoint, "--port", str(port),
               "--seed", str(seed), "--max-running-requests", str(self.max_running_requests)]
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("RLVR_ENGINE_THREADS", "1"))
        out = open(self.log_dir / f"engine{slot.index}.log", "ab")
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        out.close()
        return proc, f"http://127.0.0.1:{port}"

    def _wait_ready(self, proc: subprocess.Popen, url: str, slot: Slot) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline and not self._closed.is_set():
            if proc.poll() is not None:
                raise RuntimeError(f"engine {slot.index} exited with {proc.returncode} at start; "
                                   f"see {self.log_dir / f'engine{slot.index}.log'}")
            if self._probe_once(url, 1.0):
                return
            time.sleep(0.1)
        self._kill(proc)
        raise RuntimeError(f"engine {slot.index} did not answer /health within {STARTUP_TIMEOUT:.0f} s (or closed)")

    @staticmethod
    def _exit_code(proc: subprocess.Popen) -> int | None:
        return proc.poll()

    @staticmethod
    def _probe_once(url: str, timeout: float) -> bool:
        try:
            with urllib.request.urlopen(url + "/health", timeout=timeout) as resp:
                return resp.status == 200
        except (OSError, urllib.error.URLError):
            return False

    @staticmethod
    def _kill(proc: subprocess.Popen, graceful: bool = False) -> None:
        """SIGKILL (a hung or stopped process ignores anything else); SIGINT first when closing."""
        if proc.poll() is not None:
            return
        if graceful:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(5)
                return
            except subprocess.TimeoutExpired:
                pass
        proc.kill()
        proc.wait()

    def _push_weights(self, url: str, path: Path, version: int) -> None:
        out = _post(url, "/update_weights_from_disk", {"model_path": str(path), "weight_version": version},
                    timeout=self.request_timeout)
        if not out.get("success"):
            raise RuntimeError(f"{url}/update_weights_from_disk: {out.get('message')}")


def _post(url: str, route: str, payload: dict, timeout: float) -> dict:
    request = urllib.request.Request(url + route, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        text = resp.read().decode()
    return json.loads(text) if text.startswith("{") else {}


def _settle(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)

