"""The engines of the Ray rollout: engine actors, the group the rollout manager samples from, and
that group under the engine supervisor (``--use-fault-tolerance``).

* ``EngineActor``: one ``EmbeddedEngine`` in its own process and bundle; ``make_engine_actor(..., i)``
  is the one function that creates engine ``i``.
* ``EngineGroup``: the ``Engine`` protocol over M actors; each ``generate`` call (one prompt group)
  goes to the engine with the fewest outstanding requests, so long and short groups even out.
  ``EngineGroup.restart(i)`` re-creates engine ``i`` and pushes the current weights and version.
  An actor failure stops the run.
* With ``--use-fault-tolerance`` the manager's group is a ``TolerantEngineGroup``. The policy --
  health checks, re-issue, restart with the newest weights, restart budget, the metrics -- is
  ``rlvr.engine.remote.supervisor.EngineSupervisor``'s, the same code local mode runs over ``rlvr serve``
  processes. What is Ray's:
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
import os
from functools import partial
from typing import Callable

import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError

from rlvr.config import Config, EngineConfig
from rlvr.distributed.failures import get_all, get_one
from rlvr.distributed.placement import Plan, actor_setup, in_bundle, placement_info
from rlvr.distributed.weight_sync import checksum, from_store
from rlvr.engine.remote.balance import Affinity
from rlvr.engine.base import Engine, GenerateRequest, GenerateResult
from rlvr.engine.remote.supervisor import DOWN, STARTUP_TIMEOUT, EngineDown, EngineSupervisor

log = logging.getLogger(__name__)


class EngineActor:
    """One engine in its own process (an async Ray actor: many generate calls at once, batched
    together by the engine): the run's engine kind, whose traits say it runs as an actor (the
    embedded engine; ``rlvr.config.engine_kinds``). It keeps no config: it receives the whole
    ``Config`` only to run the builder (``rlvr.runtime.engines.build_engine``) in its own process,
    which hands the engine its groups."""

    def __init__(self, cfg: Config, index: int, cwd: str):
        actor_setup(cwd)
        from rlvr.config.engine_kinds import KINDS
        from rlvr.runtime.build import build_engine, load_tokenizer
        from rlvr.core.device import for_actor

        if not KINDS[cfg.engine_kind].ray_actors:  # the config refuses it; an actor built by hand too
            raise ValueError(f"{cfg.engine_kind.value} engines do not run as Ray engine actors")
        tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
        self.device = for_actor(cfg.cluster.gpus_per_engine > 0)  # its bundle's GPU (shared when colocated)
        # Engine i samples from its own stream (seed + i); one engine samples as local mode's does.
        from rlvr.train import lora

        model = lora.engine_model(cfg.train) if lora.enabled(cfg.train) else cfg.train.hf_checkpoint
        self.engine = build_engine(cfg, model, tokenizer, device=self.device, seed=cfg.train.seed + index)

    def placement(self) -> dict:
        """Where Ray put this engine (tests): GPU ids, CUDA_VISIBLE_DEVICES, device."""
        return placement_info(self.device)

    async def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        return await self.engine.generate(requests)

    def update_weights(self, stored: dict, version: int, with_checksum: bool) -> str | None:
        """Load weights read from the object store (``weight_sync.to_store``'s form)."""
        weights = from_store(stored)
        return self._load(weights, list(weights), version, with_checksum)

    def join_broadcast(self, host: str, port: int, rank: int, world_size: int) -> None:
        """``--weight-sync broadcast``: join training rank 0's group as ``rank`` (1 + engine index)."""
        from rlvr.distributed.broadcast import WeightBroadcast

        self.broadcast = WeightBroadcast(host, port, rank, world_size, self.device)

    def receive_weights(self, specs: list, buffer_bytes: int, version: int, with_checksum: bool) -> str | None:
        """Load the weights rank 0 is broadcasting, bucket by bucket (``rlvr.distributed.broadcast``)."""
        return self._load(self.broadcast.receive(specs, buffer_bytes), [s.name for s in specs], version,
                          with_checksum)

    def _load(self, named, names: list[str], version: int, with_checksum: bool) -> str | None:
        """``named`` (a mapping or a stream of pairs) into the engine; with ``with_checksum`` the
        checksum of what it then holds under ``names``."""
        self.engine.wake()  # asleep (colocated): restore the buffers first; awake: nothing to do
        self.engine.update_weights(named, version)
        if not with_checksum:
            return None
        held = self.engine.model.state_dict()
        return checksum({name: held[name] for name in names})

    def abort(self, rid: str | None = None) -> None:
        self.engine.abort(rid)

    def sleep(self) -> None:
        self.engine.sleep()

    def health(self) -> bool:
        return self.engine.health()

    def rng_state(self) -> torch.Tensor:
        return self.engine.rng_state()

    def pid(self) -> int:
        """This actor's process id (fault-tolerance logs and tests)."""
        return os.getpid()

    def load(self) -> dict[str, int]:
        """Requests in the engine now and decode steps so far (``EmbeddedEngine.load``; tests wait on it)."""
        return self.engine.load()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.engine.set_rng_state(state)


def engine_states(states: list[torch.Tensor | None] | torch.Tensor, n: int) -> list[torch.Tensor | None]:
    """A checkpoint's engine sampler states, one per engine of a group of ``n``."""
    if isinstance(states, torch.Tensor):  # a local-mode checkpoint: one engine's state
        states = [states]
    if len(states) != n:
        raise ValueError(f"the checkpoint holds {len(states)} engine sampler states, this run has "
                         f"{n} engines; resume with the same --rollout-num-engines")
    return list(states)


def make_engine_actor(cfg: Config, pg, p: Plan, cwd: str, i: int):
    """Create engine actor ``i`` in its bundle (version 0: the ``--hf-checkpoint`` weights)."""
    return ray.remote(EngineActor).options(**in_bundle(pg, p.engine_bundles[i], p.engine_share, p.engine_gpus(i))
                                           ).remote(cfg, i, cwd)


class EngineGroup(Engine):
    """The ``Engine`` protocol over M engine actors, balanced by outstanding requests; not
    supervised: the first actor failure stops the run (``TolerantEngineGroup`` is the supervised one)."""

    def __init__(self, make: Callable[[int], object], n: int):
        self.make = make  # make(i): engine actor i, in its bundle (make_engine_actor with the run's placement)
        self.actors = [self.make(i) for i in range(n)]
        self.outstanding = [0] * n
        self.version = 0
        self.weights_ref = None  # the last weights pushed (a restarted engine gets them too)
        self.broadcast_specs = None  # --weight-sync broadcast: what rank 0 sends (set when the group forms)
        self.affinity = Affinity()  # session -> actor index

    def restart(self, i: int) -> None:
        """Replace engine ``i`` by a new actor holding the current weights."""
        if self.broadcast_specs is not None:
            raise RuntimeError(f"engine {i} cannot be re-created under --weight-sync broadcast: a new engine cannot "
                               "join the broadcast group formed at the start (use --weight-sync object_store)")
        ray.kill(self.actors[i])
        self.actors[i] = self.make(i)
        self.outstanding[i] = 0
        if self.weights_ref is not None:
            get_one(self.actors[i].update_weights.remote(self.weights_ref, self.version, False))

    async def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        # session affinity: the turns of one multi-turn sample stay on one engine
        i = self.affinity.pick(requests[0].session if requests else "", range(len(self.actors)),
                               self.outstanding.__getitem__)
        self.outstanding[i] += len(requests)
        try:
            return await self.actors[i].generate.remote(requests)
        finally:
            self.outstanding[i] -= len(requests)

    def update_weights(self, weights_ref, version: int, with_checksum: bool = False) -> list[str | None]:
        sums = get_all([a.update_weights.remote(weights_ref, version, with_checksum) for a in self.actors])
        self.weights_ref, self.version = weights_ref, version
        return sums

    def join_broadcast(self, host: str, port: int) -> None:
        """Every engine joins rank 0's broadcast group (rank 0 joins at the same time)."""
        world = len(self.actors) + 1
        get_all([a.join_broadcast.remote(host, port, 1 + i, world) for i, a in enumerate(self.actors)])

    def receive_weights(self, buffer_bytes: int, version: int, with_checksum: bool = False) -> list[str | None]:
        sums = get_all([a.receive_weights.remote(self.broadcast_specs, buffer_bytes, version, with_checksum)
                        for a in self.actors])
        self.version = version
        return sums

    def abort(self, rid: str | None = None) -> None:
        get_all([a.abort.remote(rid) for a in self.actors])

    def sleep(self) -> None:
        get_all([a.sleep.remote() for a in self.actors])

    def health(self) -> list[bool]:
        """Per engine: alive, awake and holding weights (a dead actor raises ``RayActorError``)."""
        return get_all([a.health.remote() for a in self.actors])

    @property
    def weight_version(self) -> int:
        return self.version

    def rng_state(self) -> list[torch.Tensor]:
        return get_all([a.rng_state.remote() for a in self.actors])

    def set_rng_state(self, states: list[torch.Tensor] | torch.Tensor) -> None:
        states = engine_states(states, len(self.actors))
        get_all([a.set_rng_state.remote(s) for a, s in zip(self.actors, states)])

    def pids(self) -> list[int | None]:
        return get_all([a.pid.remote() for a in self.actors])

    @classmethod
    def create(cls, cfg: Config, pg, p: Plan, cwd: str, n: int):
        """The group ``RolloutManager`` uses: with ``--use-fault-tolerance`` a ``TolerantEngineGroup``
        (below: the engine supervisor over the actors, the same methods),
        otherwise this one (an actor failure stops the run). The actors get the whole ``cfg`` to
        build their engines; the groups get only the actor factory (and the engine group)."""
        make = partial(make_engine_actor, cfg, pg, p, cwd)
        if cfg.engine.use_fault_tolerance:
            return TolerantEngineGroup(make, cfg.engine, n)
        return cls(make, n)

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


class TolerantEngineGroup(Engine):
    """``EngineGroup``'s methods over ``EngineSupervisor`` + ``RayActors``; see the module docstring."""

    def __init__(self, make: Callable[[int], object], engine: EngineConfig, n: int):
        self.transport = RayActors(make)
        # Every engine loads before the clock of the health checks starts.
        self.supervisor = EngineSupervisor(self.transport, engine, num_engines=n)

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
