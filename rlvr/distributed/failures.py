"""Failure surfaces: an exception in any actor stops the run with that actor's traceback.

``get_all(refs)`` waits for a set of actor calls and raises as soon as *any* of them fails —
not after the others finish: when one training rank dies, the others block in a collective that
will never complete, so waiting for them in order would hang until gloo's timeout. Ray raises
``RayTaskError`` (its message carries the remote traceback, and it is also an instance of the
original exception class) or ``RayActorError`` (the actor process died). The caller's
``Components.close`` then kills every actor and shuts Ray down.
"""

from __future__ import annotations

from typing import Any


def get_all(refs: list, timeout_s: float | None = None) -> list[Any]:
    """The results of ``refs``, in order; the first failure among them is raised at once."""
    import ray

    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
        if not done:
            raise TimeoutError(f"{len(pending)} actor calls did not finish within {timeout_s} s")
        ray.get(done)  # raises the remote exception, traceback included
    return ray.get(list(refs))


def get_one(ref, timeout_s: float | None = None) -> Any:
    return get_all([ref], timeout_s)[0]
