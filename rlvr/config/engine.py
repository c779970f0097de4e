"""``EngineConfig``: which inference engines sample the rollouts and how they are supervised (the
``engine`` group of the typed config).

Local mode samples with the embedded engine in the training process (or vLLM's engine with
``--rollout-engine vllm``, ``rlvr.engine.local.vllm``), unless
``--rollout-external-engine-addrs`` names SGLang-protocol servers (``HttpEngine``), or
``--rollout-num-engines`` > 1 / ``--use-fault-tolerance`` asks for ``rlvr serve`` processes under the
engine supervisor (``rlvr.engine.remote.supervisor``). Under ``--ray`` the engines are actors, supervised
by the same supervisor with ``--use-fault-tolerance``. Which kind of engine these flags make, and
what each kind can do, is ``rlvr.config.engine_kinds``. The supervisor takes this group whole
(``EngineSupervisor.settings``), not fields unpacked by the caller. Flag names are slime's.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.core.errors import ConfigError
from rlvr.config.engine_kinds import FAMILIES, KINDS, resolve
from rlvr.config.fields import check_bounds
from rlvr.config.fields import option as _f


@dataclass
class EngineConfig:
    """Inference engines: embedded, external servers, or supervised processes / actors."""

    rollout_engine: str = _f("embedded", "engine that samples in local mode: embedded (rlvr's own) or vllm (vLLM's LLMEngine "
                                         "in this process, or the vLLM servers of --rollout-external-engine-addrs; needs "
                                         "vLLM: `make vllm` on CPU)", list(FAMILIES))
    vllm_kv_cache_gb: float = _f(1.0, "--rollout-engine vllm: GiB of memory for vLLM's KV cache (its --kv-cache-memory-bytes)",
                                 gt=0)
    vllm_weight_transfer: str = _f("reload", "--rollout-engine vllm with --rollout-external-engine-addrs: how weights reach the "
                                           "servers: reload (a safetensors file in /dev/shm, /collective_rpc reload_weights), "
                                           "nccl (vLLM's RL weight-transfer routes, CUDA only, not yet run on a GPU, so never "
                                           "the default) or auto (nccl with CUDA, else reload)", ["auto", "reload", "nccl"])
    vllm_weight_transfer_master: str = _f("127.0.0.1:0", "--vllm-weight-transfer nccl: host:port of the NCCL rendezvous the "
                                                         "trainer hosts and the servers reach (port 0: a free one)")
    rollout_max_running_requests: int = _f(256, "embedded engine: responses decoded together (batch slots)", ge=1)
    sglang_mem_fraction_static: float | None = _f(
        None, "embedded engine: fraction of the device's memory (GPU memory on CUDA, physical memory on CPU) its weights "
              "and KV cache may hold; rows wait when the next one would not fit (default: no budget)", gt=0, le=1
    )
    rollout_external_engine_addrs: list[str] = _f([], "host:port of SGLang-protocol servers (rlvr serve, SGLang) instead of "
                                                      "the embedded engine")
    rollout_external_engine_timeout: float = _f(600.0, "seconds one request may take on an external engine before it is "
                                                       "retried elsewhere", gt=0)
    rollout_external_engine_retries: int = _f(2, "retries of a request on another external engine after its server failed", ge=0)
    rollout_num_engines: int = _f(
        1, "rollout engines on CPU (on GPUs: --rollout-num-gpus / --rollout-num-gpus-per-engine); Ray actors under --ray, "
           "server processes in local mode when > 1 or with --use-fault-tolerance", ge=1
    )
    use_fault_tolerance: bool = _f(
        False, "health-check the engine server processes (engine actors under --ray); restart a dead or hung one, push it the "
               "weights, re-issue its requests"
    )
    rollout_health_check_interval: float = _f(5.0, "--use-fault-tolerance: seconds between two /health probes of an engine", gt=0)
    rollout_health_check_timeout: float = _f(
        10.0, "--use-fault-tolerance: an engine whose /health has not answered within this many seconds is killed and "
              "restarted", gt=0
    )
    rollout_max_engine_restarts: int = _f(3, "--use-fault-tolerance: an engine restarted this many times is removed (the run "
                                             "goes on with the others)", ge=0)

    policy_freshness_check: str = _f(
        "stop", "after every weight push, the engine samples a fixed probe and its log-probs are compared with the "
                "trainer's (rlvr.runtime.freshness): stop stops the run on a push that changed nothing, a version that "
                "did not advance or a gap over --policy-freshness-max-gap; warn logs and counts it; off skips the probe",
        ["stop", "warn", "off"])
    policy_freshness_max_gap: float = _f(0.1, "the largest mean |engine - trainer| log-prob over the probe's tokens a "
                                              "healthy push may show (fp32 on CPU shows ~1e-6)", gt=0)
    policy_freshness_probe_tokens: int = _f(1, "tokens the engine samples for each of the probe's prompts (1: the trainer "
                                               "scores its next-token distributions while the engine samples)", ge=1)

    def validate(self) -> None:
        check_bounds(self)  # the ranges declared on the fields
        for addr in self.rollout_external_engine_addrs:
            host, sep, port = addr.rpartition(":")
            if not (sep and host and port.isdigit()):
                raise ConfigError("--rollout-external-engine-addrs", f"{addr!r} is not host:port (e.g. 127.0.0.1:30000)")
        if self.sglang_mem_fraction_static is not None and (self.rollout_external_engine_addrs or self.uses_engine_processes):
            raise ConfigError("--sglang-mem-fraction-static", "budgets the embedded engine's memory (in process or a Ray "
                              "actor); external and rlvr serve engines manage their own: set it on those servers")
        kind = resolve(self)  # refuses processes for a family that launches none
        if self.vllm_weight_transfer == "nccl" and KINDS[kind].weight_route != "transfer":
            raise ConfigError("--vllm-weight-transfer", "nccl pushes weights to vLLM servers: it needs --rollout-engine vllm "
                              "with --rollout-external-engine-addrs (vLLM in process takes them from memory)")
        if self.use_fault_tolerance and self.rollout_external_engine_addrs:
            raise ConfigError("--use-fault-tolerance", "restarts the engine processes rlvr launches itself; it cannot restart "
                              "--rollout-external-engine-addrs servers (drop one of the two)")

    @property
    def uses_engine_processes(self) -> bool:
        """Local mode launches ``rlvr serve`` processes (instead of the embedded engine)."""
        return not self.rollout_external_engine_addrs and (self.rollout_num_engines > 1 or self.use_fault_tolerance)
