"""The skeleton of an in-process engine: one worker thread owns the model, callers only queue work.

The embedded engine (``rlvr.engine.local.embedded``) and vLLM in process (``rlvr.engine.local.vllm``)
share everything but their step: the record of a ``generate`` call (``Call``: results fill in as
requests finish, ``done`` fires once), submission order and the abort marks (``abort()`` finishes
every request submitted before it, ``abort(rid)`` one), the bridge from the worker's answer to the
caller (``await_worker`` on an event loop, ``wait_worker`` without one: ``generate_sync``), and the
worker's loop: wait under the condition variable until there is work, take it under the lock, run
one step outside it; ``close`` ends the loop and every call still waiting ends with an error.

An engine built on it supplies:

- ``_submit(requests, done) -> handle`` (caller thread): check and queue the requests; ``done`` is
  called once with the results or an exception;
- ``_cancel(handle)``: the caller stopped waiting; end its requests;
- ``_has_work()`` and ``_take_work()`` (both under ``_cv``): whether the worker should wake, and what
  its next step works on (aborts applied, requests admitted);
- ``_step(work)`` (worker thread, no lock held): one step of the model;
- ``_fail_all(error)``: end every call still waiting with ``error`` (the loop failed or was closed).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, TypeVar

from rlvr.engine.base import Engine, GenerateRequest, GenerateResult

log = logging.getLogger(__name__)
Handle = TypeVar("Handle")


@dataclass
class Call:
    """One ``generate`` call: its results fill in as requests finish; ``done`` fires once at the end."""

    results: list[GenerateResult | None]
    done: Callable[[list[GenerateResult] | BaseException], None]
    left: int = 0
    cancelled: bool = False  # the caller stopped waiting

    @classmethod
    def of(cls, requests: list[GenerateRequest], done) -> Call:
        return cls([None] * len(requests), done, left=len(requests))

    def finish(self, i: int, result: GenerateResult) -> None:
        self.results[i] = result
        self.left -= 1
        if self.left == 0:
            self.done(self.results)

    def fail(self, error: BaseException) -> None:
        """End the call with ``error`` unless it has already ended."""
        if self.left > 0:
            self.left = 0
            self.done(error)


class WorkerEngine(Engine):
    """The shared part of an in-process engine (module docstring); ``thread_name`` names its worker."""

    thread_name = "rlvr-engine"

    def __init__(self) -> None:
        self._version = 0
        self._cv = threading.Condition()  # guards the queues and marks; the worker waits on it
        self._seq = itertools.count()  # submission order: abort() finishes the requests below a mark
        self._abort_before = 0
        self._abort_rids: set[str] = set()
        self._closed = False
        self._worker: threading.Thread | None = None

    # ---- protocol -------------------------------------------------------------------------
    async def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        if not requests:
            return []
        return await await_worker(partial(self._submit, requests), self._cancel)

    def generate_sync(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        """``generate`` for callers without an event loop (tests, benchmarks)."""
        if not requests:
            return []
        return wait_worker(partial(self._submit, requests))

    def abort(self, rid: str | None = None) -> None:
        with self._cv:
            if rid is None:
                self._abort_before = next(self._seq)
            else:
                self._abort_rids.add(rid)
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._worker is not None:
            self._worker.join()

    # ---- the worker thread --------------------------------------------------------------------
    def _start_worker(self) -> None:
        """Start the worker (again, if it died). Idempotent."""
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._worker.start()

    def _worker_ok(self) -> bool:
        return self._worker is None or self._worker.is_alive()

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not (self._closed or self._has_work()):
                        self._cv.wait()
                    if self._closed:
                        break
                    work = self._take_work()
                self._step(work)
        except BaseException as e:  # noqa: B036 - every waiting call must hear of the failure
            log.exception("%s worker failed", self.thread_name)
            self._fail_all(e)
            return
        self._fail_all(RuntimeError("engine closed"))

    def _submit(self, requests: list[GenerateRequest], done) -> Any:
        raise NotImplementedError

    def _cancel(self, handle) -> None:
        raise NotImplementedError

    def _has_work(self) -> bool:
        raise NotImplementedError

    def _take_work(self) -> Any:
        raise NotImplementedError

    def _step(self, work) -> None:
        raise NotImplementedError

    def _fail_all(self, error: BaseException) -> None:
        raise NotImplementedError


def check_requests(requests: list[GenerateRequest]) -> None:
    """Refuse an empty prompt or bad sampling settings before anything is queued (ValueError)."""
    for r in requests:
        if not r.prompt_ids:
            raise ValueError(f"generate: request {r.rid!r} has an empty prompt")
        r.params.check()


# ---- the bridge from the worker's answer to the caller ----------------------------------------
async def await_worker(submit: Callable[[Callable[[Any], None]], Handle], cancel: Callable[[Handle], None]):
    """``submit(done)`` hands a call to the engine's worker thread, which calls ``done`` once with the
    results or an exception; this awaits that outcome on the caller's event loop. If the awaiting task
    is cancelled, ``cancel(handle)`` (``handle``: what ``submit`` returned) tells the worker to stop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()
    handle = submit(lambda outcome: loop.call_soon_threadsafe(_resolve, future, outcome))
    try:
        return await future
    except asyncio.CancelledError:
        cancel(handle)
        raise


def wait_worker(submit: Callable[[Callable[[Any], None]], Any]):
    """``await_worker`` for callers without an event loop (tests, benchmarks): blocks until ``done``."""
    box: list = []
    event = threading.Event()
    submit(lambda outcome: (box.append(outcome), event.set()))
    event.wait()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _resolve(future: asyncio.Future, outcome) -> None:
    if future.done():  # cancelled by the caller
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
