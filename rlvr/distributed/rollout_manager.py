"""The rollout side on Ray: a manager actor owning the data source, the grader and M engine actors.

``RolloutManager`` holds the ordinary ``Rollout`` (prompt groups -> requests -> graded samples,
dynamic sampling, partial rollouts: all of ``rlvr/rollout`` unchanged) whose engine is an
``EngineGroup``: the ``Engine`` protocol over M ``EngineActor``s, each an ``EmbeddedEngine`` in
its own process and bundle. Every ``generate`` call (one prompt group) goes to the engine with
the fewest outstanding requests, so long and short groups even out across engines.

Engine actors are made by one function, ``make_engine_actor(..., i)``, and
``EngineGroup.restart(i)`` re-creates engine ``i`` and pushes the current weights and version to
it. With ``--use-fault-tolerance`` the manager's group is a ``TolerantEngineGroup``
(``rlvr/distributed/engine_faults.py``): the engine supervisor (``rlvr.engine.supervisor``, the
same policy as local mode's) over the engine actors -- health-checked, restarted, re-issued.

Colocated (``--colocate``): after each rollout the engines ``sleep`` (their weights are freed
while the trainer trains); ``update_weights`` wakes them and loads the new weights.

``RayRollout`` is what the loop holds: ``generate``, ``evaluate``, ``update_weights``,
``data_source`` (state_dict / load_state_dict) and ``engine`` (the sampling generators' states,
for checkpoints), each one remote call to the manager.
"""

from __future__ import annotations

import os

import ray
import torch

from rlvr.config import Config, EvalConfig
from rlvr.data.dataset import PromptRecord
from rlvr.distributed.failures import get_all, get_one
from rlvr.distributed.placement import Plan, actor_setup, in_bundle, placement_info
from rlvr.distributed.weight_sync import WeightMismatch, WeightsRef, checksum, from_store
from rlvr.engine.balance import Affinity
from rlvr.engine.base import GenerateRequest, GenerateResult
from rlvr.rollout.producer import BatchSource
from rlvr.types import RolloutBatch


class EngineActor:
    """One embedded engine in its own process (an async Ray actor: many generate calls at once,
    batched together by the engine)."""

    def __init__(self, cfg: Config, index: int, cwd: str):
        actor_setup(cwd)
        from rlvr.build import embedded_engine, load_tokenizer
        from rlvr.device import for_actor

        tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
        self.device = for_actor(cfg.cluster.gpus_per_engine > 0)  # its bundle's GPU (shared when colocated)
        # Engine i samples from its own stream (seed + i); one engine samples as local mode's does.
        from rlvr.train import lora

        model = lora.engine_model(cfg.train) if lora.enabled(cfg.train) else cfg.train.hf_checkpoint
        self.engine = embedded_engine(cfg, model, tokenizer, device=self.device, seed=cfg.train.seed + index)

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


class EngineGroup:
    """The ``Engine`` protocol over M engine actors, balanced by outstanding requests; not
    supervised: the first actor failure stops the run (``TolerantEngineGroup`` is the supervised one)."""

    def __init__(self, cfg: Config, pg, p: Plan, cwd: str, n: int):
        self.cfg, self.pg, self.plan, self.cwd = cfg, pg, p, cwd
        self.actors = [self.make(i) for i in range(n)]
        self.outstanding = [0] * n
        self.version = 0
        self.weights_ref = None  # the last weights pushed (a restarted engine gets them too)
        self.broadcast_specs = None  # --weight-sync broadcast: what rank 0 sends (set when the group forms)
        self.affinity = Affinity()  # session -> actor index

    def make(self, i: int):
        return make_engine_actor(self.cfg, self.pg, self.plan, self.cwd, i)

    def restart(self, i: int) -> None:
        """Replace engine ``i`` by a new actor holding the current weights (the seam for issue 9's
        health checks)."""
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
        (``rlvr.distributed.engine_faults``: the engine supervisor over the actors, the same methods),
        otherwise this one (an actor failure stops the run)."""
        if cfg.engine.use_fault_tolerance:
            from rlvr.distributed.engine_faults import TolerantEngineGroup

            return TolerantEngineGroup(cfg, pg, p, cwd, n)
        return cls(cfg, pg, p, cwd, n)


class RolloutManager:
    """The rollout side in one actor: data source, grader, ``Rollout``, and the engine group."""

    def __init__(self, cfg: Config, pg, p: Plan, cwd: str):
        actor_setup(cwd)
        from rlvr.build import load_tokenizer, make_rollout, open_training_data

        self.cfg = cfg
        tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
        n = cfg.cluster.num_engines(cfg.engine.rollout_num_engines)
        self.engines = EngineGroup.create(cfg, pg, p, cwd, n)
        self.rollout = make_rollout(cfg, self.engines, tokenizer, open_training_data(cfg, tokenizer))

    def ready(self) -> int:
        """Wait for every engine to load; returns the engine count."""
        self.engines.health()
        return len(self.engines.actors)

    def generate(self, rollout_id: int) -> RolloutBatch:
        batch = self.rollout.generate(rollout_id)
        if self.cfg.cluster.colocate:  # the trainer trains next, in the same bundles
            self.engines.sleep()
        return batch

    def evaluate(self, name: str, records: list[PromptRecord], cfg: EvalConfig) -> dict[str, float]:
        return self.rollout.evaluate(name, records, cfg)

    def update_weights(self, refs: list, version: int) -> list[str | None]:
        """``refs`` = [weights ref, checksum ref or None] (wrapped in a list so that Ray hands the
        refs over instead of fetching the weights into this actor)."""
        weights_ref, checksum_ref = refs
        expected = ray.get(checksum_ref) if checksum_ref is not None else None
        sums = self.engines.update_weights(weights_ref, version, with_checksum=expected is not None)
        return self._compare(sums, expected, version)

    @staticmethod
    def _compare(sums: list[str | None], expected: str | None, version: int) -> list[str | None]:
        bad = [i for i, s in enumerate(sums) if expected is not None and s != expected]
        if bad:
            raise WeightMismatch(f"--check-weight-update-equal: after the sync to version {version}, engines {bad} "
                                 f"hold weights whose checksum differs from the trainer's ({expected})")
        return sums

    def join_broadcast(self, host: str, port: int) -> None:
        self.engines.join_broadcast(host, port)

    def set_broadcast_specs(self, specs: list) -> None:
        """What rank 0 sends at every push (known once it has joined)."""
        self.engines.broadcast_specs = specs

    def receive_weights(self, refs: list, version: int, check: bool) -> list[str | None]:
        """``--weight-sync broadcast``: the engines receive what rank 0 is sending; then, with
        ``check`` (``--check-weight-update-equal``), their checksums are compared with rank 0's
        (``refs`` = [its call's ref], read only after the transfer: rank 0 returns when done)."""
        sums = self.engines.receive_weights(self.cfg.cluster.update_weight_buffer_size, version, with_checksum=check)
        return self._compare(sums, ray.get(refs[0]) if check else None, version)

    def restart_engine(self, i: int) -> None:
        self.engines.restart(i)

    # ---- --async: the producer runs here, beside the engines (rlvr.rollout.producer) ----------
    def start_producer(self, concurrency: int, max_staleness: int, inflight: str, version: int) -> None:
        from rlvr.rollout.producer import make_producer

        self.producer = make_producer(self.rollout, concurrency, max_staleness, inflight, version=version)

    def next_batch(self, rollout_id: int) -> RolloutBatch:
        return self.producer.next_batch(rollout_id)

    def push_weights(self, refs: list, version: int) -> None:
        """``refs`` = [weights ref] (in a list: the producer's thread hands the ref to the engines)."""
        self.producer.update_weights(refs[0], version)

    def wait_for_weights(self) -> None:
        self.producer.wait_for_weights()

    def producer_data_state(self) -> dict:
        return self.producer.data_state()

    def pending_groups(self) -> list:
        return self.producer.pending_groups()

    def close_producer(self) -> None:
        self.producer.close()

    def health(self) -> list[bool]:
        return self.engines.health()

    def data_source_state(self) -> dict:
        return self.rollout.data_source.state_dict()

    def load_data_source_state(self, state: dict) -> None:
        self.rollout.data_source.load_state_dict(state)

    def rng_state(self) -> list[torch.Tensor]:
        return self.engines.rng_state()

    def set_rng_state(self, states: list[torch.Tensor]) -> None:
        self.engines.set_rng_state(states)

    def engine_pids(self) -> list[int | None]:
        return self.engines.pids()

    def engine_events(self) -> list[dict]:
        """Fault tolerance's down / restarted / removed events (empty without it)."""
        return list(getattr(self.engines, "events", []))

    def engine_actors(self) -> list:
        """The engine actors' handles (tests ask an engine directly while this actor is busy sampling)."""
        return list(self.engines.actors)


class _Remote:
    """A driver-side stand-in whose methods are calls to the manager (``data_source``, ``engine``)."""

    def __init__(self, manager, **methods: str):
        self._manager, self._methods = manager, methods

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self._methods:
            raise AttributeError(name)
        method = getattr(self._manager, self._methods[name])
        return lambda *args: get_one(method.remote(*args))


class RayRollout:
    """The loop's rollout in Ray mode."""

    def __init__(self, cfg: Config, pg, p: Plan, cwd: str):
        self.cfg = cfg
        self.manager = ray.remote(RolloutManager).options(num_cpus=0).remote(cfg, pg, p, cwd)
        self.num_engines = 0
        self.data_source = _Remote(self.manager, state_dict="data_source_state", load_state_dict="load_data_source_state")
        self.engine = _Remote(self.manager, rng_state="rng_state", set_rng_state="set_rng_state")
        self.last_checksums: list[str | None] = []

    def setup(self) -> None:
        """Wait for the manager and every engine to load."""
        self.num_engines = get_one(self.manager.ready.remote())

    def generate(self, rollout_id: int) -> RolloutBatch:
        return get_one(self.manager.generate.remote(rollout_id))

    def evaluate(self, name: str, records: list[PromptRecord], cfg: EvalConfig) -> dict[str, float]:
        return get_one(self.manager.evaluate.remote(name, records, cfg))

    def update_weights(self, weights: WeightsRef, version: int) -> None:
        if weights.broadcast:  # rank 0 is sending (weights.checksum is its call): the engines receive now
            call = self.manager.receive_weights.remote([weights.checksum], version,
                                                       self.cfg.cluster.check_weight_update_equal)
            self.last_checksums = get_all([call, weights.checksum, *weights.others])[0]
            return
        call = self.manager.update_weights.remote([weights.weights, weights.checksum], version)
        self.last_checksums = get_all([call, *weights.others])[0]

    def join_broadcast(self, host: str, port: int, rank_joins: list) -> None:
        """The engines join rank 0's broadcast group while the ranks' ``rank_joins`` calls run
        (rank 0 joins; every rank takes part in gathering the specs)."""
        _, specs, *_ = get_all([self.manager.join_broadcast.remote(host, port), *rank_joins])
        get_one(self.manager.set_broadcast_specs.remote(specs))

    def restart_engine(self, i: int) -> None:
        get_one(self.manager.restart_engine.remote(i))

    def async_source(self, concurrency: int, max_staleness: int, inflight: str, version: int) -> RayAsyncSource:
        """``--async``: the producer on the manager actor; the driver's batch source is a proxy."""
        get_one(self.manager.start_producer.remote(concurrency, max_staleness, inflight, version))
        return RayAsyncSource(self.manager)

    def health(self) -> list[bool]:
        return get_one(self.manager.health.remote())

    def close(self) -> None:
        ray.kill(self.manager)

    def engine_pids(self) -> list[int | None]:
        return get_one(self.manager.engine_pids.remote())

    def engine_events(self) -> list[dict]:
        return get_one(self.manager.engine_events.remote())

    def engine_actors(self) -> list:
        return get_one(self.manager.engine_actors.remote())


class RayAsyncSource(BatchSource):
    """The loop's batch source under ``--ray --async``: each method one call to the producer on
    the rollout manager (the same contract as ``rlvr.rollout.producer.AsyncProducer``)."""

    def __init__(self, manager):
        self.manager = manager

    def next_batch(self, rollout_id: int) -> RolloutBatch:
        return get_one(self.manager.next_batch.remote(rollout_id))

    def update_weights(self, weights: WeightsRef, version: int) -> None:
        get_all(weights.others)  # every rank has finished the call that produced the weights
        get_one(self.manager.push_weights.remote([weights.weights], version))

    def wait_for_weights(self) -> None:
        get_one(self.manager.wait_for_weights.remote())

    def data_state(self) -> dict:
        return get_one(self.manager.producer_data_state.remote())

    def pending_groups(self) -> list:
        return get_one(self.manager.pending_groups.remote())

    def close(self) -> None:
        get_one(self.manager.close_producer.remote())
