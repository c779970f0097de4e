"""The rollout side: prompt groups -> engine requests -> graded samples (DESIGN "Layers").

``Rollout.generate`` takes ``--rollout-batch-size`` prompts from the data source, asks the
engine for ``--n-samples-per-prompt`` responses each, grades every response with the reward
function, and returns a ``RolloutBatch`` whose consecutive ``n`` samples form a group.
``Rollout.evaluate`` runs the same path on a held-out set with the eval sampling settings.

Each prompt group is its own ``engine.generate`` call, all groups in flight at once; a group is
graded (``Grader.grade_group``) the moment its responses are back, so reward time hides behind
the decoding of the other groups. A reward that fails is contained by the grader: the sample gets
``--reward-failure-value``, its metadata records the reason, ``rollout/reward_errors`` counts it,
and the run goes on. Extra numeric fields of dict rewards (and a composite's parts) are logged
as ``rollout/reward/<field>``.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time

import torch

from rlvr.algo.shaping import overlong_penalty
from rlvr.config import EvalConfig, RolloutConfig
from rlvr.data.dataset import DataSource, PromptRecord, render_prompt
from rlvr.engine.base import Engine, GenerateRequest, GenerateResult, SamplingParams
from rlvr.observe.metrics import compute_statistics
from rlvr.registry import resolve
from rlvr.rewards.grader import Grader
from rlvr.rollout.filters import FILTERS
from rlvr.rollout.postprocess import POST_PROCESS
from rlvr.types import RolloutBatch, Sample, Status

log = logging.getLogger(__name__)

_FINISH_STATUS = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}


class Rollout:
    def __init__(
        self,
        cfg: RolloutConfig,
        engine: Engine,
        tokenizer,
        data_source: DataSource,
        grader: Grader,
        apply_chat_template: bool = False,
        chat_template_kwargs: dict | None = None,
    ):
        self.cfg, self.engine, self.tokenizer = cfg, engine, tokenizer
        self.data_source, self.grader = data_source, grader
        self.apply_chat_template, self.chat_template_kwargs = apply_chat_template, chat_template_kwargs
        self.group_filter = (
            resolve(FILTERS, cfg.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path")
            if cfg.dynamic_sampling_filter_path
            else None
        )
        self.post_process = (
            resolve(POST_PROCESS, cfg.custom_reward_post_process_path, "--custom-reward-post-process-path")
            if cfg.custom_reward_post_process_path
            else None
        )
        self._prompt_cache: dict[str, tuple[str, list[int]]] = {}
        self.stop_ids = tuple(t for t in {tokenizer.eos_token_id} if t is not None)

    # ---- what the loop calls --------------------------------------------------------------
    def generate(self, rollout_id: int) -> RolloutBatch:
        t0 = time.perf_counter()
        cfg, n = self.cfg, self.cfg.n_samples_per_prompt
        params = SamplingParams(
            temperature=cfg.rollout_temperature,
            top_p=cfg.rollout_top_p,
            top_k=cfg.rollout_top_k,
            max_new_tokens=cfg.rollout_max_response_len,
            stop_token_ids=self.stop_ids,
        )
        # Sample groups until enough pass the dynamic-sampling filter (one round without a filter).
        kept: list[list[Sample]] = []
        dropped: list[list[Sample]] = []
        rounds = 0
        while len(kept) < cfg.rollout_batch_size and rounds < cfg.dynamic_sampling_max_rounds:
            rounds += 1
            samples = self._sample(self.data_source.next_prompts(cfg.rollout_batch_size - len(kept)), n, params)
            for group in (samples[i : i + n] for i in range(0, len(samples), n)):
                (kept if self.group_filter is None or self.group_filter(group) else dropped).append(group)
        unfilled = cfg.rollout_batch_size - len(kept)
        if unfilled > 0:  # the batch size is part of the contract: top up with dropped groups, loudly
            log.warning("rollout %d: only %d groups passed the filter in %d rounds; %d dropped groups reused",
                        rollout_id, len(kept), rounds, unfilled)
            kept += dropped[:unfilled]
        samples = [s for group in kept for s in group]
        for i, s in enumerate(samples):
            s.index, s.group_index = i, i // n
        if self.post_process is not None:
            self.post_process(samples, self.tokenizer)
        elapsed = time.perf_counter() - t0
        metrics = rollout_metrics(samples, n, prefix="rollout/")
        metrics["perf/rollout_time"] = elapsed
        metrics["perf/rollout_tokens_per_s"] = sum(s.response_length for s in samples) / max(elapsed, 1e-9)
        if self.group_filter is not None:
            metrics["rollout/dynamic_filter/dropped_groups"] = float(len(dropped))
            metrics["rollout/dynamic_filter/rounds"] = float(rounds)
            metrics["rollout/dynamic_filter/unfilled_groups"] = float(max(unfilled, 0))
        return RolloutBatch(rollout_id, samples, n, metrics)

    def evaluate(self, name: str, records: list[PromptRecord], cfg: EvalConfig) -> dict[str, float]:
        """``eval/<name>/score`` (mean reward), ``eval/<name>`` (slime's key), truncated ratio."""
        greedy = cfg.eval_temperature == 0
        params = SamplingParams(
            temperature=cfg.eval_temperature,
            top_p=cfg.eval_top_p if cfg.eval_top_p is not None else 1.0 if greedy else self.cfg.rollout_top_p,
            top_k=cfg.eval_top_k if cfg.eval_top_k is not None else -1 if greedy else self.cfg.rollout_top_k,
            max_new_tokens=cfg.eval_max_response_len or self.cfg.rollout_max_response_len,
            stop_token_ids=self.stop_ids,
        )
        samples = self._sample(records, cfg.n_samples_per_eval_prompt, params, shape=False)
        k = cfg.n_samples_per_eval_prompt
        m = rollout_metrics(samples, k, prefix=f"eval/{name}/")
        m[f"eval/{name}/score"] = m.pop(f"eval/{name}/raw_reward")
        m[f"eval/{name}"] = m[f"eval/{name}/score"]
        if k > 1:
            groups = [samples[i : i + k] for i in range(0, len(samples), k)]
            m[f"eval/{name}/pass@{k}"] = sum(any(s.scalar_reward() > 0 for s in g) for g in groups) / len(groups)
        return m

    def update_weights(self, named_tensors, version: int) -> None:
        self.engine.update_weights(named_tensors, version)

    # ---- internals -------------------------------------------------------------------------
    def _encode(self, record: PromptRecord) -> tuple[str, list[int]]:
        key = repr(record.prompt)
        if key not in self._prompt_cache:
            text = render_prompt(record.prompt, self.tokenizer, self.apply_chat_template, self.chat_template_kwargs)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self._prompt_cache[key] = (text, ids)
        return self._prompt_cache[key]

    def _sample(
        self, records: list[PromptRecord], n: int, params: SamplingParams, shape: bool = True
    ) -> list[Sample]:
        """``n`` graded samples per record; ``shape`` applies reward shaping (training only)."""
        groups = [self._new_group(record, g, n) for g, record in enumerate(records)]
        asyncio.run(self._run_groups(groups, params, shape))
        return [s for group in groups for s in group]

    def _new_group(self, record: PromptRecord, g: int, n: int) -> list[Sample]:
        text, ids = self._encode(record)
        return [
            Sample(prompt=text, prompt_ids=list(ids), label=record.label, metadata=dict(record.metadata),
                   group_index=g, index=g * n + j, prompt_index=record.index)
            for j in range(n)
        ]

    async def _run_groups(self, groups: list[list[Sample]], params: SamplingParams, shape: bool) -> None:
        await asyncio.gather(*(self._run_group(group, params, shape) for group in groups))

    async def _run_group(self, group: list[Sample], params: SamplingParams, shape: bool) -> None:
        """Generate one group, then grade it at once: grading overlaps the other groups' decoding."""
        requests = [GenerateRequest(s.prompt_ids, params, rid=str(s.index)) for s in group]
        results = await self.engine.generate(requests)
        for s, r in zip(group, results, strict=True):
            self._fill(s, r)
        await self.grader.grade_group(group)
        for s in group:
            self._shape(s, shape)

    def _fill(self, s: Sample, r: GenerateResult) -> None:
        s.response_ids = list(r.token_ids)
        s.rollout_log_probs = list(r.log_probs)
        s.loss_mask = [1] * len(r.token_ids)
        s.weight_versions = [r.weight_version] * len(r.token_ids)
        s.status = _FINISH_STATUS.get(r.finish_reason, Status.FAILED)
        s.response = self.tokenizer.decode(r.token_ids, skip_special_tokens=True)

    def _shape(self, s: Sample, shape: bool) -> None:
        s.metadata["score"] = s.scalar_reward()  # before shaping: what accuracy is measured on
        if shape and self.cfg.overlong_buffer_len:
            penalty = float(overlong_penalty(torch.tensor([s.response_length]), self.cfg.rollout_max_response_len,
                                             self.cfg.overlong_buffer_len, self.cfg.overlong_penalty_factor))
            s.metadata["overlong_penalty"] = penalty
            if isinstance(s.reward, dict):
                s.reward["score"] = float(s.reward["score"]) + penalty
            else:
                s.reward = float(s.reward) + penalty


def rollout_metrics(samples: list[Sample], n: int, prefix: str) -> dict[str, float]:
    """Reward, length, truncation and group statistics of a list of samples."""
    rewards = [s.scalar_reward() for s in samples]
    lengths = [s.response_length for s in samples]
    groups = [rewards[i : i + n] for i in range(0, len(rewards), n)]
    m = {
        "raw_reward": statistics.fmean(rewards),
        # Fully correct responses (unshaped reward 1.0): the accuracy of 0/1 verifiers.
        "accuracy": statistics.fmean(float(s.metadata.get("score", s.scalar_reward()) >= 1.0) for s in samples),
        **{f"response_len/{k}": v for k, v in compute_statistics(lengths).items()},  # mean/median/max/min
        "truncated_ratio": sum(s.status == Status.TRUNCATED for s in samples) / len(samples),
        "reward_errors": float(sum("reward_error" in s.metadata for s in samples)),
    }
    extras: dict[str, list[float]] = {}
    for s in samples:
        if isinstance(s.reward, dict):
            for k, v in s.reward.items():
                if k != "score" and isinstance(v, (int, float)):  # bools count as 0/1
                    extras.setdefault(k, []).append(float(v))
    for k, values in extras.items():
        m[f"reward/{k}"] = statistics.fmean(values)
    if n > 1:
        m["zero_std_ratio"] = sum(len(set(g)) == 1 for g in groups) / len(groups)
    m |= source_metrics(samples)
    return {prefix + k: v for k, v in m.items()}


def source_metrics(samples: list[Sample]) -> dict[str, float]:
    """Per-source statistics, ``<source>/raw_reward`` etc., for samples whose prompt metadata
    carries ``source_name`` (a mixed dataset); ``{}`` when none does.

    >>> from rlvr.types import Sample
    >>> s = [Sample("p", [1], metadata={"source_name": "gsm8k"}, reward=1.0, response_ids=[5, 6]),
    ...      Sample("p", [1], metadata={"source_name": "math"}, reward=0.0, response_ids=[5])]
    >>> source_metrics(s)["gsm8k/raw_reward"], source_metrics(s)["math/response_len/mean"]
    (1.0, 1.0)
    """
    by_source: dict[str, list[Sample]] = {}
    for s in samples:
        if s.metadata.get("source_name") is not None:
            by_source.setdefault(str(s.metadata["source_name"]), []).append(s)
    m: dict[str, float] = {}
    for source, group in sorted(by_source.items()):
        m[f"{source}/raw_reward"] = statistics.fmean(s.scalar_reward() for s in group)
        m[f"{source}/response_len/mean"] = statistics.fmean(s.response_length for s in group)
        m[f"{source}/truncated_ratio"] = sum(s.status == Status.TRUNCATED for s in group) / len(group)
        m[f"{source}/count"] = float(len(group))
    return m
