"""Engine fault tolerance on Ray (``--ray --use-fault-tolerance``): the engine supervisor over
engine actors.

The policy -- health checks, re-issue, restart with the newest weights, restart budget, the
metrics -- is ``rlvr.engine.supervisor.EngineSupervisor``'s, the same code local mode runs over
``rlvr serve`` processes. This module holds only what is Ray's:

* ``RayActors``, the supervisor's transport over ``EngineActor``s: ``launch`` creates an actor in
  engine ``i``'s bundle (``make_engine_actor``), ``send`` is one ``actor.generate.remote`` per prompt
  group (``batched``: the group's prompt is prefilled once), ``probe`` is ``actor.health.remote()``
  (``False`` -- asleep while colocated -- is an answer: the actor is alive), weights are the object
  store's ref, ``kill`` is ``ray.kill`` (the raylet SIGKILLs a stopped process). A call that raises
  ``RayActorError`` (the process died: SIGKILL, OOM, segfault; ``ActorUnavailableError`` too) is
  ``EngineDown(dead=True)``: the engine is replaced, not waited for. An engine's own exception
  (``RayTaskError``) is not a transport failure: it stops the run.
* ``TolerantEngineGroup``, what the rollout manager holds: the plain ``EngineGroup``'s methods
  (per-engine health, sleep, sampler states, pids, ``restart(i)``) over one ``EngineSupervisor``.
"""

from __future__ import annotations

import logging
from functools import partial

import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError

from rlvr.distributed.rollout_manager import engine_states, make_engine_actor
from rlvr.engine.base import GenerateRequest, GenerateResult
from rlvr.engine.supervisor import DOWN, STARTUP_TIMEOUT, EngineDown, EngineSupervisor

log = logging.getLogger(__name__)


def _get(ref, what: str, timeout: float | None = None):
    """``ray.get`` with the transport's failures as ``EngineDown``."""
    try:
        return ray.get(ref, timeout=timeout)
    except RayActorError as e:
        raise EngineDown(f"actor died during {what}: {type(e).__name__}", dead=True) from e
    except GetTimeoutError as e:
        raise EngineDown(f"{what} unanswered for {timeout:.0f} s") from e


class _RefProbe:
    """A health call in flight, as the supervisor's ``Probe``."""

    def __init__(self, ref):
        self.ref = ref

    def done(self) -> bool:
        return bool(ray.wait([self.ref], timeout=0)[0])

    def result(self) -> bool:
        return _get(self.ref, "health")  # True, or False while asleep: either way the actor answered


class RayActors:
    """``Transport`` over engine actors; ``make(i)`` creates engine ``i``'s actor in its bundle."""

    batched = True  # one call per prompt group

    def __init__(self, make):
        self.make = make

    def launch(self, index: int, restarts: int):
        return self.make(index)

    def wait_ready(self, actor, index: int) -> int:
        return _get(actor.pid.remote(), f"engine {index} start", timeout=STARTUP_TIMEOUT)

    def exit_code(self, actor) -> None:
        return None  # an actor's death shows in its calls and probes

    def probe(self, actor, timeout: float) -> _RefProbe:
        return _RefProbe(actor.health.remote())

    def kill(self, actor, graceful: bool = False) -> None:
        ray.kill(actor)

    def stage_weights(self, weights_ref, version: int):
        return weights_ref  # already in the object store, written once by rank 0

    def push_weights(self, actor, weights_ref, version: int, with_checksum: bool = False) -> str | None:
        return _get(actor.update_weights.remote(weights_ref, version, with_checksum), "weight update",
                    timeout=STARTUP_TIMEOUT)

    async def send(self, actor, requests: list[GenerateRequest]) -> list[GenerateResult]:
        try:
            return await actor.generate.remote(requests)
        except RayActorError as e:
            raise EngineDown(f"actor died: {type(e).__name__}", dead=True) from e

    def abort(self, actor, rid: str | None) -> None:
        _get(actor.abort.remote(rid), "abort")

    def call(self, actor, method: str, *args):
        """Any other ``EngineActor`` method, as one blocking call."""
        return _get(getattr(actor, method).remote(*args), method)

    def close(self) -> None:
        pass


class TolerantEngineGroup:
    """``EngineGroup``'s methods over ``EngineSupervisor`` + ``RayActors``; see the module docstring."""

    def __init__(self, cfg, pg, p, cwd: str, n: int):
        self.transport = RayActors(partial(make_engine_actor, cfg, pg, p, cwd))
        # Every engine loads before the clock of the health checks starts.
        self.supervisor = EngineSupervisor(self.transport, cfg.engine, num_engines=n)

    async def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        return await self.supervisor.generate(requests)

    def update_weights(self, weights_ref, version: int, with_checksum: bool = False) -> list[str | None]:
        """Load the weights into every live engine; one that dies meanwhile is restarted with them.
        Returns the checksums of the engines that loaded them."""
        return self.supervisor.update_weights(weights_ref, version, with_checksum=with_checksum)

    def abort(self, rid: str | None = None) -> None:
        self.supervisor.abort(rid)

    def sleep(self) -> None:
        self._on_live("sleep")

    def health(self) -> list[bool]:
        """Per engine: up (its actor answering, awake and holding weights); False while down."""
        return [r is True for r in self._on_live("health")]

    def rng_state(self) -> list[torch.Tensor | None]:
        """Per engine (None for one that is down: it restarts from a fresh stream)."""
        return [None if r is DOWN else r for r in self._on_live("rng_state")]

    def set_rng_state(self, states) -> None:
        states = engine_states(states, len(self.supervisor.slots))
        self.supervisor.on_live(
            lambda i, a: None if states[i] is None else self.transport.call(a, "set_rng_state", states[i]),
            "set_rng_state")

    def restart(self, i: int) -> None:
        """Replace engine ``i`` now (as if it had died) and wait for the replacement."""
        self.supervisor.replace(i)

    def pids(self) -> list[int | None]:
        """Each engine's current process id (None while it is down)."""
        return [s.pid if s.up else None for s in self.supervisor.slots]

    def stats(self) -> dict[str, float]:
        return self.supervisor.stats()

    @property
    def events(self) -> list[dict]:
        return self.supervisor.events

    @property
    def actors(self) -> list:
        return [s.handle for s in self.supervisor.slots]

    @property
    def weight_version(self) -> int:
        return self.supervisor.weight_version

    def close(self) -> None:
        self.supervisor.close()

    def _on_live(self, method: str, *args) -> list:
        return self.supervisor.on_live(lambda i, a: self.transport.call(a, method, *args), method)
