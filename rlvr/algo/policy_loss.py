"""Policy losses: per-token surrogate losses to be *minimised*, and which one each estimator uses.

Contract: every entry of ``POLICY_LOSSES`` is
``fn(log_probs [B, T], old_log_probs [B, T], advantages [B, T], loss_mask [B, T], cfg: AlgoConfig)
-> (pg_loss [B, T], metrics)``, where ``metrics`` maps names to per-token [B, T] tensors (at least
``pg_clipfrac`` and ``ppo_kl``) that the caller aggregates with the same mask and normaliser as the
loss (``aggregate_loss``). ``log_probs`` carries the gradient; ``old_log_probs`` (p0, the trainer's
policy before this update) does not. Nothing here masks: the aggregation does.

``ppo_kl = old_log_probs - log_probs`` throughout, so ``ratio = exp(-ppo_kl) = p_theta / p0`` (slime).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from rlvr.algo.advantages import estimator_of
from rlvr.core.registry import Registry

if TYPE_CHECKING:
    from rlvr.config.algo import AlgoConfig

Metrics = dict[str, Tensor]
PolicyLossFn = Callable[[Tensor, Tensor, Tensor, Tensor, "AlgoConfig"], "tuple[Tensor, Metrics]"]


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss and the trait the train-inference corrections read. Called like
    its function: ``POLICY_LOSSES["ppo"](log_probs, old_log_probs, advantages, loss_mask, cfg)``."""

    fn: PolicyLossFn
    # TIS weight numerator: p0 for ratio-based losses; sg(p_theta) for a loss without
    # an importance ratio (REINFORCE), whose gradient is taken at p_theta itself.
    tis_numerator: str = "old"  # "old" (p0) or "current" (sg(p_theta))
    # True when a token with advantage 0 has a zero loss gradient whatever the log-probs (every
    # built-in: each multiplies the advantage into the loss). The trainer then runs no forward or
    # backward for a sample whose advantages are all 0 (``actor_loss.silent_samples``); a loss
    # registered without it is always computed.
    zero_without_advantage: bool = False

    def __call__(self, log_probs, old_log_probs, advantages, loss_mask, cfg) -> tuple[Tensor, Metrics]:
        return self.fn(log_probs, old_log_probs, advantages, loss_mask, cfg)


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", flag="--pg-loss-type")


def register_policy_loss(name: str, *, tis_numerator: str = "old", zero_without_advantage: bool = False):
    """Decorator: register a policy loss function under ``name`` with its traits; returns it unchanged."""
    if tis_numerator not in ("old", "current"):
        raise ValueError(f"tis_numerator must be 'old' or 'current', got {tis_numerator!r}")

    def deco(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES.register(name)(PolicyLoss(fn, tis_numerator, zero_without_advantage))
        return fn

    return deco


# ------------------------------------------------------------------------------------ pure maths


def compute_policy_loss(
    ppo_kl: Tensor,
    advantages: Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7), negated, per token.

    ``loss = max(-r A, -clip(r, 1 - eps_clip, 1 + eps_clip_high) A)`` with ``r = exp(-ppo_kl)``.
    Asymmetric bounds are DAPO's clip-higher (Yu et al. 2025). With ``eps_clip_c`` (> 1), dual-clip
    PPO (Ye et al. 2020, arXiv:1912.09729) also caps the loss of negative-advantage tokens at
    ``-eps_clip_c * A`` so a huge ratio cannot blow it up.

    Args: ppo_kl [B, T] = old - new log-probs; advantages [B, T].
    Returns: (pg_loss [B, T], clipfrac [B, T] float, 1 where the clipped branch was taken).
    """
    ratio = torch.exp(-ppo_kl)
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    clipfrac = (clipped > unclipped).float()
    if eps_clip_c is not None:
        if eps_clip_c <= 1.0:
            raise ValueError(f"--eps-clip-c must be > 1 for dual-clip PPO, got {eps_clip_c}")
        capped = torch.minimum(loss, -eps_clip_c * advantages)
        loss = torch.where(advantages < 0, capped, loss)
    return loss, clipfrac


def compute_cispo_loss(
    ppo_kl: Tensor,
    log_probs: Tensor,
    advantages: Tensor,
    eps_clip: float,
    eps_clip_high: float,
) -> tuple[Tensor, Tensor]:
    """CISPO (MiniMax-M1, arXiv:2506.13585, eq. 4-5): ``-sg(clip(r)) * A * log p_theta``.

    The IS weight is clipped and detached, so every token keeps a gradient (PPO drops clipped
    tokens'). Bounds use the same ``1 - eps_clip, 1 + eps_clip_high`` convention as PPO; the paper
    effectively disables the lower bound (``eps_clip >= 1``).

    Args: ppo_kl, log_probs, advantages [B, T]. Returns: (pg_loss [B, T], clipfrac [B, T]).
    """
    ratio = torch.exp(-ppo_kl)
    weight = ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    clipfrac = (weight != ratio).float()
    return -weight.detach() * advantages * log_probs, clipfrac


def gspo_token_log_ratio(log_probs: Tensor, old_log_probs: Tensor, loss_mask: Tensor) -> Tensor:
    """GSPO-token sequence log-ratio (Zheng et al. 2025, arXiv:2507.18071, eq. 7 and §4.3).

    Value: the per-sample masked mean of ``log p_theta - log p0`` (the log of the length-normalised
    sequence ratio s_i), broadcast to every token. Gradient at token t: ``d log p_theta(y_t)`` only
    (``sg(mean) + log p - sg(log p)``), so tokens may carry different advantages.

    With one advantage per sample and the per-sample mean aggregation, this gives exactly slime's
    GSPO gradient (slime differentiates through the mean on every token instead).

    Args: all [B, T]. Returns: [B, T].
    """
    mask = loss_mask.to(log_probs.dtype)
    diff = (log_probs.detach() - old_log_probs) * mask
    seq = diff.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp_min(1.0)
    return seq + log_probs - log_probs.detach()


def compute_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, value_clip: float
) -> tuple[Tensor, Tensor]:
    """PPO clipped value loss, per token: ``max((V - R)^2, (V_old + clip(V - V_old, ±c) - R)^2)``.

    Same form as slime's ``value_loss_function`` (no 1/2 factor). Args: all [B, T].
    Returns: (loss [B, T], clipfrac [B, T] float, 1 where ``|V - V_old| > value_clip``).
    """
    delta = values - old_values
    clipped_values = old_values + delta.clamp(-value_clip, value_clip)
    loss = torch.maximum((values - returns) ** 2, (clipped_values - returns) ** 2)
    return loss, (delta.abs() > value_clip).float()


# ------------------------------------------------------------------------- registered, uniform API


@register_policy_loss("ppo", zero_without_advantage=True)
def ppo_loss(log_probs, old_log_probs, advantages, loss_mask, cfg) -> tuple[Tensor, Metrics]:
    """Token-level clipped PPO (GRPO, DAPO, REINFORCE++, PPO, DCPO all use it in slime)."""
    ppo_kl = old_log_probs - log_probs
    low, high = cfg.clip_range()
    loss, clipfrac = compute_policy_loss(ppo_kl, advantages, low, high, cfg.eps_clip_c)
    return loss, {"pg_clipfrac": clipfrac, "ppo_kl": ppo_kl.detach()}


@register_policy_loss("gspo", zero_without_advantage=True)
def gspo_loss(log_probs, old_log_probs, advantages, loss_mask, cfg) -> tuple[Tensor, Metrics]:
    """GSPO: PPO clipping applied to the sequence-level ratio (GSPO-token form, see above)."""
    ppo_kl = -gspo_token_log_ratio(log_probs, old_log_probs, loss_mask)
    low, high = cfg.clip_range()
    loss, clipfrac = compute_policy_loss(ppo_kl, advantages, low, high, cfg.eps_clip_c)
    return loss, {"pg_clipfrac": clipfrac, "ppo_kl": ppo_kl.detach()}


@register_policy_loss("cispo", zero_without_advantage=True)
def cispo_loss(log_probs, old_log_probs, advantages, loss_mask, cfg) -> tuple[Tensor, Metrics]:
    """CISPO with the configured clip range."""
    ppo_kl = old_log_probs - log_probs
    low, high = cfg.clip_range()
    loss, clipfrac = compute_cispo_loss(ppo_kl, log_probs, advantages, low, high)
    return loss, {"pg_clipfrac": clipfrac, "ppo_kl": ppo_kl.detach()}


@register_policy_loss("reinforce", tis_numerator="current", zero_without_advantage=True)
def reinforce_loss(log_probs, old_log_probs, advantages, loss_mask, cfg) -> tuple[Tensor, Metrics]:
    """Plain REINFORCE (Williams 1992): ``-A * log p_theta``, no ratio, no clipping.

    Opt-in with ``--pg-loss-type reinforce`` (score centering trains with it).
    """
    ppo_kl = (old_log_probs - log_probs).detach()
    return -advantages * log_probs, {"pg_clipfrac": torch.zeros_like(ppo_kl), "ppo_kl": ppo_kl}


def policy_loss_name(cfg: AlgoConfig) -> str:
    """The ``POLICY_LOSSES`` name for this config: ``--pg-loss-type`` if set, else the estimator's
    own (its ``policy_loss`` trait: slime's policy_loss_function picks gspo's sequence ratio for
    gspo, CISPO for cispo, and the clipped PPO loss for everything else, DCPO included; with
    ``--use-score-centering``, which is a REINFORCE loss, ``reinforce``)."""
    if cfg.pg_loss_type is not None:
        return cfg.pg_loss_type
    return "reinforce" if cfg.use_score_centering else estimator_of(cfg).policy_loss
