"""The training group: N Ray actors, one ``Trainer`` each, forming one torch.distributed group.

Each ``TrainWorker`` is a rank (NCCL in GPU bundles, gloo in CPU ones: ``rlvr.core.device``) holding the ordinary
single-process ``Trainer`` with a ``DataParallel`` strategy (DDP or FSDP2, ``--train-backend``):
every rank receives the whole rollout (one object-store copy), computes the advantages of all
of it (cheap; group statistics need whole groups) and trains on its share, split by token count
with ``--balance-data`` (``rlvr/train/parallel.py``). The result equals the single-process
trainer's on the same global batch (tests/test_ray.py).

``RayTrainer`` is what the loop holds in Ray mode: ``rlvr.runtime.roles.TrainerRole`` (``train``,
``weights``, ``step``, ``save``, ``load``, ``save_hf``, ``check_bad_steps``), each fanned out to
every rank and gathered with ``get_all`` (first failure raised at once). The bad-step guard lives in
each rank's ``Trainer``; rank 0's ``train`` and ``load`` return its streak as plain data with their
results, and ``check_bad_steps`` decides on it with the guard's own function
(``rlvr.train.guard.stop_if_exhausted``).

Colocated (``--colocate``): after handing its weights over, each rank frees its gradients (the
memory the engines then use) and, with ``--offload-train``, moves AdamW's state to host memory
until its next ``train`` (DDP; refused with FSDP2). Weights go rank 0 -> object store (host
memory) -> engines, or with ``--weight-sync broadcast`` rank 0 -> engines through a process group
of their own (``rlvr/distributed/broadcast.py``). Not built yet: on-device/CUDA-IPC hand-off to
colocated engines (docs/scaling.md).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import ray
import torch

from rlvr.runtime.colocate import move_optimizer_state
from rlvr.config import Config
from rlvr.distributed.failures import get_all
from rlvr.distributed.placement import Plan, actor_setup, in_bundle, placement_info
from rlvr.distributed.weight_sync import WeightsRef, checksum, from_store, to_store
from rlvr.train.guard import stop_if_exhausted
from rlvr.core.net import free_port
from rlvr.core.types import Sample

PROCESS_GROUP_TIMEOUT = timedelta(minutes=10)  # a rank stuck longer than this in a collective fails


class TrainWorker:
    """One training rank (a Ray actor). It holds the whole ``Config`` until ``setup`` runs the
    builder (``rlvr.runtime.build.make_trainer``, which hands the trainer its groups) in this
    process; after that it reads only the cluster group."""

    def __init__(self, cfg: Config, rank: int, world_size: int, cwd: str):
        actor_setup(cwd)
        self.cfg, self.cluster, self.rank, self.world_size = cfg, cfg.cluster, rank, world_size
        self.trainer = None
        from rlvr.core.device import for_actor

        self.device = for_actor(cfg.cluster.gpus_per_train_rank > 0)  # its bundle's GPU, else CPU

    def address(self) -> tuple[str, int]:
        """Rank 0's address for the process group's rendezvous."""
        return ray.util.get_node_ip_address(), free_port("")

    def setup(self, host: str, port: int) -> int:
        import torch.distributed as dist

        from rlvr.runtime.build import make_trainer
        from rlvr.core.device import process_group_backend
        from rlvr.train.parallel import DataParallel

        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(process_group_backend(self.device), init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.world_size, timeout=PROCESS_GROUP_TIMEOUT)
        self.trainer = make_trainer(self.cfg, DataParallel(self.cfg.cluster.train_backend, self.cfg.train.balance_data),
                                    device=self.device)
        return self.trainer.step

    def placement(self) -> dict:
        """Where Ray put this rank: its GPU ids, CUDA_VISIBLE_DEVICES, device, and the process-group
        backend ``setup`` uses (tests)."""
        from rlvr.core.device import process_group_backend

        return placement_info(self.device) | {"backend": process_group_backend(self.device)}

    def train(self, rollout_id: int, samples: list[Sample]) -> tuple[dict, list, int]:
        """Metrics, the guard's streak of skipped steps (plain tuples) and the step count."""
        if self.cluster.offload_train:  # back from the host for the step
            move_optimizer_state(self.trainer.optimizer.adamw, self.device)
        metrics = self.trainer.train(rollout_id, samples)
        return metrics, list(self.trainer.guard.streak), self.trainer.step

    def probe_log_probs(self, sequences: list) -> list[list[float]]:
        return self.trainer.probe_log_probs(sequences)

    def probe_next_log_probs(self, prompts: list):
        return self.trainer.probe_next_log_probs(prompts)

    def join_broadcast(self, host: str, port: int, world_size: int) -> list | None:
        """``--weight-sync broadcast``: rank 0 joins (hosts) the group with the engines and returns
        the specs of what it will send; the other ranks only take part in FSDP2's gather."""
        from rlvr.distributed.broadcast import WeightBroadcast, specs_of

        specs = specs_of(self.trainer.weights())
        if self.rank != 0:
            return None
        self.broadcast, self.specs = WeightBroadcast(host, port, 0, world_size, self.device), specs
        return specs

    def send_weights(self, with_checksum: bool) -> str | None:
        """``--weight-sync broadcast``: rank 0 streams the policy to the engines (which receive at
        the same time); returns its checksum when asked."""
        weights = self.trainer.weights()
        if self.rank != 0:
            return None
        self.broadcast.send(weights, self.specs, self.cluster.update_weight_buffer_size)
        return checksum(weights) if with_checksum else None

    def weights(self, with_checksum: bool) -> tuple[dict | None, str | None]:
        """Rank 0: the whole policy (and its checksum); other ranks take part in FSDP2's gather."""
        weights = self.trainer.weights()
        if self.cluster.colocate:  # the engines are about to wake in this memory
            self.trainer.model.zero_grad(set_to_none=True)
            if self.cluster.offload_train:
                move_optimizer_state(self.trainer.optimizer.adamw, "cpu")
        if self.rank != 0:
            return None, None
        # No copy here: Ray serialises the return value into the object store before this actor
        # runs anything else, so the parameters cannot change under it.
        return to_store(weights), checksum(weights) if with_checksum else None

    def gradients(self) -> dict[str, torch.Tensor] | None:
        """The last optimizer step's gradients, whole (FSDP2: gathered), on rank 0 (tests compare them)."""
        grads = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()
                 for n, p in self.trainer.model.named_parameters() if p.grad is not None}
        return grads if self.rank == 0 else None

    def save(self, directory: str, extra: dict) -> None:
        self.trainer.save(directory, extra=extra)

    def load(self, directory: str) -> tuple[dict, int, list]:
        """The checkpoint's ``extra``, the step count and the guard's restored streak."""
        extra = self.trainer.load(directory)
        return extra, self.trainer.step, list(self.trainer.guard.streak)


class RayTrainer:
    """The loop's trainer in Ray mode: the same methods, fanned out to the ranks. It hands the
    whole ``Config`` to the ``TrainWorker`` actors it starts (each builds its trainer) and keeps
    the cluster group and the checkpoint path (``save_hf``'s model)."""

    def __init__(self, cfg: Config, pg, p: Plan, cwd: str):
        self.cluster, self.hf_checkpoint = cfg.cluster, cfg.train.hf_checkpoint
        world = cfg.cluster.train_world_size
        cls = ray.remote(TrainWorker)
        self.workers = [cls.options(**in_bundle(pg, p.train_bundles[r], p.train_share, p.train_gpus(r)))
                        .remote(cfg, r, world, cwd) for r in range(world)]
        self.step = 0
        self.max_skipped = cfg.train.max_consecutive_skipped_steps
        self.skipped: list[tuple[int, int, str]] = []  # rank 0's guard streak, as its last train/load returned it

    def setup(self) -> None:
        """Form the process group and load the model on every rank (waits for the actors)."""
        host, port = get_all([self.workers[0].address.remote()])[0]
        self.step = get_all([w.setup.remote(host, port) for w in self.workers])[0]

    def train(self, rollout_id: int, samples: list[Sample]) -> dict[str, float]:
        ref = ray.put(samples)  # one copy in the object store, read by every rank
        metrics, self.skipped, self.step = get_all([w.train.remote(rollout_id, ref) for w in self.workers])[0]
        return metrics

    def weights(self) -> WeightsRef:
        """Object-store refs of rank 0's weights (never fetched by the driver); the other ranks'
        calls ride along so that a failure among them surfaces too. ``--weight-sync broadcast``:
        rank 0 starts streaming them to the engines (``RayRollout.update_weights`` has them
        receive); the ref holds no weights, only rank 0's checksum."""
        check = self.cluster.check_weight_update_equal
        if self.cluster.weight_sync == "broadcast":
            calls = [w.send_weights.remote(check) for w in self.workers]
            return WeightsRef(None, calls[0], others=calls[1:], broadcast=True)
        calls = [w.weights.options(num_returns=2).remote(check) for w in self.workers]
        weights, digest = calls[0]
        return WeightsRef(weights, digest if check else None, others=[c[0] for c in calls[1:]])

    def probe_log_probs(self, sequences: list) -> list[list[float]]:
        """Every rank runs the forward (FSDP2 gathers its shards collectively); rank 0's answer."""
        return get_all([w.probe_log_probs.remote(sequences) for w in self.workers])[0]

    def probe_next_log_probs(self, prompts: list):
        """As ``probe_log_probs``: every rank runs the forward; rank 0's answer."""
        return get_all([w.probe_next_log_probs.remote(prompts) for w in self.workers])[0]

    def join_broadcast(self, host: str, port: int, world_size: int) -> list:
        """Calls (not yet awaited: the engines join at the same time) of every rank's ``join_broadcast``."""
        return [w.join_broadcast.remote(host, port, world_size) for w in self.workers]

    def broadcast_address(self) -> tuple[str, int]:
        return get_all([self.workers[0].address.remote()])[0]

    def gradients(self) -> dict[str, torch.Tensor]:
        return get_all([w.gradients.remote() for w in self.workers])[0]

    def save(self, directory: str | Path, tokenizer=None, extra: dict | None = None) -> Path:
        get_all([w.save.remote(str(directory), extra or {}) for w in self.workers])
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)
        return Path(directory)

    def load(self, directory: str | Path) -> dict:
        extra, self.step, self.skipped = get_all([w.load.remote(str(directory)) for w in self.workers])[0]
        return extra

    def save_hf(self, tokenizer, directory: str | Path) -> Path:
        """The current policy as a plain HF checkpoint (``--save-hf``): rank 0's weights, fetched
        once into a model on the driver (``TrainerRole.save_hf``)."""
        from transformers import AutoModelForCausalLM

        from rlvr.train.trainer import save_hf

        ref = self.weights()
        weights = from_store(get_all([ref.weights, *ref.others])[0])
        model = AutoModelForCausalLM.from_pretrained(self.hf_checkpoint, dtype=torch.float32)
        model.load_state_dict(weights, strict=False)  # tied aliases (lm_head = embeddings) follow
        return save_hf(model, tokenizer, directory)

    def check_bad_steps(self, skipped_path) -> None:
        """Stop on the streak rank 0 returned with the last ``train`` or ``load`` (``TrainerRole``)."""
        stop_if_exhausted(self.skipped, self.max_skipped, skipped_path)

    def close(self) -> None:
        for w in self.workers:
            ray.kill(w)
