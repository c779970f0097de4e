"""The engine-failure policy: what happens to a call whose engine failed it, in one place.

Both engine clients that spread calls over several engines follow it: ``rlvr.engine.remote.client.HttpEngine``
(servers rlvr did not start: ``--rollout-external-engine-addrs``) and
``rlvr.engine.remote.supervisor.EngineSupervisor`` (engines rlvr runs and restarts). A client *reports*
what it sees -- an engine failed a call (``failed``), an engine answered (``answered``) -- and asks
where the next attempt of a call may go (``choices``) and how many attempts a call gets
(``attempts``). The rules:

1. **Retry elsewhere.** A call's next attempt goes to an engine it has not tried yet and that is not
   avoided; failing that, to one it has not tried (avoided or not); failing that, to one it tried
   whose avoidance has ended. No choice left: the HTTP client gives the call up at once (nothing
   will bring an external server back sooner); the supervisor waits, since its monitor either
   takes the engine down and restarts it (a new engine: not tried) or sees it answer a probe.
2. **Avoid a failing engine for a while.** An engine that failed a call gets no new call for
   ``avoid_for`` seconds, unless none other is left (rule 1), or until it answers (a call or, under
   the supervisor, a health probe). The HTTP client's ``cooldown``; the supervisor's
   ``--rollout-health-check-timeout``, by which time its probe has either answered or taken the engine down.
3. **Give up after ``attempts`` attempts** (the HTTP client: ``--rollout-external-engine-retries`` + 1;
   the supervisor: enough for every engine to use all its restarts): the call comes back with
   finish reason ``error`` and the attempts' errors (``error_results``), which the rollout counts
   as failed samples.

What stays the supervisor's own is what only it can do to an engine: probe, kill, restart, remove.
"""

from __future__ import annotations

import threading
import time
from typing import Hashable, Iterable

from rlvr.engine.base import GenerateRequest, GenerateResult


class FailurePolicy:
    """Per-engine avoidance and the choice of the next attempt (module docstring). Engines are any
    hashable keys (an address; a supervisor's ``(slot, incarnation)``). Thread-safe.

    >>> p = FailurePolicy(attempts=3, avoid_for=5.0)
    >>> p.failed("a", now=0.0)
    >>> p.choices(["a", "b"], tried=set(), now=1.0)  # not a: it failed a call 1 s ago
    ['b']
    >>> p.failed("b", now=0.5)  # b fails this call too
    >>> p.choices(["a", "b"], tried={"b"}, now=1.0)  # a is untried by this call, though avoided
    ['a']
    >>> p.choices(["a", "b"], tried={"a", "b"}, now=1.0), p.choices(["a", "b"], tried={"a", "b"}, now=6.0)
    ([], ['a', 'b'])
    >>> p.answered("a"); p.choices(["a", "b"], tried={"a", "b"}, now=1.0)  # a answered a probe: back in
    ['a']
    """

    def __init__(self, attempts: int, avoid_for: float):
        if attempts < 1:
            raise ValueError(f"a call needs at least one attempt, got {attempts}")
        self.attempts, self.avoid_for = attempts, avoid_for
        self._until: dict[Hashable, float] = {}  # engine -> monotonic time its avoidance ends
        self._lock = threading.Lock()

    def failed(self, engine: Hashable, now: float | None = None) -> None:
        """``engine`` failed a call: avoid it for ``avoid_for`` seconds."""
        with self._lock:
            self._until[engine] = (time.monotonic() if now is None else now) + self.avoid_for

    def answered(self, engine: Hashable) -> None:
        """``engine`` answered (a call, a health probe): no longer avoided."""
        with self._lock:
            self._until.pop(engine, None)

    def avoided(self, engine: Hashable, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        with self._lock:
            return self._until.get(engine, 0.0) > now

    def choices(self, engines: Iterable[Hashable], tried: set, now: float | None = None) -> list:
        """Where the next attempt of a call that already tried ``tried`` may go, among ``engines``
        (the live ones), in the order of rule 1; empty: no engine for it now."""
        now = time.monotonic() if now is None else now
        engines = list(engines)
        ok = [e for e in engines if not self.avoided(e, now)]
        fresh = [e for e in engines if e not in tried]
        return [e for e in fresh if e in ok] or fresh or [e for e in ok if e in tried]


def error_results(requests: list[GenerateRequest], errors: list[str], version: int) -> list[GenerateResult]:
    """What a call given up comes back as (rule 3): one ``error`` result per request, carrying the
    last attempts' errors."""
    error = "; ".join(errors[-5:]) or "no engine was left to send it to"
    return [GenerateResult(q.rid, [], [], "error", version, {"error": error}) for q in requests]
