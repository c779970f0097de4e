"""The engine protocol: what the rollout layer asks of any inference engine.

An engine turns token-id prompts into sampled responses and returns, for every sampled token,
its log-probability under the sampling distribution (temperature applied) — the behaviour
policy q of seed 002. The embedded engine implements it in-process; server engines (SGLang,
vLLM, ``rlvr serve``) plug in behind the same methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings (names follow SGLang's ``sampling_params``)."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class GenerateRequest:
    prompt_ids: list[int]
    params: SamplingParams
    rid: str = ""  # request id, echoed back


@dataclass
class GenerateResult:
    rid: str
    token_ids: list[int]
    log_probs: list[float]  # one per token in token_ids, under q (temperature applied)
    finish_reason: str  # "stop" | "length" | "abort"
    weight_version: int
    meta: dict = field(default_factory=dict)


class Engine(Protocol):
    async def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]: ...

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None: ...

    def abort(self) -> None: ...

    def health(self) -> bool: ...

    @property
    def weight_version(self) -> int: ...
