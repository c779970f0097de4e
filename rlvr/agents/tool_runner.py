"""Where a sync tool runs, so that a call past ``--tool-timeout`` never holds the rollout.

``asyncio.to_thread`` would put the call on the event loop's default executor, which
``asyncio.run`` joins when the rollout's loop closes: the model got its timeout error at the
timeout, but the rollout still waited for the abandoned call to return. So a sync tool runs
either

- ``in_thread`` (``--tool-executor thread``, the default): on a daemon thread of its own that no
  one joins. At the timeout the call is abandoned: its result, if it ever comes, is dropped. A
  thread cannot be killed, so it runs on until the function returns; ``abandoned_threads()``
  counts those still running, and each abandonment is logged once; or
- in a ``ProcessTools`` worker (``--tool-executor process``): one worker process per call in
  flight (spawned, reused for later calls). At the timeout the worker is killed (SIGKILL) and
  reaped, so nothing of the call survives it: the choice for tools that can hang for good. The
  function travels by reference (pickle): a module-level function of an importable module, with
  arguments and result that pickle. A worker's start and its first import of a tool's module are
  not the call's: they are waited for apart (``ProcessTools.start_timeout``, 120 s), so a tool whose
  module imports torch gets its whole ``--tool-timeout`` on its first call as on later ones.

An async tool needs neither: ``asyncio.wait_for`` cancels it at the timeout.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import multiprocessing
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger(__name__)

_abandoned = 0
_abandoned_lock = threading.Lock()


def abandoned_threads() -> int:
    """Tool threads abandoned at their timeout that are still running."""
    return _abandoned


def _settle(fut: asyncio.Future, ok: bool, value: Any) -> None:
    if not fut.done():  # not cancelled by the timeout
        fut.set_result(value) if ok else fut.set_exception(value)


async def in_thread(fn: Callable, kwargs: dict, timeout: float, name: str = "") -> Any:
    """``fn(**kwargs)`` on a daemon thread, awaited for at most ``timeout`` seconds
    (``asyncio.TimeoutError`` after that; the thread is left to finish on its own)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    call = contextvars.copy_context()
    state = {"abandoned": False}

    def work() -> None:
        global _abandoned
        try:
            ok, value = True, call.run(fn, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            ok, value = False, e
        with _abandoned_lock:
            if state["abandoned"]:
                _abandoned -= 1
                return
        try:
            loop.call_soon_threadsafe(_settle, fut, ok, value)
        except RuntimeError:  # the loop closed meanwhile: nobody waits for the result
            pass

    threading.Thread(target=work, name=f"rlvr-tool-{name or getattr(fn, '__name__', 'fn')}", daemon=True).start()
    try:
        return await asyncio.wait_for(fut, timeout)
    except asyncio.TimeoutError:
        global _abandoned
        with _abandoned_lock:
            state["abandoned"] = True
            _abandoned += 1
        log.warning("tool %s ran past --tool-timeout %s s: abandoned on its thread, which runs on until it returns "
                    "(%d such threads now); --tool-executor process kills such calls instead", name, timeout,
                    _abandoned)
        raise


def _worker(conn) -> None:
    """A tool worker process. ``("load", fn)`` imports ``fn``'s module (unpickling it does) and
    ``("call", fn, kwargs)`` calls it; each gets ``("ok", value)`` or ``("error", text)`` back,
    ``None`` or a closed pipe ends the worker."""
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        except BaseException as e:  # noqa: BLE001 - a module that does not import: the message was read whole
            conn.send(("error", f"{type(e).__name__}: {e}"))
            continue
        if msg is None:
            return
        if msg[0] == "load":
            conn.send(("ok", None))
            continue
        _, fn, kwargs = msg
        try:
            reply = ("ok", fn(**kwargs))
        except BaseException as e:  # noqa: BLE001 - the parent turns it into an error observation
            reply = ("error", f"{type(e).__name__}: {e}")
        try:
            conn.send(reply)
        except Exception as e:  # noqa: BLE001 - e.g. a result that does not pickle
            conn.send(("error", f"the result of the tool cannot be sent back ({type(e).__name__}: {e})"))


class ToolRaised(Exception):
    """A tool raised in its worker process; the message is its ``Type: message``."""


class ToolWorkerFailed(Exception):
    """A tool's worker process could not run it: the tool's module did not import, the worker did
    not start within ``ProcessTools.start_timeout``, or it exited during the call."""


@dataclass
class _Worker:
    proc: Any
    conn: Any  # the parent's end of the worker's pipe
    loaded: set[str] = field(default_factory=set)  # the tools whose module the worker has imported


class ProcessTools:
    """Sync tools in worker processes that are killed at the timeout (module docstring)."""

    def __init__(self, max_idle: int = 4, start_timeout: float = 120.0):
        self._ctx = multiprocessing.get_context("spawn")
        self._idle: list[_Worker] = []
        self._lock, self.max_idle, self.start_timeout = threading.Lock(), max_idle, start_timeout
        self.killed = 0  # workers killed: at a tool's timeout, or past start_timeout
        weakref.finalize(self, _close_all, self._idle)

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.is_alive():
                    return worker
                worker.conn.close()
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child,), name="rlvr-tool-worker", daemon=True)
        proc.start()
        child.close()
        return _Worker(proc, parent)

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(worker)
                return
        _stop(worker)

    async def call(self, fn: Callable, kwargs: dict, timeout: float) -> Any:
        """``fn(**kwargs)`` in a worker; ``asyncio.TimeoutError`` (the worker killed) past ``timeout``,
        ``ToolRaised`` with the tool's error text when it raised, ``ToolWorkerFailed`` when the
        worker could not run it. A worker new to ``fn`` first imports its module, waited for up to
        ``start_timeout`` seconds apart from ``timeout``."""
        worker = self._take()
        name = f"{fn.__module__}:{fn.__qualname__}"
        if name not in worker.loaded:
            try:
                kind, value = await self._exchange(worker, ("load", fn), self.start_timeout)
            except asyncio.TimeoutError:
                raise ToolWorkerFailed(f"its worker process did not start and import {fn.__module__} within "
                                       f"{self.start_timeout:g} s") from None
            except (EOFError, OSError):
                raise ToolWorkerFailed(f"its worker process exited (exit code {worker.proc.exitcode}) while "
                                       f"importing {fn.__module__}") from None
            if kind == "error":
                self._give_back(worker)
                raise ToolWorkerFailed(f"its module {fn.__module__} does not import in a worker process: {value}")
            worker.loaded.add(name)
        try:
            kind, value = await self._exchange(worker, ("call", fn, kwargs), timeout)
        except asyncio.TimeoutError:  # an OSError too (TimeoutError) since Python 3.11
            raise
        except (EOFError, OSError):
            raise ToolWorkerFailed(f"its worker process exited (exit code {worker.proc.exitcode}) during the "
                                   "call") from None
        self._give_back(worker)
        if kind == "error":
            raise ToolRaised(value)
        return value

    async def _exchange(self, worker: _Worker, msg: tuple, timeout: float) -> tuple[str, Any]:
        """Send ``msg`` and wait at most ``timeout`` seconds for the reply. On a timeout, a
        cancelled rollout or a worker that died, the worker is killed and reaped, and the error
        raised."""
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = worker.conn.fileno()
        try:
            worker.conn.send(msg)
            loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
            try:
                await asyncio.wait_for(ready, timeout)
            finally:
                loop.remove_reader(fd)
            return worker.conn.recv()
        except BaseException:
            worker.proc.kill()
            worker.proc.join()
            worker.conn.close()
            self.killed += 1
            raise

    def close(self) -> None:
        _close_all(self._idle)


def _stop(worker: _Worker) -> None:
    try:
        worker.conn.send(None)
    except (OSError, ValueError):
        pass
    worker.proc.join(5)
    if worker.proc.is_alive():
        worker.proc.kill()
        worker.proc.join()
    worker.conn.close()


def _close_all(idle: list[_Worker]) -> None:
    while idle:
        _stop(idle.pop())
