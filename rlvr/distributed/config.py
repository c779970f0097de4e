"""``ClusterConfig``: where the run's processes go (the ``cluster`` group of the typed config).

Local mode (the default) runs everything in one process. ``--ray`` places the same loop's two
sides on Ray (seed 003 §2): a training group of ``train_world_size`` ranks and ``num_engines``
rollout engines, in one placement group, disaggregated (one bundle each) or ``--colocate``d
(engines time-share the training ranks' bundles). Flag names are slime's where slime has them;
``--actor-num-cpu-workers-per-node`` and ``--rollout-num-engines`` (``EngineConfig``) are the
CPU-cluster equivalents of the GPU counts.

GPU counts are accepted by the schema (so a slime command line parses) but refused by
``validate`` for now: the trainer and the embedded engine have no device placement yet
(``rlvr/train`` builds CPU tensors), so a GPU bundle would sit idle. See docs/scaling.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.errors import ConfigError
from rlvr.fields import check_bounds, flag_of
from rlvr.fields import option as _f


@dataclass
class ClusterConfig:
    """Placement: local process, or a Ray cluster with a training group and rollout engines."""

    ray: bool = _f(False, "run the loop on Ray: training ranks and rollout engines as actors (default: one local process)")
    ray_address: str | None = _f(None, "join this existing Ray cluster (e.g. auto or host:6379); default start a local one")
    actor_num_nodes: int = _f(1, "nodes of the training group", ge=1)
    actor_num_gpus_per_node: int = _f(0, "training ranks (one GPU each) per node; 0 = CPU ranks", ge=0)
    actor_num_cpu_workers_per_node: int = _f(1, "training ranks per node when no GPUs are used (one CPU bundle each)", ge=1)
    rollout_num_gpus: int = _f(0, "GPUs of all rollout engines together; 0 = CPU engines (--rollout-num-engines)", ge=0)
    rollout_num_gpus_per_engine: int = _f(1, "GPUs per rollout engine", ge=1)
    colocate: bool = _f(False, "engines time-share the training ranks' bundles (sleep while training)")
    train_backend: str = _f("ddp", "data parallelism of the training group", ["ddp", "fsdp"])
    check_weight_update_equal: bool = _f(False, "after each weight sync, compare every engine's weight checksum with the trainer's")

    @property
    def uses_gpus(self) -> bool:
        return self.actor_num_gpus_per_node > 0 or self.rollout_num_gpus > 0

    @property
    def train_world_size(self) -> int:
        """Training ranks: nodes x GPUs per node, or nodes x CPU workers per node without GPUs."""
        per_node = self.actor_num_gpus_per_node or self.actor_num_cpu_workers_per_node
        return self.actor_num_nodes * per_node

    def num_engines(self, rollout_num_engines: int) -> int:
        """Rollout engines: ``--rollout-num-engines`` on CPU, GPUs / GPUs-per-engine on GPUs."""
        if self.rollout_num_gpus:
            return self.rollout_num_gpus // self.rollout_num_gpus_per_engine
        return rollout_num_engines

    def validate(self) -> None:
        check_bounds(self)  # the ranges and choices declared on the fields
        if not self.ray:
            placed = [n for n in ("ray_address", "colocate", "check_weight_update_equal") if getattr(self, n)]
            placed += [n for n in ("actor_num_nodes", "actor_num_cpu_workers_per_node") if getattr(self, n) != 1]
            placed += [n for n in ("actor_num_gpus_per_node", "rollout_num_gpus") if getattr(self, n)]
            placed += ["train_backend"] * (self.train_backend != "ddp")
            if placed:
                raise ConfigError(flag_of(placed[0]), "only acts with --ray; add --ray or drop this flag")
            return
        if self.rollout_num_gpus % self.rollout_num_gpus_per_engine:
            raise ConfigError("--rollout-num-gpus", f"{self.rollout_num_gpus} must be a multiple of "
                                                    f"--rollout-num-gpus-per-engine {self.rollout_num_gpus_per_engine}")
        if self.uses_gpus:
            flag = "--actor-num-gpus-per-node" if self.actor_num_gpus_per_node else "--rollout-num-gpus"
            raise ConfigError(flag, "GPU placement is not supported yet: the trainer and the embedded engine run on "
                                    "CPU only (no device placement in rlvr/train); use CPU workers "
                                    "(--actor-num-cpu-workers-per-node, --rollout-num-engines) — see docs/scaling.md")
