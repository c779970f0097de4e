"""The rollout side: prompt groups -> engine requests -> graded samples (DESIGN "Layers").

``Rollout.generate`` takes ``--rollout-batch-size`` prompts from the data source, asks the
engine for ``--n-samples-per-prompt`` responses each, grades every response with the reward
function, and returns a ``RolloutBatch`` whose consecutive ``n`` samples form a group.
``Rollout.evaluate`` runs the same path on a held-out set with the eval sampling settings.

A reward that raises is contained: the sample gets reward 0.0, its metadata records the error,
and ``rollout/reward_errors`` counts it; the run goes on.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time

from rlvr.config import EvalConfig, RolloutConfig
from rlvr.data.dataset import DataSource, PromptRecord, render_prompt
from rlvr.engine.base import Engine, GenerateRequest, GenerateResult, SamplingParams
from rlvr.rewards import RewardFn
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
        reward_fn: RewardFn,
        apply_chat_template: bool = False,
    ):
        self.cfg, self.engine, self.tokenizer = cfg, engine, tokenizer
        self.data_source, self.reward_fn = data_source, reward_fn
        self.apply_chat_template = apply_chat_template
        self._prompt_cache: dict[str, tuple[str, list[int]]] = {}
        self.stop_ids = tuple(t for t in {tokenizer.eos_token_id} if t is not None)

    # ---- what the loop calls --------------------------------------------------------------
    def generate(self, rollout_id: int) -> RolloutBatch:
        t0 = time.perf_counter()
        cfg = self.cfg
        records = self.data_source.next_prompts(cfg.rollout_batch_size)
        params = SamplingParams(
            temperature=cfg.rollout_temperature,
            top_p=cfg.rollout_top_p,
            top_k=cfg.rollout_top_k,
            max_new_tokens=cfg.rollout_max_response_len,
            stop_token_ids=self.stop_ids,
        )
        samples = self._sample(records, cfg.n_samples_per_prompt, params)
        elapsed = time.perf_counter() - t0
        metrics = rollout_metrics(samples, cfg.n_samples_per_prompt, prefix="rollout/")
        metrics["perf/rollout_time"] = elapsed
        metrics["perf/rollout_tokens_per_s"] = sum(s.response_length for s in samples) / max(elapsed, 1e-9)
        return RolloutBatch(rollout_id, samples, cfg.n_samples_per_prompt, metrics)

    def evaluate(self, name: str, records: list[PromptRecord], cfg: EvalConfig) -> dict[str, float]:
        """``eval/<name>/score`` (mean reward), ``eval/<name>`` (slime's key), truncated ratio."""
        params = SamplingParams(
            temperature=cfg.eval_temperature,
            top_p=1.0 if cfg.eval_temperature == 0 else self.cfg.rollout_top_p,
            top_k=-1 if cfg.eval_temperature == 0 else self.cfg.rollout_top_k,
            max_new_tokens=cfg.eval_max_response_len or self.cfg.rollout_max_response_len,
            stop_token_ids=self.stop_ids,
        )
        samples = self._sample(records, cfg.n_samples_per_eval_prompt, params)
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
            text = render_prompt(record.prompt, self.tokenizer, self.apply_chat_template)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self._prompt_cache[key] = (text, ids)
        return self._prompt_cache[key]

    def _sample(self, records: list[PromptRecord], n: int, params: SamplingParams) -> list[Sample]:
        samples: list[Sample] = []
        for g, record in enumerate(records):
            text, ids = self._encode(record)
            for _ in range(n):
                samples.append(
                    Sample(
                        prompt=text,
                        prompt_ids=list(ids),
                        label=record.label,
                        metadata=dict(record.metadata),
                        group_index=g,
                        index=len(samples),
                        prompt_index=record.index,
                    )
                )
        requests = [GenerateRequest(s.prompt_ids, params, rid=str(s.index)) for s in samples]
        results = asyncio.run(self.engine.generate(requests))
        for s, r in zip(samples, results, strict=True):
            self._fill(s, r)
            self._grade(s)
        return samples

    def _fill(self, s: Sample, r: GenerateResult) -> None:
        s.response_ids = list(r.token_ids)
        s.rollout_log_probs = list(r.log_probs)
        s.loss_mask = [1] * len(r.token_ids)
        s.weight_versions = [r.weight_version] * len(r.token_ids)
        s.status = _FINISH_STATUS.get(r.finish_reason, Status.FAILED)
        s.response = self.tokenizer.decode(r.token_ids, skip_special_tokens=True)

    def _grade(self, s: Sample) -> None:
        try:
            s.reward = self.reward_fn(s)
        except Exception as e:  # contained: one bad sample must not stop the run
            log.warning("reward failed for sample %d: %r", s.index, e)
            s.reward = 0.0
            s.metadata["reward_error"] = repr(e)


def rollout_metrics(samples: list[Sample], n: int, prefix: str) -> dict[str, float]:
    """Reward, length, truncation and group statistics of a list of samples."""
    rewards = [s.scalar_reward() for s in samples]
    lengths = [s.response_length for s in samples]
    groups = [rewards[i : i + n] for i in range(0, len(rewards), n)]
    m = {
        "raw_reward": statistics.fmean(rewards),
        "response_len/mean": statistics.fmean(lengths),
        "response_len/max": float(max(lengths)),
        "response_len/min": float(min(lengths)),
        "truncated_ratio": sum(s.status == Status.TRUNCATED for s in samples) / len(samples),
        "reward_errors": float(sum("reward_error" in s.metadata for s in samples)),
    }
    if n > 1:
        m["zero_std_ratio"] = sum(len(set(g)) == 1 for g in groups) / len(groups)
    return {prefix + k: v for k, v in m.items()}
