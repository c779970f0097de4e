"""The rollout side on Ray: a manager actor owning the data source, the grader and M engine actors.

``RolloutManager`` holds the ordinary ``Rollout`` (prompt groups -> requests -> graded samples,
dynamic sampling, partial rollouts: all of ``rlvr/rollout`` unchanged) whose engine is an
``EngineGroup`` (``rlvr/distributed/engines.py``): the ``Engine`` protocol over M engine actors,
each an ``EmbeddedEngine`` in its own process and bundle; with ``--use-fault-tolerance`` the
engine supervisor over them (``TolerantEngineGroup``).

Colocated (``--colocate``): after each rollout the engines ``sleep`` (their weights are freed
while the trainer trains); ``update_weights`` wakes them and loads the new weights.

``RayRollout`` is what the loop holds: ``generate``, ``evaluate``, ``update_weights``,
``data_source`` (state_dict / load_state_dict) and ``engine`` (the sampling generators' states,
for checkpoints), each one remote call to the manager.
"""

from __future__ import annotations


import ray
import torch

from rlvr.config import Config, EvalConfig
from rlvr.data.dataset import PromptRecord
from rlvr.distributed.engines import EngineGroup
from rlvr.distributed.failures import get_all, get_one
from rlvr.distributed.placement import Plan, actor_setup
from rlvr.distributed.weight_sync import WeightMismatch, WeightsRef
from rlvr.rollout.producer import BatchSource
from rlvr.core.types import RolloutBatch


class RolloutManager:
    """The rollout side in one actor: data source, grader, ``Rollout``, and the engine group.
    It receives the whole ``Config`` to run the builders in its own process (they hand each
    component its groups) and keeps only the cluster group."""

    def __init__(self, cfg: Config, pg, p: Plan, cwd: str):
        actor_setup(cwd)
        from rlvr.runtime.build import load_tokenizer, make_rollout, open_training_data

        self.cluster = cfg.cluster
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
        if self.cluster.colocate:  # the trainer trains next, in the same bundles
            self.engines.sleep()
        return batch

    def evaluate(self, name: str, records: list[PromptRecord], cfg: EvalConfig) -> dict[str, float]:
        return self.rollout.evaluate(name, records, cfg)

    def probe(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, seed: int) -> list:
        return self.rollout.probe(prompts, max_new_tokens, temperature, seed)

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
        sums = self.engines.receive_weights(self.cluster.update_weight_buffer_size, version, with_checksum=check)
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


class RayRollout:
    """The loop's rollout in Ray mode. It hands the whole ``Config`` to the ``RolloutManager``
    actor it starts (which builds there) and keeps only the cluster group."""

    def __init__(self, cfg: Config, pg, p: Plan, cwd: str):
        self.cluster = cfg.cluster
        self.manager = ray.remote(RolloutManager).options(num_cpus=0).remote(cfg, pg, p, cwd)
        self.num_engines = 0
        self.last_checksums: list[str | None] = []

    def setup(self) -> None:
        """Wait for the manager and every engine to load."""
        self.num_engines = get_one(self.manager.ready.remote())

    def generate(self, rollout_id: int) -> RolloutBatch:
        return get_one(self.manager.generate.remote(rollout_id))

    def evaluate(self, name: str, records: list[PromptRecord], cfg: EvalConfig) -> dict[str, float]:
        return get_one(self.manager.evaluate.remote(name, records, cfg))

    def probe(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, seed: int) -> list:
        return get_one(self.manager.probe.remote(prompts, max_new_tokens, temperature, seed))

    def update_weights(self, weights: WeightsRef, version: int) -> None:
        if weights.broadcast:  # rank 0 is sending (weights.checksum is its call): the engines receive now
            call = self.manager.receive_weights.remote([weights.checksum], version,
                                                       self.cluster.check_weight_update_equal)
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

    def data_state(self) -> dict:
        return get_one(self.manager.data_source_state.remote())

    def load_data_state(self, state: dict) -> None:
        get_one(self.manager.load_data_source_state.remote(state))

    def rng_state(self) -> list[torch.Tensor]:
        return get_one(self.manager.rng_state.remote())

    def set_rng_state(self, states: list[torch.Tensor] | None) -> None:
        if states is not None:
            get_one(self.manager.set_rng_state.remote(states))

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
