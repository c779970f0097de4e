"""Where each actor goes: one Ray placement group for the whole run.

``plan(cluster, num_engines)`` is a pure function of the config (tested without Ray):

* **disaggregated**: ``N`` training bundles then ``M`` engine bundles; every actor owns its bundle.
* **colocated** (``--colocate``): only the ``N`` training bundles; engine ``i`` shares bundle
  ``i % N`` with training rank ``i % N``. Each side takes a fraction of the bundle's resources so
  Ray packs them together; the loop time-shares them (engines sleep while the trainer trains, the
  trainer offloads what it can while engines sample).

A CPU bundle is ``{"CPU": 1}``: a logical CPU, since Ray lets a local cluster declare more CPUs
than the machine has cores (``start`` sizes it to the bundles). A GPU bundle is
``{"CPU": 1, "GPU": 1}`` (``--actor-num-gpus-per-node`` for the ranks, ``--rollout-num-gpus`` for
disaggregated engines, one GPU each). Colocated, an engine asks for the same fraction of its
bundle's GPU as of its CPU, so Ray gives it the rank's GPU id (``CUDA_VISIBLE_DEVICES``) and the
two processes share that GPU. An actor in a GPU bundle computes on ``cuda`` (``rlvr.core.device.for_actor``);
training ranks on GPUs form an NCCL group, on CPUs a gloo one (``rlvr.core.device.process_group_backend``).
``start`` refuses a plan that needs more GPUs than the machine (or the ``--ray-address`` cluster)
has, naming the flags. The rollout manager is a light actor outside the group (0 CPUs).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from rlvr.config.cluster import ClusterConfig
from rlvr.core.registry import WORKDIR_ENV

log = logging.getLogger(__name__)

# Environment of every actor: quiet model loading, one intra-op thread per rank on CPU (ranks
# would otherwise fight over the cores), the driver's working directory for relative paths.
ACTOR_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false",
             "OMP_NUM_THREADS": "1"}
# System settings of a local cluster rlvr starts. Ray starts its workers at niceness 15, below the
# driver; here the actors (trainer ranks, engines) do the run's work, so they keep the driver's
# priority instead of yielding the CPU to every other process on a shared machine.
LOCAL_RAY_SYSTEM_CONFIG = {"worker_niceness": 0}


@dataclass(frozen=True)
class Plan:
    bundles: list[dict[str, float]]
    train_bundles: list[int]  # bundle of training rank r
    engine_bundles: list[int]  # bundle of engine i
    train_share: float  # fraction of its bundle's CPU (and GPU, if any) a training rank asks for
    engine_share: float  # fraction of its bundle's CPU (and GPU, if any) an engine asks for

    @property
    def num_cpus(self) -> float:
        return sum(b.get("CPU", 0) for b in self.bundles)

    @property
    def num_gpus(self) -> int:
        return int(sum(b.get("GPU", 0) for b in self.bundles))

    def train_gpus(self, rank: int) -> float:
        """GPU fraction training rank ``rank`` asks for (0 in a CPU bundle)."""
        return self.train_share * self.bundles[self.train_bundles[rank]].get("GPU", 0)

    def engine_gpus(self, i: int) -> float:
        """GPU fraction engine ``i`` asks for (0 in a CPU bundle)."""
        return self.engine_share * self.bundles[self.engine_bundles[i]].get("GPU", 0)


def plan(cluster: ClusterConfig, num_engines: int) -> Plan:
    """The bundles of ``cluster.train_world_size`` ranks and ``num_engines`` engines.

    >>> p = plan(ClusterConfig(ray=True, actor_num_cpu_workers_per_node=2), 2)
    >>> len(p.bundles), p.train_bundles, p.engine_bundles, p.train_share
    (4, [0, 1], [2, 3], 1.0)
    >>> p = plan(ClusterConfig(ray=True, actor_num_cpu_workers_per_node=2, colocate=True), 3)
    >>> len(p.bundles), p.engine_bundles, p.train_share, p.engine_share
    (2, [0, 1, 0], 0.5, 0.25)
    >>> p = plan(ClusterConfig(ray=True, actor_num_gpus_per_node=2, rollout_num_gpus=1), 1)
    >>> p.bundles, p.num_gpus, p.engine_gpus(0)
    ([{'CPU': 1.0, 'GPU': 1.0}, {'CPU': 1.0, 'GPU': 1.0}, {'CPU': 1.0, 'GPU': 1.0}], 3, 1.0)
    """
    n = cluster.train_world_size

    def bundle(gpus: int) -> dict[str, float]:
        return {"CPU": 1.0, "GPU": float(gpus)} if gpus else {"CPU": 1.0}

    if cluster.colocate:
        per_bundle = -(-num_engines // n)  # engines sharing the busiest bundle
        return Plan([bundle(cluster.gpus_per_train_rank) for _ in range(n)], list(range(n)),
                    [i % n for i in range(num_engines)], train_share=0.5, engine_share=0.5 / per_bundle)
    bundles = [bundle(cluster.gpus_per_train_rank) for _ in range(n)]
    bundles += [bundle(cluster.gpus_per_engine) for _ in range(num_engines)]
    return Plan(bundles, list(range(n)), list(range(n, n + num_engines)), train_share=1.0, engine_share=1.0)


def gpu_shortage(cluster: ClusterConfig, p: Plan, have: int) -> str | None:
    """Why ``have`` GPUs cannot hold the plan, in terms of the flags that asked for them (None: they can).

    >>> print(gpu_shortage(ClusterConfig(ray=True, actor_num_gpus_per_node=4, colocate=True), plan(  # doctest: +ELLIPSIS
    ...     ClusterConfig(ray=True, actor_num_gpus_per_node=4, colocate=True), 4), 0))
    --actor-num-gpus-per-node 4 x --actor-num-nodes 1 (4 training ranks, engines colocated on their GPUs) asks for 4 GPUs; ...
    """
    if p.num_gpus <= have:
        return None
    c = cluster
    parts = []
    if c.actor_num_gpus_per_node:
        engines = ("engines colocated on their GPUs" if c.colocate
                   else "engines on their own GPUs" if c.rollout_num_gpus else "engines on CPU")
        parts.append(f"--actor-num-gpus-per-node {c.actor_num_gpus_per_node} x --actor-num-nodes {c.actor_num_nodes} "
                     f"({c.train_world_size} training ranks, {engines})")
    if c.rollout_num_gpus and not c.colocate:
        parts.append(f"--rollout-num-gpus {c.rollout_num_gpus}")
    return f"{' + '.join(parts)} asks for {p.num_gpus} GPUs; this machine has {have}"


def start(cluster: ClusterConfig, p: Plan) -> bool:
    """Connect to ``--ray-address`` or start a local cluster sized to the plan (plus one CPU of
    slack); returns True when this call started Ray (and so must stop it). A Ray already running
    in this process (tests share one) is used as it is."""
    import ray

    from rlvr.core.device import cuda_count
    from rlvr.core.errors import ConfigError
    from rlvr.core.testing import LOGICAL_GPUS_ENV, logical_gpus

    if ray.is_initialized():
        check_cluster_gpus(cluster, p)
        return False
    if not cluster.ray_address:  # a local cluster: the GPUs are this machine's
        short = gpu_shortage(cluster, p, cuda_count())
        if short:
            raise ConfigError("--actor-num-gpus-per-node" if cluster.actor_num_gpus_per_node else "--rollout-num-gpus",
                              f"{short}; run where the GPUs are (or join such a cluster with --ray-address), or train "
                              "on CPU: drop the GPU flags and use --actor-num-cpu-workers-per-node / --rollout-num-engines")
    env = {"env_vars": dict(ACTOR_ENV)}
    env["env_vars"][WORKDIR_ENV] = os.environ.get(WORKDIR_ENV, os.getcwd())  # the user's module:fn imports in the actors
    if logical_gpus() is not None:  # placement tests: the actors must see the seam too
        env["env_vars"][LOGICAL_GPUS_ENV] = str(logical_gpus())
    if cluster.ray_address:
        ray.init(address=cluster.ray_address, runtime_env=env, log_to_driver=True)
        check_cluster_gpus(cluster, p)
    else:
        gpus = {"num_gpus": logical_gpus()} if logical_gpus() is not None else {}
        ray.init(num_cpus=int(p.num_cpus) + 1, runtime_env=env, include_dashboard=False, log_to_driver=True,
                 _system_config=dict(LOCAL_RAY_SYSTEM_CONFIG), **gpus)
    return True


def check_cluster_gpus(cluster: ClusterConfig, p: Plan) -> None:
    """Refuse a plan the running Ray cluster has too few GPUs for (before waiting on the group)."""
    import ray

    from rlvr.core.errors import ConfigError

    have = int(ray.cluster_resources().get("GPU", 0))
    short = gpu_shortage(cluster, p, have)
    if short:
        raise ConfigError("--actor-num-gpus-per-node" if cluster.actor_num_gpus_per_node else "--rollout-num-gpus",
                          short.replace("this machine has", "the Ray cluster has"))


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


def in_bundle(pg, index: int, cpus: float, gpus: float = 0.0) -> dict:
    """``.options(...)`` of an actor placed in bundle ``index`` of ``pg``, asking ``cpus`` (and
    ``gpus``) of it."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"num_cpus": cpus, "num_gpus": gpus, "scheduling_strategy": PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=index)}


def actor_setup(cwd: str) -> None:
    """First thing in every actor: the driver's working directory and one torch thread."""
    import torch

    os.chdir(cwd)
    torch.set_num_threads(1)


def placement_info(device) -> dict:
    """What an actor learned from Ray about its place: GPU ids, ``CUDA_VISIBLE_DEVICES``, its
    device (placement tests read it)."""
    import ray

    return {"gpu_ids": [str(g) for g in ray.get_gpu_ids()], "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device": str(device), "node": ray.get_runtime_context().get_node_id()}
