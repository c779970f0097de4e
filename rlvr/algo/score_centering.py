"""Score centering wired as the actor's policy loss (slime's ``--use-score-centering``).

The loss itself is ``corrections.score_centering_loss`` (derivation in its docstring): a REINFORCE
loss whose per-token score is centred by its mean under the sampler q, ``mu_w = sum_v q_v w_v s_v``,
with the sampler's top-k head H kept exactly and the tail reconstructed as ``alpha p`` (probabilities
over the full vocabulary, not renormalised on H). Here it gets its inputs and its weight rule:

* the head: ``Sample.rollout_topk_token_ids`` / ``rollout_topk_log_probs`` (q of the head tokens,
  returned by the engine with every sampled token, ``--score-centering-top-k`` of them), and the
  trainer's log-probs of the same tokens (differentiable), as a ``SamplerHead``;
* the weight ``w = f(sg(p_theta) / q)`` (REINFORCE, SC included, takes the stop-gradient
  current policy as the numerator, not p0): ``f = 1`` alone, TIS's clamp or ICE-POP's mask with
  ``--use-tis`` (``--tis-mode``, ``--tis-clip-low``, ``--tis-clip``), applied to the sampled token,
  the head tokens and the tail alike.

Metrics (per token, aggregated like the loss): ``score_centering_sampler_head_mass`` (Q_H),
``score_centering_trainer_head_mass`` (P_H), ``score_centering_sampled_token_weight`` (w_a), and
with ``--use-tis`` ``tis`` (rho = p_theta / q of the sampled token) and ``tis_clipfrac``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from rlvr.algo.corrections import TIS_MODES, score_centering_loss
from rlvr.core.types import Sample

if TYPE_CHECKING:
    from rlvr.config.algo import AlgoConfig


@dataclass
class SamplerHead:
    """The sampler's top-k head of every response token, [B, T, K] each."""

    log_probs: Tensor  # log p_theta of the head tokens (carries the gradient)
    rollout_log_probs: Tensor  # log q of the head tokens, as the engine returned them
    mask: Tensor  # 1 on real head entries, 0 on padding (tokens without a head, short heads)


def weight_rule(cfg: AlgoConfig) -> Callable[[Tensor], Tensor]:
    """f of ``w = f(p / q)``: 1, or the ``--tis-mode`` rule between ``--tis-clip-low`` and ``--tis-clip``."""
    if not cfg.use_tis:
        return torch.ones_like
    rule, low, high = TIS_MODES[cfg.tis_mode], cfg.tis_clip_low, cfg.tis_clip
    return lambda ratio: rule(ratio, low, high)


def score_centering_policy_loss(log_probs: Tensor, rollout_log_probs: Tensor, head: SamplerHead | None,
                                advantages: Tensor, cfg: AlgoConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """The per-token SC loss [B, T] (unmasked) and its per-token metrics."""
    if head is None:
        raise ValueError("--use-score-centering: the samples carry no sampler head (rollout_topk_token_ids); "
                         "the engine must return top-k log-probs (top_logprobs_num)")
    f = weight_rule(cfg)
    loss = score_centering_loss(log_probs, rollout_log_probs, head.log_probs, head.rollout_log_probs, advantages,
                                weight_fn=f, head_mask=head.mask)
    ratio = torch.exp(log_probs.detach() - rollout_log_probs)
    weight = f(ratio)
    mask = head.mask.to(log_probs.dtype)
    metrics = {
        "score_centering_sampler_head_mass": (head.rollout_log_probs.exp() * mask).sum(-1),
        "score_centering_trainer_head_mass": (head.log_probs.detach().exp() * mask).sum(-1),
        "score_centering_sampled_token_weight": weight,
    }
    if cfg.use_tis:
        metrics["tis"], metrics["tis_clipfrac"] = ratio, (weight != ratio).float()
    return loss, metrics


def head_token_ids(samples: list[Sample], width: int) -> Tensor:
    """``[B, width, K]`` long: each response token's head token ids (K = the longest head; 0-padded)."""
    k = max((len(h) for s in samples for h in s.rollout_topk_token_ids), default=1)
    out = torch.zeros(len(samples), width, k, dtype=torch.long)
    for i, s in enumerate(samples):
        for t, ids in enumerate(s.rollout_topk_token_ids):
            out[i, t, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
    return out


def head_rollout_log_probs(samples: list[Sample], width: int) -> tuple[Tensor, Tensor]:
    """(log q of the head tokens, mask), ``[B, width, K]`` each, aligned with ``head_token_ids``.
    Raises ValueError naming a sample whose trainable tokens have no head."""
    k = max((len(h) for s in samples for h in s.rollout_topk_token_ids), default=1)
    q = torch.zeros(len(samples), width, k)
    mask = torch.zeros(len(samples), width, k)
    for i, s in enumerate(samples):
        heads = s.rollout_topk_log_probs
        if len(heads) != s.response_length and any(s.loss_mask):
            raise ValueError(f"--use-score-centering: sample {s.uid or s.index} has {len(heads)} sampler heads for "
                             f"{s.response_length} response tokens; the engine must return top-k log-probs with "
                             "every token (multi-turn samples do not carry them)")
        for t, lps in enumerate(heads):
            q[i, t, : len(lps)] = torch.tensor(lps)
            mask[i, t, : len(lps)] = 1.0
    return q, mask


def split_heads(log_probs: Tensor, head_q: Tensor, head_mask: Tensor) -> tuple[Tensor, SamplerHead]:
    """The trainer's ``[b, T, 1 + K]`` log-probs (``response_log_probs(heads=True)``) as the sampled
    tokens' ``[b, T]`` and a ``SamplerHead`` with the engine's q (``head_rollout_log_probs``) rows."""
    k = head_q.shape[-1]
    return log_probs[..., 0], SamplerHead(log_probs[..., 1 : 1 + k], head_q, head_mask)
