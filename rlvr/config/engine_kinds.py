"""The kinds of rollout engine, stated once: which one a config asks for, and what each can do.

``resolve(engine, ray)`` reads the ``engine`` group (``--rollout-engine``,
``--rollout-external-engine-addrs``, ``--rollout-num-engines``, ``--use-fault-tolerance``) once
and names the kind; ``KINDS[kind]`` holds its traits. Validation (``rlvr.config``), the builders
(``rlvr.runtime.engines``: one builder per kind) and Ray's engine actors read the traits, never a
kind's name, so adding an engine is one row here, its ``--rollout-engine`` family and its builder.

| kind | what samples | starts from the checkpoint | LoRA route | can sleep | deterministic mode | weight route |
| --- | --- | --- | --- | --- | --- | --- |
| embedded | rlvr's engine in this process (or a Ray engine actor) | no: the trainer's module | module | yes | yes | memory |
| vllm | vLLM's ``LLMEngine`` in this process | yes | adapter | no | no | reload |
| vllm_servers | vLLM's OpenAI servers | yes | adapter | no | no | transfer |
| sglang_servers | ``rlvr serve`` or SGLang servers | yes | merged | no | yes | disk |
| serve_processes | ``rlvr serve`` processes rlvr launches and supervises | yes | merged | no | yes | disk |

LoRA routes: ``module`` (the engine holds the trainer's LoRA-wrapped module and takes its adapters),
``adapter`` (vLLM's own LoRA route takes the adapters), ``merged`` (a plain model: the adapters are
merged into the weights sent). Weight routes: ``memory`` (tensors copied in process), ``reload``
(vLLM's ``reload_weights`` on its worker), ``transfer`` (``--vllm-weight-transfer``: a file in
``/dev/shm`` or NCCL), ``disk`` (a safetensors folder the servers load: ``/update_weights_from_disk``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from rlvr.core.errors import ConfigError

if TYPE_CHECKING:
    from rlvr.config.engine import EngineConfig


class EngineKind(str, Enum):
    EMBEDDED = "embedded"
    VLLM = "vllm"
    VLLM_SERVERS = "vllm_servers"
    SGLANG_SERVERS = "sglang_servers"
    SERVE_PROCESSES = "serve_processes"


@dataclass(frozen=True)
class EngineTraits:
    """What one kind of engine is and can do (the module's table)."""

    what: str  # one line: what samples
    starts_from_checkpoint: bool  # loads --hf-checkpoint itself rather than taking the trainer's module
    lora_route: str  # module | adapter | merged (module docstring)
    can_sleep: bool  # frees its memory for a colocated trainer (--colocate)
    deterministic: bool  # --deterministic-mode holds with it
    weight_route: str  # memory | reload | transfer | disk (module docstring)
    ray_actors: bool = False  # what Ray's engine actors run (--ray)
    truncated_sampling: bool = True  # top-p / top-k log-probs over the full vocabulary, as the trainer's
    routing_replay: bool = True  # returns routed experts (R3, --use-rollout-routing-replay)
    max_lora_rank: int | None = None  # the largest --lora-rank it serves (None: any)
    why_not: dict[str, str] = field(default_factory=dict)  # flag -> why this kind refuses it


_VLLM_WHY = {
    "--ray": "Ray's engine actors are embedded engines; drop --ray",
    "--colocate": "vLLM cannot release its weights on CPU (its sleep mode is a no-op there); drop --colocate",
    "--deterministic-mode": "vLLM's per-request seeds killed the CPU engine under concurrent requests, and its "
                            "batches depend on arrival, so a run cannot be repeated bit for bit; use the embedded "
                            "engine for that",
    "--rollout-top-p": "vLLM's log-probs are renormalised over the top-p set, not the full vocabulary the trainer "
                       "compares them with; use 1 or the embedded engine",
    "--rollout-top-k": "vLLM's log-probs are renormalised over the top-k set, not the full vocabulary the trainer "
                       "compares them with; use -1 or the embedded engine",
    "--use-rollout-routing-replay": "the vLLM engine does not return routed experts here; use the embedded engine",
    "--lora-rank": "vLLM serves LoRA ranks up to 512",
}

KINDS: dict[EngineKind, EngineTraits] = {
    EngineKind.EMBEDDED: EngineTraits("rlvr's engine in this process (or a Ray engine actor)",
                                      starts_from_checkpoint=False, lora_route="module", can_sleep=True,
                                      deterministic=True, weight_route="memory", ray_actors=True),
    EngineKind.VLLM: EngineTraits("vLLM's LLMEngine in this process", starts_from_checkpoint=True,
                                  lora_route="adapter", can_sleep=False, deterministic=False, weight_route="reload",
                                  truncated_sampling=False, routing_replay=False, max_lora_rank=512, why_not=_VLLM_WHY),
    EngineKind.VLLM_SERVERS: EngineTraits("vLLM's OpenAI servers", starts_from_checkpoint=True, lora_route="adapter",
                                          can_sleep=False, deterministic=False, weight_route="transfer",
                                          truncated_sampling=False, routing_replay=False, max_lora_rank=512,
                                          why_not=_VLLM_WHY),
    EngineKind.SGLANG_SERVERS: EngineTraits("rlvr serve or SGLang servers", starts_from_checkpoint=True,
                                            lora_route="merged", can_sleep=False, deterministic=True,
                                            weight_route="disk"),
    EngineKind.SERVE_PROCESSES: EngineTraits("rlvr serve processes rlvr launches and supervises",
                                             starts_from_checkpoint=True, lora_route="merged", can_sleep=False,
                                             deterministic=True, weight_route="disk"),
}


@dataclass(frozen=True)
class Family:
    """What one ``--rollout-engine`` value means: the kind in this process, against
    ``--rollout-external-engine-addrs`` servers, and as processes rlvr launches (None: not offered)."""

    local: EngineKind
    servers: EngineKind
    processes: EngineKind | None


FAMILIES: dict[str, Family] = {
    "embedded": Family(EngineKind.EMBEDDED, EngineKind.SGLANG_SERVERS, EngineKind.SERVE_PROCESSES),
    "vllm": Family(EngineKind.VLLM, EngineKind.VLLM_SERVERS, None),
}


def resolve(engine: EngineConfig, ray: bool = False) -> EngineKind:
    """The kind of engine the ``engine`` group asks for (under ``--ray`` more engines are more actors
    of the family's own kind, not processes). A family that launches no processes refuses the flags
    that ask for them.

    >>> from rlvr.config.engine import EngineConfig
    >>> resolve(EngineConfig()).value, resolve(EngineConfig(rollout_num_engines=2)).value
    ('embedded', 'serve_processes')
    >>> resolve(EngineConfig(rollout_engine="vllm", rollout_external_engine_addrs=["h:1"])).value
    'vllm_servers'
    """
    family = FAMILIES[engine.rollout_engine]
    if engine.rollout_external_engine_addrs:
        return family.servers
    if not ray and (engine.rollout_num_engines > 1 or engine.use_fault_tolerance):
        if family.processes is None:
            raise ConfigError("--rollout-engine", f"{engine.rollout_engine} runs one engine in the training process, "
                              "or talks to servers given with --rollout-external-engine-addrs; it does not launch or "
                              "supervise server processes (drop --rollout-num-engines > 1 / --use-fault-tolerance)")
        return family.processes
    return family.local


def traits(engine: EngineConfig, ray: bool = False) -> EngineTraits:
    """``KINDS[resolve(engine, ray)]``."""
    return KINDS[resolve(engine, ray)]
