"""Data parallelism for the trainer: one rank of a torch.distributed group (DDP or FSDP2), or
one process alone.

The trainer is written once, for a strategy object it asks these things;
``SingleProcess`` answers them for one process (the whole batch, nothing to synchronise: every run
outside ``--ray``, and the PPO critic, which config validation keeps out of ``--ray``), and
``DataParallel`` for one rank:

* ``wrap(model)`` -> the module its policy forwards go through: ``LogProbModule`` (the packed
  log-prob forward as one ``forward``, so DDP's and FSDP2's forward hooks run; the trainer's
  log-prob code calls the decoder and the output layer separately, which would bypass them)
  under ``DistributedDataParallel`` or ``fully_shard`` (each decoder layer, then the root).
* ``share(idx, lengths)`` -> this rank's part of a global batch: ``data_parallel_split``
  (``--balance-data``: Karmarkar–Karp by token count; else contiguous slices).
* ``agree_count(n)`` -> the largest micro-batch count of any rank: DDP's gradient hooks and FSDP2's
  all-gathers are collectives, so every rank must run as many forwards/backwards
  (``batching.micro_batches(min_count=...)`` then never makes an empty bucket; it refuses instead).
* ``all_reduce_sum_(tensor)``: metrics and per-sample log-probs of the whole batch (rows of other
  ranks are zero on each rank, so the sum is the full tensor).
* ``full_weights(model)`` / ``optimizer_state`` / ``load_*``: whole tensors for weight sync and
  checkpoints, gathered from FSDP2's shards (a collective: every rank calls it).

Exactness: the loss of every micro-batch is divided by the *global* batch's denominator (as in
one process), so the per-rank gradients sum to the single-process gradient; DDP and FSDP2
average over ranks, so each rank scales its loss by the world size (``loss_scale``). Tested in
tests/test_ray.py against a single-process trainer on the same batch.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from rlvr.train.batching import balanced_partitions, data_parallel_split
from rlvr.train.logprobs import response_log_probs


class LogProbModule(torch.nn.Module):
    """``response_log_probs`` of ``model`` as a module's forward (what DDP/FSDP2 wrap)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, samples, temperature: float, width: int, with_entropy: bool, chunk: int, packed: bool,
                share_prompts: bool, heads: bool = False, kl_ref=None):
        return response_log_probs(self.model, samples, temperature, width, with_entropy, chunk, packed=packed,
                                  share_prompts=share_prompts, heads=heads, kl_ref=kl_ref)


class SingleProcess:
    """One process, the whole batch: the strategy with nothing to share or synchronise."""

    rank, world_size, loss_scale = 0, 1, 1.0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return LogProbModule(model)

    def no_sync(self, wrapped: torch.nn.Module, last: bool):
        return contextlib.nullcontext()

    def share(self, idx: list[int], lengths: list[int]) -> list[int]:
        return idx

    def agree_count(self, n: int) -> int:
        return n

    def all_reduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def sum_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        return totals

    def full_weights(self, wrapped: torch.nn.Module, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in model.named_parameters()}

    def full_state_dict(self, wrapped: torch.nn.Module, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        return None  # save_pretrained reads the model itself

    def optimizer_state(self, wrapped: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        return optimizer.state_dict()

    def load(self, wrapped: torch.nn.Module, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             model_state: dict, optimizer_state: dict, strict: bool = True) -> None:
        model.load_state_dict(model_state, strict=strict)
        optimizer.load_state_dict(optimizer_state)


class DataParallel:
    def __init__(self, backend: str, balance: bool):
        if not dist.is_initialized():
            raise RuntimeError("DataParallel needs torch.distributed initialised (init_process_group) first")
        if backend not in ("ddp", "fsdp"):
            raise ValueError(f"unknown data-parallel backend {backend!r}; valid: ddp, fsdp")
        self.backend, self.balance = backend, balance
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.loss_scale = float(self.world_size)  # DDP / FSDP2 average gradients; the loss already is global
        # Where the small collectives' tensors live: NCCL reduces CUDA tensors only.
        self.device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
            else torch.device("cpu")

    # ---- the module ---------------------------------------------------------------------------
    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        module = LogProbModule(model)
        if self.backend == "ddp":
            return torch.nn.parallel.DistributedDataParallel(module)
        from torch.distributed.fsdp import fully_shard
        from transformers.modeling_layers import GradientCheckpointingLayer

        for layer in [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]:
            fully_shard(layer)
        fully_shard(module)  # the root: embeddings, final norm, output layer
        return module

    def no_sync(self, wrapped: torch.nn.Module, last: bool):
        """DDP: skip the gradient all-reduce on every micro-batch but the last (accumulate locally)."""
        if self.backend == "ddp" and not last:
            return wrapped.no_sync()
        return contextlib.nullcontext()

    # ---- the data ---------------------------------------------------------------------------
    def share(self, idx: list[int], lengths: list[int]) -> list[int]:
        """This rank's indices of ``idx``: the same count on every rank when it divides evenly."""
        if len(idx) % self.world_size == 0:
            parts = data_parallel_split(lengths, self.world_size, self.balance)
        else:  # only after overlong samples were left out: balanced, possibly unequal counts
            parts = balanced_partitions(lengths, self.world_size)
        return [idx[j] for j in parts[self.rank]]

    def agree_count(self, n: int) -> int:
        t = torch.tensor([n], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t)

    def all_reduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def sum_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        keys = sorted(totals)
        t = self.all_reduce_sum_(torch.tensor([totals[k] for k in keys], dtype=torch.float64, device=self.device))
        return dict(zip(keys, t.tolist()))

    # ---- whole tensors (weight sync, checkpoints) ----------------------------------------------
    def full_weights(self, wrapped: torch.nn.Module, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Every parameter of ``model`` (HF names), whole. FSDP2: gathered to CPU on rank 0
        (``{}`` on the other ranks; every rank must call)."""
        if self.backend == "ddp":
            return {n: p.detach() for n, p in model.named_parameters()}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        names = {n for n, _ in model.named_parameters()}
        return {k.removeprefix("model."): v for k, v in full.items() if k.removeprefix("model.") in names}

    def full_state_dict(self, wrapped: torch.nn.Module, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """``model.state_dict()`` with whole tensors (FSDP2: on rank 0 only)."""
        if self.backend == "ddp":
            return model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k.removeprefix("model."): v for k, v in full.items()}

    def optimizer_state(self, wrapped: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        """The optimizer's state dict; FSDP2: whole tensors keyed by parameter name, rank 0 only."""
        if self.backend == "ddp":
            return optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(wrapped, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load(self, wrapped: torch.nn.Module, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             model_state: dict, optimizer_state: dict, strict: bool = True) -> None:
        """Put whole tensors (read from a checkpoint by every rank) back into the (sharded) model
        and optimizer; ``strict=False``: ``model_state`` holds some parameters only (LoRA's adapters)."""
        if self.backend == "ddp":
            model.load_state_dict(model_state, strict=strict)
            optimizer.load_state_dict(optimizer_state)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, strict=strict)
        set_model_state_dict(wrapped, {"model." + k: v for k, v in model_state.items()}, options=options)
        set_optimizer_state_dict(wrapped, optimizer, optimizer_state, options=options)


Parallel = SingleProcess | DataParallel  # what the trainer and ``step.Learner`` accept
