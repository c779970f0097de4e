"""Where each actor goes: one Ray placement group for the whole run (seed 003 §2).

``plan(cluster, num_engines)`` is a pure function of the config (tested without Ray):

* **disaggregated**: ``N`` training bundles then ``M`` engine bundles; every actor owns its bundle.
* **colocated** (``--colocate``): only the ``N`` training bundles; engine ``i`` shares bundle
  ``i % N`` with training rank ``i % N``. Each side takes a fraction of the bundle's resources so
  Ray packs them together; the loop time-shares them (engines sleep while the trainer trains, the
  trainer offloads what it can while engines sample).

A CPU bundle is ``{"CPU": 1}``: a logical CPU, since Ray lets a local cluster declare more CPUs
than the machine has cores (``start`` sizes it to the bundles). A GPU bundle would be
``{"GPU": 1, "CPU": 1}``; ``ClusterConfig.validate`` refuses GPUs until the trainer and engine
have device placement. The rollout manager is a light actor outside the group (0 CPUs).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from rlvr.distributed.config import ClusterConfig

log = logging.getLogger(__name__)

# Environment of every actor: quiet model loading, one intra-op thread per rank on CPU (ranks
# would otherwise fight over the cores), the driver's working directory for relative paths.
ACTOR_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false",
             "OMP_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Plan:
    bundles: list[dict[str, float]]
    train_bundles: list[int]  # bundle of training rank r
    engine_bundles: list[int]  # bundle of engine i
    train_share: float  # fraction of its bundle's CPU a training rank asks for
    engine_share: float  # fraction of its bundle's CPU an engine asks for

    @property
    def num_cpus(self) -> float:
        return sum(b.get("CPU", 0) for b in self.bundles)


def plan(cluster: ClusterConfig, num_engines: int) -> Plan:
    """The bundles of ``cluster.train_world_size`` ranks and ``num_engines`` engines.

    >>> p = plan(ClusterConfig(ray=True, actor_num_cpu_workers_per_node=2), 2)
    >>> len(p.bundles), p.train_bundles, p.engine_bundles, p.train_share
    (4, [0, 1], [2, 3], 1.0)
    >>> p = plan(ClusterConfig(ray=True, actor_num_cpu_workers_per_node=2, colocate=True), 3)
    >>> len(p.bundles), p.engine_bundles, p.train_share, p.engine_share
    (2, [0, 1, 0], 0.5, 0.25)
    """
    n = cluster.train_world_size
    bundle = {"CPU": 1.0}
    if cluster.colocate:
        per_bundle = -(-num_engines // n)  # engines sharing the busiest bundle
        return Plan([dict(bundle) for _ in range(n)], list(range(n)), [i % n for i in range(num_engines)],
                    train_share=0.5, engine_share=0.5 / per_bundle)
    return Plan([dict(bundle) for _ in range(n + num_engines)], list(range(n)), list(range(n, n + num_engines)),
                train_share=1.0, engine_share=1.0)


def start(cluster: ClusterConfig, p: Plan) -> bool:
    """Connect to ``--ray-address`` or start a local cluster sized to the plan (plus one CPU of
    slack); returns True when this call started Ray (and so must stop it). A Ray already running
    in this process (tests share one) is used as it is."""
    import ray

    if ray.is_initialized():
        return False
    env = {"env_vars": dict(ACTOR_ENV)}
    if cluster.ray_address:
        ray.init(address=cluster.ray_address, runtime_env=env, log_to_driver=True)
    else:
        ray.init(num_cpus=int(p.num_cpus) + 1, runtime_env=env, include_dashboard=False, log_to_driver=True)
    return True


def placement_group(p: Plan, timeout_s: float = 120.0):
    """Reserve the plan's bundles (PACK: on as few nodes as possible); fails naming the bundles
    when the cluster cannot hold them."""
    import ray
    from ray.util.placement_group import placement_group as make

    pg = make(p.bundles, strategy="PACK")
    if not ray.get(pg.ready(), timeout=timeout_s):
        raise RuntimeError(f"Ray could not place {len(p.bundles)} bundles {p.bundles[0]} within {timeout_s:.0f} s; "
                           f"cluster resources: {ray.cluster_resources()}")
    return pg


def in_bundle(pg, index: int, cpus: float) -> dict:
    """``.options(...)`` of an actor placed in bundle ``index`` of ``pg``, asking ``cpus`` of it."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"num_cpus": cpus, "scheduling_strategy": PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=index)}


def actor_setup(cwd: str) -> None:
    """First thing in every actor: the driver's working directory and one torch thread."""
    import torch

    os.chdir(cwd)
    torch.set_num_threads(1)
