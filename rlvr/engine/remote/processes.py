"""``ServeProcesses``: the supervisor's transport for ``rlvr serve`` subprocesses on 127.0.0.1.

Local mode's engines when ``--rollout-num-engines`` > 1 or ``--use-fault-tolerance``
(``rlvr.runtime.build.build_engine``): each engine is a ``python -m rlvr.entrypoints.cli serve`` process on a free port
(the worktree's code: the process inherits this one's working directory and environment), its
output in ``log_dir/engine<i>.log``. A request is one ``/generate`` POST in SGLang's wire format
(``rlvr.engine.remote.sglang_http``); health is ``/health``; weights are written once as
a safetensors directory and loaded by each engine with ``/update_weights_from_disk``. The policy
(balance, health checks, restarts, re-issue) is ``rlvr.engine.remote.supervisor.EngineSupervisor``'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import aiohttp
import torch
from safetensors.torch import save_file

from rlvr.core.net import free_port
from rlvr.engine.base import GenerateRequest, GenerateResult
from rlvr.engine.remote.sglang_http import health as _health
from rlvr.engine.remote.sglang_http import post as _post
from rlvr.engine.remote.sglang_http import post_generate
from rlvr.engine.remote.supervisor import STARTUP_TIMEOUT, EngineDown

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeProcess:
    """One running ``rlvr serve`` process (a handle of ``ServeProcesses``)."""

    proc: subprocess.Popen
    url: str


class ServeProcesses:
    """``Transport`` over ``rlvr serve`` processes of ``checkpoint``; engine ``i``'s ``r``-th
    incarnation samples with seed ``seed + 1009 i + 7919 r`` (distinct streams, reproducible)."""

    batched = False  # one request per POST: a prompt group's requests spread over the engines

    def __init__(self, checkpoint: str | Path, *, seed: int = 0, max_running_requests: int = 256,
                 log_dir: str | Path | None = None, request_timeout: float = 600.0, routed_experts_top_k: int = 0,
                 deterministic: bool = False):
        self.checkpoint, self.seed, self.max_running_requests = str(checkpoint), seed, max_running_requests
        self.deterministic = deterministic  # --deterministic-mode: each server decodes batch-invariantly
        self.routed_experts_top_k = routed_experts_top_k  # R3: servers record, requests ask for the routing
        self.request_timeout = request_timeout
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="rlvr-engines-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.weights_dir = Path(tempfile.mkdtemp(prefix="rlvr-weights-"))
        self._staged: list[Path] = []
        self._closed = threading.Event()

    def launch(self, index: int, restarts: int) -> ServeProcess:
        port = free_port()
        seed = self.seed + 1009 * index + 7919 * restarts
        cmd = [sys.executable, "-m", "rlvr", "serve", "--hf-checkpoint", self.checkpoint, "--port", str(port),
               "--seed", str(seed), "--max-running-requests", str(self.max_running_requests)]
        if self.routed_experts_top_k:
            cmd.append("--enable-return-routed-experts")
        if self.deterministic:
            cmd.append("--deterministic-mode")
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("RLVR_ENGINE_THREADS", "1"))
        with open(self.log_dir / f"engine{index}.log", "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return ServeProcess(proc, f"http://127.0.0.1:{port}")

    def wait_ready(self, handle: ServeProcess, index: int) -> int:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline and not self._closed.is_set():
            if handle.proc.poll() is not None:
                raise RuntimeError(f"engine {index} exited with {handle.proc.returncode} at start; "
                                   f"see {self.log_dir / f'engine{index}.log'}")
            if _health(handle.url, 1.0):
                return handle.proc.pid
            time.sleep(0.1)
        raise RuntimeError(f"engine {index} did not answer /health within {STARTUP_TIMEOUT:.0f} s (or closed)")

    def exit_code(self, handle: ServeProcess) -> int | None:
        return handle.proc.poll()

    def probe(self, handle: ServeProcess, timeout: float) -> Future:
        """``/health`` on a thread of its own (a hung server holds it until ``timeout``)."""
        future: Future = Future()

        def run() -> None:
            if _health(handle.url, timeout):
                future.set_result(True)
            else:
                future.set_exception(EngineDown(f"{handle.url}/health refused or failed"))

        threading.Thread(target=run, name="rlvr-engine-probe", daemon=True).start()
        return future

    def kill(self, handle: ServeProcess, graceful: bool = False) -> None:
        """SIGKILL (a hung or stopped process ignores anything else); SIGINT first when closing."""
        proc = handle.proc
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

    def stage_weights(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                      version: int) -> Path:
        """One safetensors directory per version; the two newest are kept (a restart may be loading
        the previous one while this one is written)."""
        items = weights.items() if isinstance(weights, Mapping) else weights
        path = self.weights_dir / f"v{version}"
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().to("cpu").contiguous() for k, v in items}, str(path / "model.safetensors"))
        self._staged = [p for p in self._staged if p != path] + [path]
        for old in self._staged[:-2]:
            shutil.rmtree(old, ignore_errors=True)
        self._staged = self._staged[-2:]
        return path

    def push_weights(self, handle: ServeProcess, payload: Path, version: int) -> None:
        try:
            out = _post(handle.url, "/update_weights_from_disk", {"model_path": str(payload), "weight_version": version},
                        timeout=self.request_timeout)
        except OSError as e:
            raise EngineDown(f"{handle.url}/update_weights_from_disk: {e!r}") from e
        if not out.get("success"):
            raise EngineDown(f"{handle.url}/update_weights_from_disk: {out.get('message')}")

    async def send(self, handle: ServeProcess, requests: list[GenerateRequest]) -> list[GenerateResult]:
        """The server's answers; an HTTP 400 (a bad request: no retry helps) is an ``error`` result;
        anything that says the engine is in trouble raises ``EngineDown``."""
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                results = [await post_generate(session, handle.url, req, req.rid, self.routed_experts_top_k)
                           for req in requests]
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise EngineDown(f"{handle.url}: {e!r}") from e
        for r in results:
            if r.finish_reason == "error":
                log.error("engine %s refused request %s: %s", handle.url, r.rid, r.meta.get("error"))
        return results

    def abort(self, handle: ServeProcess, rid: str | None) -> None:
        try:
            _post(handle.url, "/abort_request", {"abort_all": True} if rid is None else {"rid": rid}, timeout=5.0)
        except OSError as e:  # a dying engine: its requests are re-issued, and see the abort then
            raise EngineDown(f"{handle.url}/abort_request: {e!r}") from e

    def close(self) -> None:
        self._closed.set()
        shutil.rmtree(self.weights_dir, ignore_errors=True)
