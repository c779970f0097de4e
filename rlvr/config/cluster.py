"""``ClusterConfig``: where the run's processes go (the ``cluster`` group of the typed config).

Local mode (the default) runs everything in one process. ``--ray`` places the same loop's two
sides on Ray: a training group of ``train_world_size`` ranks and ``num_engines``
rollout engines, in one placement group, disaggregated (one bundle each) or ``--colocate``d
(engines time-share the training ranks' bundles). Flag names are slime's where slime has them;
``--actor-num-cpu-workers-per-node`` and ``--rollout-num-engines`` (``EngineConfig``) are the
CPU-cluster equivalents of the GPU counts.

Devices. Local mode computes on ``--device`` (``auto``: CUDA when available;
``rlvr.core.device``); ``--colocate`` in local mode time-shares that one device between the trainer
and the embedded engine (``rlvr.runtime.colocate``). slime always runs on Ray, so its GPU counts
(``--actor-num-gpus-per-node``, ``--rollout-num-gpus``) *imply* ``--ray``: a slime command line
such as a slime script's ``--actor-num-gpus-per-node 4 --colocate`` parses as written and means four
GPU training ranks with four colocated engines on a Ray cluster; one local GPU is ``--device cuda``
(the default ``auto`` picks it), with ``--colocate`` to share it. Whether the machine has the GPUs
is checked when the cluster starts (``placement.start``), not at parse time, so a config can be
written on one machine and run on another. ``--rollout-num-gpus-per-engine`` > 1 (a
tensor-parallel engine) is refused: the embedded engine runs on one GPU; use an external SGLang
server (``--rollout-external-engine-addrs``) for TP. See docs/scaling.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.core.errors import ConfigError
from rlvr.config.fields import check_bounds, flag_of
from rlvr.config.fields import option as _f

UPDATE_WEIGHT_BUFFER_SIZE = 512 * 2**20  # slime's default bucket of a streamed weight update


@dataclass
class ClusterConfig:
    """Placement: local process, or a Ray cluster with a training group and rollout engines."""

    ray: bool = _f(False, "run the loop on Ray: training ranks and rollout engines as actors (default: one local process)")
    ray_address: str | None = _f(None, "join this existing Ray cluster (e.g. auto or host:6379); default start a local one")
    actor_num_nodes: int = _f(1, "nodes of the training group", ge=1)
    actor_num_gpus_per_node: int = _f(0, "training ranks (one GPU each) per node; > 0 implies --ray (as in slime); 0 = CPU ranks",
                                      ge=0)
    actor_num_cpu_workers_per_node: int = _f(1, "training ranks per node when no GPUs are used (one CPU bundle each)", ge=1)
    rollout_num_gpus: int = _f(0, "GPUs of all rollout engines together (> 0 implies --ray); 0 = CPU engines "
                                  "(--rollout-num-engines)", ge=0)
    rollout_num_gpus_per_engine: int = _f(1, "GPUs per rollout engine: 1 (tensor-parallel engines: use an external SGLang "
                                             "server)", ge=1)
    colocate: bool = _f(False, "trainer and engine time-share devices: local mode, the one --device; --ray, the training "
                               "ranks' bundles")
    device: str = _f("auto", "local mode: auto (CUDA when available), cpu, cuda or cuda:N; under --ray each actor "
                             "uses its bundle's device")
    offload_train: bool = _f(False, "--colocate: move the optimizer state to host memory while the engine samples")
    train_backend: str = _f("ddp", "data parallelism of the training group", ["ddp", "fsdp"])
    check_weight_update_equal: bool = _f(False, "after each weight sync, compare every engine's weight checksum with the "
                                                "trainer's")
    weight_sync: str = _f("auto", "how weights reach the engines under --ray: object_store (rank 0 -> Ray's object "
                                  "store -> engines), broadcast (a process group of rank 0 and the engines: NCCL on "
                                  "GPUs, gloo on CPU; rlvr/distributed/broadcast.py), auto (broadcast for "
                                  "disaggregated GPU engines in a synchronous run without --use-fault-tolerance, "
                                  "else object_store)", ["auto", "object_store", "broadcast"])
    update_weight_buffer_size: int = _f(UPDATE_WEIGHT_BUFFER_SIZE, "bytes per bucket of a broadcast weight sync "
                                                                   "(tensors of one dtype flattened together)", ge=1)

    @property
    def uses_gpus(self) -> bool:
        return self.actor_num_gpus_per_node > 0 or self.rollout_num_gpus > 0

    @property
    def train_world_size(self) -> int:
        """Training ranks: nodes x GPUs per node, or nodes x CPU workers per node without GPUs."""
        per_node = self.actor_num_gpus_per_node or self.actor_num_cpu_workers_per_node
        return self.actor_num_nodes * per_node

    def num_engines(self, rollout_num_engines: int) -> int:
        """Rollout engines: ``--rollout-num-engines`` on CPU, GPUs / GPUs-per-engine on GPUs;
        colocated on GPUs (slime's rule), one per training GPU."""
        if self.colocate and self.actor_num_gpus_per_node:
            return self.train_world_size
        if self.rollout_num_gpus:
            return self.rollout_num_gpus // self.rollout_num_gpus_per_engine
        return rollout_num_engines

    def validate(self) -> None:
        check_bounds(self)  # the ranges and choices declared on the fields
        from rlvr.core.device import check_spec

        check_spec(self.device)
        if self.uses_gpus and not self.ray:  # slime's GPU counts mean a Ray cluster (slime has no other mode)
            self.ray = True
        if self.offload_train and not self.colocate:
            raise ConfigError("--offload-train", "moves optimizer state out of the way of a colocated engine; "
                                                 "add --colocate or drop it")
        if not self.ray:
            placed = [n for n in ("ray_address", "check_weight_update_equal") if getattr(self, n)]
            placed += ["weight_sync"] * (self.weight_sync != "auto")
            placed += ["update_weight_buffer_size"] * (self.update_weight_buffer_size != UPDATE_WEIGHT_BUFFER_SIZE)
            placed += [n for n in ("actor_num_nodes", "actor_num_cpu_workers_per_node") if getattr(self, n) != 1]
            placed += ["train_backend"] * (self.train_backend != "ddp")
            if placed:
                raise ConfigError(flag_of(placed[0]), "only acts with --ray; add --ray or drop this flag")
            return
        if self.rollout_num_gpus_per_engine != 1:
            raise ConfigError("--rollout-num-gpus-per-engine", f"{self.rollout_num_gpus_per_engine}: an embedded "
                              "engine runs on one GPU (tensor-parallel engines are out of scope); use 1, or serve the "
                              "model with SGLang and pass --rollout-external-engine-addrs (docs/scaling.md)")
        if self.device != "auto":
            want = "GPUs (--actor-num-gpus-per-node / --rollout-num-gpus)" if self.uses_gpus else "CPU bundles"
            if self.device != "cpu" or self.uses_gpus:
                raise ConfigError("--device", f"{self.device}: under --ray every actor computes on its bundle's "
                                              f"device and this run asks for {want}; drop --device")
        if self.colocate and self.rollout_num_gpus not in (0, self.actor_num_nodes * self.actor_num_gpus_per_node):
            kind = "GPU" if self.actor_num_gpus_per_node else "CPU"
            raise ConfigError("--rollout-num-gpus", f"{self.rollout_num_gpus}: with --colocate the engines share the "
                              f"training ranks' {self.train_world_size} {kind} bundles (one engine per rank); drop it")

    @property
    def gpus_per_train_rank(self) -> int:
        return 1 if self.actor_num_gpus_per_node else 0

    @property
    def gpus_per_engine(self) -> int:
        """GPUs of one engine actor: its own under --rollout-num-gpus; colocated, the rank's it shares."""
        return 1 if self.rollout_num_gpus or (self.colocate and self.actor_num_gpus_per_node) else 0
