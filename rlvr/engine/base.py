"""The engine protocol: what the rollout layer asks of any inference engine.

An engine turns token-id prompts into sampled responses and returns, for every sampled token,
its log-probability under the sampling distribution (temperature applied) — the behaviour
policy q — and the weight version that produced it. The embedded engine
(``rlvr.engine.local.embedded``) implements it in-process; ``rlvr.engine.remote.client.HttpEngine`` speaks
SGLang's HTTP protocol to ``rlvr serve`` or a real SGLang server behind the same methods.

Finish reasons: ``stop`` (a stop token id or stop string), ``length`` (``max_new_tokens``),
``abort`` (``abort()`` or a cancelled call; the tokens so far come back), ``error`` (the
request failed; ``meta["error"]`` says why — the rollout marks the sample FAILED).

Every ability a caller uses is on the protocol: ``stream``, ``stats``, ``rng_state`` /
``set_rng_state`` and ``close`` have defaults (one increment, none, None, nothing), which an engine
gets by naming ``Engine`` as its base.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterable, Mapping, Protocol

import torch

FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings (names follow SGLang's ``sampling_params``)."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings: finish once the decoded response contains one
    seed: int | None = None  # per-request sampling seed (SGLang's ``sampling_seed``); None = engine's stream
    # SGLang's request-level ``top_logprobs_num``: with every token, the k most likely tokens and their
    # log-probs under the sampling distribution (score centering's head); 0 = none
    top_logprobs_num: int = 0

    def check(self) -> None:
        """Raise ValueError naming the bad field (the server turns it into HTTP 400)."""
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.top_logprobs_num < 0:
            raise ValueError(f"top_logprobs_num must be >= 0, got {self.top_logprobs_num}")


@dataclass
class GenerateRequest:
    prompt_ids: list[int]
    params: SamplingParams
    rid: str = ""  # request id, echoed back; abort(rid) aborts just this request
    session: str = ""  # multi-turn: every request of one session goes to the same engine (prefix cache reuse)


@dataclass
class GenerateResult:
    rid: str
    token_ids: list[int]
    log_probs: list[float]  # one per token in token_ids, under q (temperature applied)
    finish_reason: str  # one of FINISH_REASONS
    weight_version: int  # version of the last token (the engine's version when none was sampled)
    meta: dict = field(default_factory=dict)
    weight_versions: list[int] = field(default_factory=list)  # one per token in token_ids
    # R3: [len(prompt) + len(token_ids) - 1, MoE layers, k] expert ids the router chose at every
    # position the engine ran (the last sampled token is never fed); None unless asked for
    routed_experts: torch.Tensor | None = None
    # score centering: per token, the ``top_logprobs_num`` most likely token ids and their log-probs (q)
    top_token_ids: list[list[int]] = field(default_factory=list)
    top_log_probs: list[list[float]] = field(default_factory=list)


class Engine(Protocol):
    """What the rollout, the agents and the driver call on an engine. An engine class names it as its
    base (``class HttpEngine(Engine)``) and so gets the defaults of the abilities it has no use for;
    callers call every method here on any engine, never probing for one."""

    _version: int = 0  # the weight version the engine holds (set by ``update_weights``)

    @property
    def weight_version(self) -> int:
        return self._version

    async def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        """Sample every request; many concurrent calls are batched together, and each call
        returns as soon as its own requests are done (one result per request, in order)."""
        ...

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None: ...

    def abort(self, rid: str | None = None) -> None:
        """Finish every in-flight request (or the one with ``rid``) with reason ``abort``."""
        ...

    def health(self) -> bool: ...

    def sleep(self) -> None:
        """Release the engine's weights memory (colocated with a trainer); nothing may be in flight."""
        ...

    def wake(self) -> None:
        """Undo ``sleep``; the weights must be pushed with ``update_weights`` before generating."""
        ...

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateResult]:
        """``request``'s result in increments: ``GenerateResult``s of the tokens sampled since the
        last one (finish reason ``""``), then one with the finish reason and no token. By default the
        whole result is one increment (an engine that streams token by token overrides it)."""
        (r,) = await self.generate([request])
        if r.token_ids:
            yield GenerateResult(r.rid, list(r.token_ids), list(r.log_probs), "", r.weight_version, {},
                                 list(r.weight_versions) or [r.weight_version] * len(r.token_ids))
        yield GenerateResult(r.rid, [], [], r.finish_reason, r.weight_version, r.meta, [])

    def stats(self) -> dict[str, float]:
        """Cumulative counters the rollout logs with every rollout (e.g. the supervisor's
        ``rollout/engine_restarts``); none by default."""
        return {}

    def rng_state(self) -> Any:
        """The engine's sampler state for a checkpoint; None: it keeps none here (a server keeps its own)."""
        return None

    def set_rng_state(self, state: Any) -> None:
        """Restore ``rng_state``'s state (nothing to restore by default)."""

    def close(self) -> None:
        """Stop the engine at the end of the run (nothing to stop by default)."""
