"""Least-outstanding-requests balance: the one place an engine is picked for a request.

Every engine group sends a call to the candidate with the fewest requests outstanding (sent and
not yet answered), so long and short calls even out across engines; ties go to the first
candidate, so an idle group fills its engines in order. Used by the supervisor
(``rlvr.engine.supervisor``, local processes and Ray actors), ``HttpEngine``
(``rlvr.engine.client``) and the plain Ray ``EngineGroup`` (``rlvr.distributed.rollout_manager``).

>>> least_outstanding(["a", "b", "c"], {"a": 2, "b": 0, "c": 0}.__getitem__)
'b'
>>> least_outstanding([], len) is None
True
"""

from __future__ import annotations

from typing import Callable, Iterable, TypeVar

T = TypeVar("T")


def least_outstanding(candidates: Iterable[T], outstanding: Callable[[T], int]) -> T | None:
    """The candidate with the fewest outstanding requests (the first of equals); None when there is none."""
    return min(candidates, key=outstanding, default=None)
