"""The grader: runs the configured reward on samples, concurrently, and never crashes the run.

``Grader(cfg.reward)`` turns ``--rm-type`` (a registered name, or a weighted composite
``math=0.9,format=0.1``) or ``--custom-rm-path`` (per sample, or per group with ``--group-rm``)
into one coroutine, ``grade_group(samples)``, that the rollout awaits as soon as a group's
responses are back, so grading overlaps the generation of the other groups.

Every call is contained (a broken grader must not silently ruin the run):

* an exception, a call that outlives ``--reward-timeout``, a NaN/inf score or a malformed
  result (no ``score`` key, not a number, a group reward of the wrong length) gives the sample
  ``--reward-failure-value`` and records the reason in ``sample.metadata["reward_error"]``;
  ``rollout/reward_errors`` counts them and the run goes on;
* a dict result keeps its extra numeric fields, which the rollout logs as ``rollout/reward/<field>``;
  a composite's result is ``{"score": weighted sum, <part>: part score, ...}``.

How a reward runs: ``async`` rewards are awaited; sync rewards marked ``inline`` (cheap, pure
CPU: math, QA, format) run on the event-loop thread, where math-verify's own alarm-based timeout
works; any other sync reward runs in a worker thread. At most ``--reward-max-concurrency`` calls
are in flight. A timed-out thread cannot be killed (Python has no way to); its result is
dropped, and ``code`` runs programs in killable subprocesses for exactly this reason.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from rlvr.config.reward import RewardConfig
from rlvr.rewards.registry import check_reward_config, parse_rm_type  # noqa: F401 (re-exported)
from rlvr.core.types import Sample

log = logging.getLogger(__name__)


def inline(fn: Callable) -> Callable:
    """Mark a cheap sync reward to run on the event-loop thread instead of a worker thread."""
    fn.inline = True
    return fn


def build_reward(name: str, cfg: RewardConfig) -> Callable:
    """The registered reward ``name``, instantiated with ``cfg`` when it is a class."""
    from rlvr.rewards.registry import REWARDS

    entry = REWARDS[name]
    return entry(cfg) if isinstance(entry, type) else entry


@dataclass
class Outcome:
    """One grading call's result: the score, extra fields, and the failure reason if any."""

    score: float
    fields: dict[str, Any]
    error: str | None = None

    def as_reward(self) -> float | dict:
        return {"score": self.score, **self.fields} if self.fields else self.score


def outcome_of(result: Any, key: str | None = None) -> Outcome:
    """Check a reward's return value: a finite number, or a dict with a finite ``score`` (or, with
    ``key`` (``--reward-key``), the dict's ``key`` entry is the score; its other entries are fields).

    >>> outcome_of(0.5)
    Outcome(score=0.5, fields={}, error=None)
    >>> outcome_of({"score": 1, "acc": True}).fields
    {'acc': True}
    >>> outcome_of(float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: non-finite reward nan
    """
    fields: dict[str, Any] = {}
    if isinstance(result, dict) and key is not None:
        if key not in result:
            raise ValueError(f"reward dict has no {key!r} key (--reward-key; keys: {sorted(result)})")
        fields = {k: v for k, v in result.items() if k not in (key, "score")}
        result = result[key]
    elif isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"reward dict has no 'score' key (keys: {sorted(result)})")
        fields = {k: v for k, v in result.items() if k != "score"}
        result = result["score"]
    if isinstance(result, (bool, str, bytes)):
        raise ValueError(f"reward must be a number or a dict with 'score', got {type(result).__name__}")
    if not isinstance(result, (int, float)):
        try:  # numpy / torch scalars
            result = float(result)
        except (TypeError, ValueError):
            raise ValueError(f"reward must be a number or a dict with 'score', got {type(result).__name__}") from None
    if not math.isfinite(result):
        raise ValueError(f"non-finite reward {result}")
    return Outcome(float(result), fields)


def _is_async(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


class Grader:
    """Grades samples with the configured reward; see the module docstring for the guarantees."""

    def __init__(self, cfg: RewardConfig, custom: Callable | None = None):
        """``custom``: the ``--custom-rm-path`` function as rlvr calls it, ``f(sample)`` (or
        ``f(samples)`` with ``--group-rm``); the builders pass a slime-signature reward adapted
        (``rlvr.runtime.plugins.custom_reward``). Default: the function the path names, as it is."""
        from rlvr.core.registry import load_function

        check_reward_config(cfg)  # the one place the reward settings are checked (also for score/grade)
        self.cfg = cfg
        self.group_fn: Callable | None = None
        self.parts: dict[str, tuple[Callable, float]] = {}
        if cfg.custom_rm_path is not None:
            fn = custom or load_function(cfg.custom_rm_path, "--custom-rm-path")
            if cfg.group_rm:
                self.group_fn = fn
            else:
                self.parts["custom"] = (fn, 1.0)
        else:
            self.parts = {name: (build_reward(name, cfg), w) for name, w in parse_rm_type(cfg.rm_type).items()}
        # One semaphore per event loop: an async run grades on the producer's loop while eval
        # grades on the main thread's, at the same time.
        self._sems: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    # ---- the one entry point -------------------------------------------------------------
    async def grade_group(self, samples: list[Sample]) -> None:
        """Set ``reward`` (and ``metadata["reward_error"]`` on failure) on every sample."""
        if self.group_fn is not None:
            outcomes = await self._grade_as_group(samples)
        else:
            outcomes = await asyncio.gather(*(self._grade_one(s) for s in samples))
        for s, o in zip(samples, outcomes, strict=True):
            s.reward = o.as_reward()
            if o.error is not None:
                s.metadata["reward_error"] = o.error
                log.warning("reward failed for sample %d (prompt %d): %s", s.index, s.prompt_index, o.error)

    def grade_sync(self, samples: list[Sample]) -> None:
        """``grade_group`` from synchronous code (works inside a running event loop too)."""
        _run_sync(self.grade_group(samples))

    # ---- internals -----------------------------------------------------------------------
    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._sems:
            self._sems[loop] = asyncio.Semaphore(self.cfg.reward_max_concurrency)
        return self._sems[loop]

    async def _call(self, fn: Callable, arg: Any) -> Any:
        async with self._semaphore():
            if _is_async(fn):
                return await asyncio.wait_for(fn(arg), self.cfg.reward_timeout)
            if getattr(fn, "inline", False):
                return fn(arg)
            return await asyncio.wait_for(_in_daemon_thread(fn, arg), self.cfg.reward_timeout)

    async def _grade_one(self, sample: Sample) -> Outcome:
        results = await asyncio.gather(*(self._contained(fn, sample) for fn, _ in self.parts.values()))
        if len(self.parts) == 1:
            return results[0]
        total, fields, errors = 0.0, {}, []
        for (name, (_, weight)), o in zip(self.parts.items(), results):
            total += weight * o.score
            fields[name] = o.score
            fields.update({f"{name}/{k}": v for k, v in o.fields.items()})
            if o.error is not None:
                errors.append(f"{name}: {o.error}")
        return Outcome(total, fields, "; ".join(errors) or None)

    async def _contained(self, fn: Callable, sample: Sample) -> Outcome:
        try:
            return outcome_of(await self._call(fn, sample), self.cfg.reward_key)
        except Exception as e:  # contained: one sample's grading never stops the run
            return self._failure(e)

    async def _grade_as_group(self, samples: list[Sample]) -> list[Outcome]:
        try:
            results = await self._call(self.group_fn, samples)
            if not isinstance(results, (list, tuple)) or len(results) != len(samples):
                got = len(results) if isinstance(results, (list, tuple)) else type(results).__name__
                raise ValueError(f"group reward returned {got} rewards for a group of {len(samples)}")
            return [self._checked(r) for r in results]
        except Exception as e:
            return [self._failure(e)] * len(samples)

    def _checked(self, result: Any) -> Outcome:
        try:
            return outcome_of(result, self.cfg.reward_key)
        except ValueError as e:
            return self._failure(e)

    def _failure(self, e: BaseException) -> Outcome:
        if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
            reason = f"timeout after {self.cfg.reward_timeout:g} s (--reward-timeout)"
        else:
            reason = f"{type(e).__name__}: {e}"
        return Outcome(self.cfg.reward_failure_value, {}, reason)


def _in_daemon_thread(fn: Callable, arg: Any) -> asyncio.Future:
    """Run ``fn(arg)`` in a daemon thread: a call that never returns is abandoned at its timeout
    without holding up the event loop's shutdown (``asyncio.to_thread`` would) or the exit."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            fut.set_result(value) if ok else fut.set_exception(value)

    def work() -> None:
        try:
            result, ok = fn(arg), True
        except BaseException as e:  # handed to the awaiting coroutine
            result, ok = e, False
        try:
            loop.call_soon_threadsafe(settle, ok, result)
        except RuntimeError:  # the loop closed: the caller gave up on this call long ago
            pass

    threading.Thread(target=work, daemon=True, name="reward").start()
    return fut


def _run_sync(coro) -> Any:
    """Run a coroutine to completion from sync code, even when an event loop is running here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # e.g. inside a notebook's loop
        return pool.submit(asyncio.run, coro).result()
