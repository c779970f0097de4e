"""Picking an engine for a request: least outstanding requests, and session affinity.

Every engine group sends a call to the candidate with the fewest requests outstanding (sent and
not yet answered), so long and short calls even out across engines; ties go to the first
candidate, so an idle group fills its engines in order. Used by the supervisor
(``rlvr.engine.remote.supervisor``, local processes and Ray actors), ``HttpEngine``
(``rlvr.engine.remote.client``) and the plain Ray ``EngineGroup`` (``rlvr.distributed.rollout_manager``).

A request that names a ``session`` (every turn of one multi-turn sample: ``GenerateRequest.session``)
goes where the session's first request went, as long as that engine is a candidate (up), so its
prefix cache is reused (``Affinity``); a session whose engine went down is pinned to a new one.

>>> least_outstanding(["a", "b", "c"], {"a": 2, "b": 0, "c": 0}.__getitem__)
'b'
>>> least_outstanding([], len) is None
True
>>> aff, load = Affinity(), {"a": 0, "b": 0}
>>> aff.pick("s1", ["a", "b"], load.__getitem__)
'a'
>>> load["a"] = 5
>>> aff.pick("s1", ["a", "b"], load.__getitem__), aff.pick("s2", ["a", "b"], load.__getitem__)
('a', 'b')
>>> aff.pick("s1", ["b"], load.__getitem__)  # its engine is down: pinned anew
'b'
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable, Iterable, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def least_outstanding(candidates: Iterable[T], outstanding: Callable[[T], int]) -> T | None:
    """The candidate with the fewest outstanding requests (the first of equals); None when there is none."""
    return min(candidates, key=outstanding, default=None)


class Affinity:
    """Session -> engine pins; the ``limit`` most recently used sessions are remembered."""

    def __init__(self, limit: int = 100_000):
        self.limit = limit
        self.pins: OrderedDict[str, Hashable] = OrderedDict()

    def pick(self, session: str, candidates: Iterable[K], outstanding: Callable[[K], int]) -> K | None:
        """The session's engine if it is among ``candidates``, else the least-outstanding one
        (pinned for the session's next requests). No session: least outstanding."""
        candidates = list(candidates)
        if not session:
            return least_outstanding(candidates, outstanding)
        pinned = self.pins.get(session)
        if pinned is not None and pinned in candidates:
            self.pins.move_to_end(session)
            return pinned
        choice = least_outstanding(candidates, outstanding)
        if choice is not None:
            self.pins[session] = choice
            self.pins.move_to_end(session)
            while len(self.pins) > self.limit:
                self.pins.popitem(last=False)
        return choice
