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
  arguments and result that pickle.

An async tool needs neither: ``asyncio.wait_for`` cancels it at the timeout.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import multiprocessing
import threading
import weakref
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
    """A tool worker process: call what arrives, send back ("ok", result) or ("error", text)."""
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        fn, kwargs = msg
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


class ProcessTools:
    """Sync tools in worker processes that are killed at the timeout (module docstring)."""

    def __init__(self, max_idle: int = 4):
        self._ctx = multiprocessing.get_context("spawn")
        self._idle: list[tuple[Any, Any]] = []  # (process, parent end of its pipe)
        self._lock, self.max_idle = threading.Lock(), max_idle
        self.killed = 0
        weakref.finalize(self, _close_all, self._idle)

    def _take(self):
        with self._lock:
            while self._idle:
                proc, conn = self._idle.pop()
                if proc.is_alive():
                    return proc, conn
                conn.close()
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child,), name="rlvr-tool-worker", daemon=True)
        proc.start()
        child.close()
        return proc, parent

    def _give_back(self, proc, conn) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append((proc, conn))
                return
        _stop(proc, conn)

    async def call(self, fn: Callable, kwargs: dict, timeout: float) -> Any:
        """``fn(**kwargs)`` in a worker; ``asyncio.TimeoutError`` (the worker killed) past ``timeout``,
        ``RuntimeError`` with the tool's error text when it raised."""
        proc, conn = self._take()
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        try:
            conn.send((fn, kwargs))
            loop.add_reader(conn.fileno(), lambda: ready.done() or ready.set_result(None))
            try:
                await asyncio.wait_for(ready, timeout)
            finally:
                loop.remove_reader(conn.fileno())
            kind, value = conn.recv()
        except BaseException:  # the timeout, a cancelled rollout, a worker that died: it goes
            proc.kill()
            proc.join()
            conn.close()
            self.killed += 1
            raise
        self._give_back(proc, conn)
        if kind == "error":
            raise ToolRaised(value)
        return value

    def close(self) -> None:
        _close_all(self._idle)


def _stop(proc, conn) -> None:
    try:
        conn.send(None)
    except (OSError, ValueError):
        pass
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    conn.close()


def _close_all(idle: list) -> None:
    while idle:
        _stop(*idle.pop())
