"""The engine as an agent sees it: generate from token ids, with log-probs, one session per sample.

``EngineHandle.generate(input_ids, sampling_params)`` sends one request to the rollout's engine
and returns its ``GenerateResult`` (token ids, log-probs under q, per-token weight versions,
finish reason). Every call of one handle carries the handle's ``session`` (the sample's uid), so
an engine group routes all turns of a sample to the same engine (session affinity: its prefix
cache is reused). Once a call came back aborted (the rollout stopped, or a weight push under
``--async``), later calls of the handle return ``abort`` at once without sampling, so an agent
loop that does not check the finish reason still ends quickly; the rollout then regenerates the
sample (``rlvr.agents.hooks``).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import AsyncIterator

from rlvr.engine.base import GenerateRequest, GenerateResult, SamplingParams
from rlvr.engine.sampling import request_seed
from rlvr.engine.streaming import stream_generate

_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}


def to_sampling_params(params: SamplingParams | dict) -> SamplingParams:
    """SGLang-style dict (slime passes ``sampling_params`` as one) or ``SamplingParams``."""
    if isinstance(params, SamplingParams):
        return params
    unknown = set(params) - _FIELDS - {"skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens"}
    if unknown:
        raise ValueError(f"unknown sampling params {sorted(unknown)}; known: {sorted(_FIELDS)}")
    kw = {k: v for k, v in params.items() if k in _FIELDS}
    for k in ("stop_token_ids", "stop"):
        if k in kw:
            kw[k] = tuple([kw[k]] if isinstance(kw[k], (str, int)) else kw[k] or ())
    return SamplingParams(**kw)


class EngineHandle:
    """One sample's (session's) access to the rollout engine."""

    _ids = itertools.count()

    def __init__(self, engine, tokenizer, session: str = ""):
        self.engine, self.tokenizer = engine, tokenizer
        self.session = session or f"s{next(self._ids)}"
        self.calls = 0
        self.aborted = False

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def _request(self, input_ids: list[int], sampling_params: SamplingParams | dict) -> GenerateRequest:
        self.calls += 1
        params = to_sampling_params(sampling_params)
        if params.seed is not None and self.calls > 1:  # turn t of a seeded sample draws a stream of its own
            params = dataclasses.replace(params, seed=request_seed(params.seed, self.calls))
        return GenerateRequest(list(input_ids), params, rid=f"{self.session}#{self.calls}", session=self.session)

    async def stream(self, input_ids: list[int], sampling_params: SamplingParams | dict) -> AsyncIterator[GenerateResult]:
        """``generate`` as increments, token by token where the engine streams
        (``rlvr.engine.streaming.stream_generate``); the last one carries the finish reason."""
        if self.aborted:
            yield GenerateResult(self.session, [], [], "abort", self.engine.weight_version)
            return
        async for piece in stream_generate(self.engine, self._request(input_ids, sampling_params)):
            if piece.finish_reason == "abort":
                self.aborted = True
            yield piece

    async def generate(self, input_ids: list[int], sampling_params: SamplingParams | dict) -> GenerateResult:
        if self.aborted:
            return GenerateResult(self.session, [], [], "abort", self.engine.weight_version)
        (result,) = await self.engine.generate([self._request(input_ids, sampling_params)])
        if not result.weight_versions and result.token_ids:
            result.weight_versions = [result.weight_version] * len(result.token_ids)
        if result.finish_reason == "abort":
            self.aborted = True
        return result
