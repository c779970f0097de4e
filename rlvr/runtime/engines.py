"""The engine builders: one per kind of engine (``rlvr.config.engine_kinds``), one dispatch site.

``build_engine(cfg, model, tokenizer)`` builds the kind ``cfg.engine_kind`` names with the builder
registered for it; local mode, ``rlvr eval``, ``rlvr agents check`` and Ray's engine actors all come
here, so an engine is put together in one place whatever process it runs in. Adding a kind of engine
is a row in ``rlvr.config.engine_kinds.KINDS`` and a builder here, nothing else. The predicates the
other builders ask (``engine_starts_from_checkpoint``, ``lora_engines_merge``) read the kind's traits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from rlvr.config import Config
from rlvr.config.engine_kinds import KINDS, EngineKind
from rlvr.core.determinism import use_deterministic_mode
from rlvr.core.registry import Registry
from rlvr.engine.base import Engine
from rlvr.train import lora

# builder(cfg, model, tokenizer, device=None, seed=None) -> Engine; ``model`` is the trainer's module
# or a checkpoint path, ``device`` / ``seed`` a Ray engine actor's own (default: the run's)
EngineBuilder = Callable[..., Engine]
ENGINE_BUILDERS: Registry[EngineBuilder] = Registry("engine kind")


def build_engine(cfg: Config, model, tokenizer, device=None, seed: int | None = None) -> Engine:
    """The engine of ``cfg.engine_kind`` on ``model`` (a module or a checkpoint path): the embedded
    engine, vLLM in process on the checkpoint, a client of the ``--rollout-external-engine-addrs``
    servers (vLLM's or SGLang-protocol, started on the same checkpoint: version 0), or supervised
    ``rlvr serve`` processes of ``--hf-checkpoint`` (the trainer starts from it too: version 0)."""
    return ENGINE_BUILDERS[cfg.engine_kind.value](cfg, model, tokenizer, device=device, seed=seed)


def checkpoint_of(cfg: Config, model) -> str | Path:
    """The checkpoint an engine that loads its own weights starts from: ``model`` when it is a path."""
    return model if isinstance(model, (str, Path)) else cfg.train.hf_checkpoint


@ENGINE_BUILDERS.register(EngineKind.EMBEDDED.value)
def embedded_engine(cfg: Config, model, tokenizer, device=None, seed: int | None = None):
    """The embedded engine on ``model`` (a module: the module itself where
    ``engine_shares_trainer_weights``, else a copy on its device; a path: loaded on ``device``),
    with ``--rollout-max-running-requests`` slots and the ``--sglang-mem-fraction-static`` memory
    budget. Local mode, Ray's engine actors and ``rlvr serve`` all build it here."""
    from rlvr.engine.local.embedded import EmbeddedEngine

    r = cfg.engine
    if cfg.run.deterministic_mode:  # before the engine's first CUDA call (rlvr.core.determinism)
        use_deterministic_mode()
    share = not isinstance(model, (str, Path)) and device is None and engine_shares_trainer_weights(cfg)
    return EmbeddedEngine(model, pad_token_id=tokenizer.pad_token_id, seed=cfg.train.seed if seed is None else seed,
                          max_batch_size=r.rollout_max_running_requests, tokenizer=tokenizer, device=device,
                          mem_fraction=r.sglang_mem_fraction_static,
                          return_routed_experts=cfg.train.use_rollout_routing_replay,
                          deterministic=cfg.run.deterministic_mode, share_weights=share)


@ENGINE_BUILDERS.register(EngineKind.VLLM.value)
def vllm_engine(cfg: Config, model, tokenizer, device=None, seed: int | None = None):
    """vLLM in this process, started on the checkpoint (version 0)."""
    from rlvr.core.device import resolve
    from rlvr.engine.local.vllm import VllmEngine

    return VllmEngine(checkpoint_of(cfg, model), seed=cfg.train.seed if seed is None else seed,
                      max_running_requests=cfg.engine.rollout_max_running_requests,
                      kv_cache_gb=cfg.engine.vllm_kv_cache_gb,
                      device=str(device if device is not None else resolve(cfg.cluster.device)), **vllm_lora(cfg))


@ENGINE_BUILDERS.register(EngineKind.VLLM_SERVERS.value)
def vllm_servers(cfg: Config, model, tokenizer, device=None, seed: int | None = None):
    """A client of vLLM's OpenAI API servers (dev mode), weights by ``--vllm-weight-transfer``."""
    import torch

    from rlvr.engine.remote.vllm_http import VllmHttpEngine
    from rlvr.engine.remote.vllm_nccl import choose_weight_transfer
    from rlvr.engine.weights import ties_head

    r = cfg.engine
    transfer = choose_weight_transfer(r.vllm_weight_transfer, torch.cuda.is_available())
    return VllmHttpEngine(r.rollout_external_engine_addrs, timeout=r.rollout_external_engine_timeout,
                          transfer=transfer, transfer_master=r.vllm_weight_transfer_master,
                          tied_head=ties_head(checkpoint_of(cfg, model)), **vllm_lora(cfg))


@ENGINE_BUILDERS.register(EngineKind.SGLANG_SERVERS.value)
def sglang_servers(cfg: Config, model, tokenizer, device=None, seed: int | None = None):
    """A client of SGLang-protocol servers (``rlvr serve``, SGLang)."""
    from rlvr.engine.remote.client import HttpEngine

    r = cfg.engine
    return HttpEngine(r.rollout_external_engine_addrs, timeout=r.rollout_external_engine_timeout,
                      retries=r.rollout_external_engine_retries, routed_experts_top_k=routed_top_k(cfg))


@ENGINE_BUILDERS.register(EngineKind.SERVE_PROCESSES.value)
def serve_processes(cfg: Config, model, tokenizer, device=None, seed: int | None = None):
    """``rlvr serve`` processes under the engine supervisor (restarted with ``--use-fault-tolerance``)."""
    from rlvr.engine.remote.processes import ServeProcesses
    from rlvr.engine.remote.supervisor import EngineSupervisor

    r = cfg.engine
    processes = ServeProcesses(checkpoint_of(cfg, model), seed=cfg.train.seed if seed is None else seed,
                               max_running_requests=r.rollout_max_running_requests,
                               log_dir=Path(cfg.run.output_dir) / "engines", routed_experts_top_k=routed_top_k(cfg),
                               deterministic=cfg.run.deterministic_mode)
    return EngineSupervisor(processes, r)


# ---- what the other builders ask about the engine (its kind's traits) ----------------------------
def engine_starts_from_checkpoint(cfg: Config) -> bool:
    """Whether the engine loads ``--hf-checkpoint`` itself (vLLM, servers, engine processes) rather
    than taking the trainer's model: with LoRA its policy then differs from the trainer's at version 0
    (an ``--lora-adapter-path`` adapter; for vLLM, no adapter loaded yet)."""
    return KINDS[cfg.engine_kind].starts_from_checkpoint


def lora_engines_merge(cfg: Config) -> bool:
    """Whether the engines take merged weights rather than LoRA adapters: SGLang-protocol servers
    and local mode's `rlvr serve` processes hold plain models; embedded engines (local or Ray actors)
    hold the LoRA-wrapped one, and vLLM serves the adapter through its LoRA route."""
    return KINDS[cfg.engine_kind].lora_route == "merged"


def vllm_lora(cfg: Config) -> dict:
    """The vLLM engines' LoRA settings: the trainer's adapter rank and alpha, or none."""
    rank, alpha = lora.rank_and_alpha(cfg.train) if lora.enabled(cfg.train) else (0, None)
    return {"lora_rank": rank, "lora_alpha": alpha}


def engine_shares_trainer_weights(cfg: Config) -> bool:
    """Whether local mode's embedded engine samples from the trainer's own module rather than a
    copy of it (one float32 copy of the weights fewer): in a synchronous run sampling and training
    take turns, and with ``--update-weights-interval 1`` every rollout is sampled from the latest
    weights, which are then the trainer's. Not under ``--async`` (the two run at once),
    ``--colocate`` (the engine's sleep frees its weights) or R3 (the engine's routing recorder
    would also record the trainer's forwards)."""
    a = cfg.asynchronous
    return (not cfg.cluster.ray and not a.async_train and a.update_weights_interval == 1 and not cfg.cluster.colocate
            and not cfg.train.use_rollout_routing_replay)


def routed_top_k(cfg: Config) -> int:
    """R3 with engine servers: the experts per token the servers' routing comes in (0 = not asked for)."""
    if not cfg.train.use_rollout_routing_replay:
        return 0
    config = json.loads((Path(cfg.train.hf_checkpoint) / "config.json").read_text())
    return int(config.get("text_config", config)["num_experts_per_tok"])
