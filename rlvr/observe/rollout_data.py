"""slime's per-rollout means of the training tensors (its fourth kind of metric).

Before training on a rollout, slime's Megatron side logs, at ``rollout/step``, the mean of each
field of its rollout data: ``rollout/log_probs`` (the old policy p0), ``rollout/ref_log_probs``,
``rollout/rollout_log_probs`` (the engine's q), ``rollout/advantages``, ``rollout/returns``,
``rollout/values`` (PPO), ``rollout/rewards`` (the per-sample rewards as the estimator normalised
them, handed over by the trainer's advantage step), ``rollout/response_lengths``,
``rollout/total_lengths``, ``rollout/truncated``, and one ``rollout/<key>`` per scalar
``train_metadata`` entry (DCPO's ``rollout/dcpo_confidence``). A per-token field is averaged as
slime's ``sum_of_sample_mean``: each sample's mean over its loss-masked tokens, then the mean over
samples (a sample with no trained token counts as 0).
"""

from __future__ import annotations

from torch import Tensor


def per_rollout_mean(x: Tensor, mask: Tensor) -> float:
    """Mean over samples of each row's masked mean. x, mask: [B, T].

    >>> import torch
    >>> per_rollout_mean(torch.tensor([[1., 3.], [2., 0.]]), torch.tensor([[1., 1.], [1., 0.]]))
    2.0
    """
    mask = mask.float()
    per_sample = (x.float() * mask).sum(1) / mask.sum(1).clamp_min(1.0)
    return float(per_sample.mean()) if len(per_sample) else 0.0


def rollout_data_metrics(mask: Tensor, per_token: dict[str, Tensor | None], per_sample: dict[str, Tensor]) -> dict[str, float]:
    """``rollout/<name>`` for every per-token tensor given ([B, T], ``None`` skipped) and every
    per-sample tensor ([B], plain mean)."""
    out = {f"rollout/{k}": per_rollout_mean(v, mask) for k, v in per_token.items() if v is not None}
    out |= {f"rollout/{k}": float(v.float().mean()) for k, v in per_sample.items() if v.numel()}
    return out

