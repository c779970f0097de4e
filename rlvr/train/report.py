"""What the trainer logs for a rollout: ``train/*`` and ``perf/*``, and slime's ``rollout/*`` means
of the training tensors (``rlvr.observe.rollout_data``). It reads what the rollout's tensors and
steps hold -- the advantage step's normalised rewards included -- and computes no algorithm."""

from __future__ import annotations

from functools import partial

import torch

from rlvr.algo import masked_mean
from rlvr.core.types import Status
from rlvr.observe.rollout_data import rollout_data_metrics
from rlvr.train import routing_replay
from rlvr.train.memory import peak_memory_gb
from rlvr.train.rollout_tensors import RolloutProgress, RolloutTensors


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked tokens (1 = perfect critic)."""
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    residual = returns - values
    var_residual = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    return float(1.0 - var_residual / var_returns.clamp(min=1e-8))


def rollout_metrics(batch: RolloutTensors, progress: RolloutProgress, steps: dict[str, list[float]],
                    skipped_steps: int, seconds: float, device) -> dict[str, float]:
    """The rollout's metrics; ``steps`` holds each optimizer step's sums."""
    n, mask = len(batch.samples), batch.mask
    metrics = {f"train/{k}": sum(v) / len(v) for k, v in steps.items()}
    metrics["train/skipped_steps"] = skipped_steps
    metrics["train/overlong_samples"] = n - len(batch.kept)
    # Samples without signal that ran no forward/backward, as a fraction of those trained on.
    metrics["perf/zero_adv_skipped_frac"] = progress.skipped / max(len(batch.kept), 1)
    scored = progress.scored(batch)  # p0 from the training forward: none for the samples it skipped
    if scored:
        log_ratio = batch.old_log_probs[scored] - batch.rollout_log_probs[scored]  # log p (trainer) - log q (engine)
        metrics["train/train_rollout_logprob_abs_diff"] = float(masked_mean(log_ratio.abs(), mask[scored]))
        # KL(q || p) per token, k3 estimator on q's own samples (Schulman 2020): (p/q - 1) - log(p/q) >= 0
        metrics["train/train_rollout_kl"] = float(masked_mean(torch.expm1(log_ratio) - log_ratio, mask[scored]))
    metrics["train/advantage_mean"] = float(masked_mean(batch.advantages, mask))
    metrics |= _rollout_data_metrics(batch, progress)
    if batch.opd_reverse_kl is not None:  # slime's name; tokens with a teacher answer
        answered = mask * ~batch.teacher_log_probs.isnan().any(dim=1, keepdim=True)
        metrics["train/opd_reverse_kl"] = float(masked_mean(batch.opd_reverse_kl, answered))
        metrics["train/opd_teacher_failures"] = int(batch.teacher_log_probs.isnan().any(dim=1).sum())
    if batch.values is not None:
        metrics["train/explained_variance"] = explained_variance(batch.values, batch.returns, mask)
    metrics["perf/train_time"] = seconds
    metrics["perf/train_tokens_per_s"] = sum(batch.samples[i].total_length for i in batch.kept) / seconds
    metrics["perf/peak_memory_gb"] = peak_memory_gb(device)
    return metrics


def replay_metrics(replay: list, samples) -> dict[str, float]:
    """``--use-rollout-routing-replay``'s metrics of the policy's replay (none without)."""
    return routing_replay.rollout_metrics(replay[0], samples) if replay else {}


def _rollout_data_metrics(batch: RolloutTensors, progress: RolloutProgress) -> dict[str, float]:
    """slime's per-rollout means (``rlvr.observe.rollout_data``), logged at ``rollout/step``."""
    samples = batch.samples
    host = partial(torch.tensor, device="cpu")  # per-sample values from the samples (reduced on their own)
    per_sample = {"rewards": batch.rewards,
                  "response_lengths": host([float(s.response_length) for s in samples]),
                  "total_lengths": host([float(s.total_length) for s in samples]),
                  "truncated": host([float(s.status == Status.TRUNCATED) for s in samples])}
    for key in (samples[0].train_metadata if samples else {}):
        if all(isinstance(s.train_metadata.get(key), (int, float)) for s in samples):
            per_sample[key] = host([float(s.train_metadata[key]) for s in samples])
    per_token = {"log_probs": batch.old_log_probs, "ref_log_probs": batch.ref_log_probs,
                 "rollout_log_probs": batch.rollout_log_probs, "advantages": batch.advantages,
                 "returns": batch.returns, "values": batch.values}
    if progress.unscored:  # p0 from the training forward: the mean over the samples that had one, if any
        per_token["log_probs"] = None
    out = rollout_data_metrics(batch.mask, per_token, per_sample)
    scored = progress.scored(batch)
    if progress.unscored and scored:
        out |= rollout_data_metrics(batch.mask[scored], {"log_probs": batch.old_log_probs[scored]}, {})
    return out
