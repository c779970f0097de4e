"""Train–inference and off-policy corrections applied to a per-token policy loss.

Three policies are kept apart: q = the engine that sampled the tokens (``rollout_log_probs``),
p0 = the trainer's policy before this update (``old_log_probs``), p_theta = the policy being trained
(``log_probs``). PPO's ratio is p_theta / p0 (policy_loss.py); the corrections here use p0 / q.

* TIS (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"):
  multiply the loss by ``sg(clip(rho, low, high))``, ``rho = p0 / q``. Biased when clipping binds.
* ICE-POP (Ling team 2025, "Every Step Evolves"): keep ``rho`` inside ``[low, high]``, zero outside;
  no renormalisation by the kept tokens.
* OPSM (off-policy sequence masking, DeepSeek-V3.2): drop negative-advantage tokens of sequences
  whose mean ``log p0 - log p_theta`` exceeds ``--opsm-delta``.
* Score centering: ``score_centering_loss``, an alternative REINFORCE loss that
  needs the sampler's top-k head probabilities; see its docstring for the exact derivation used.

``apply_corrections`` composes OPSM then TIS/ICE-POP/custom in slime's order (policy_loss_function).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from rlvr.core.registry import Registry, load_function

if TYPE_CHECKING:
    from rlvr.config.algo import AlgoConfig

Metrics = dict[str, Tensor]
# A weight rule maps rho = p0 / q [B, T] and bounds to weights [B, T].
TIS_MODES: Registry[Callable[[Tensor, float, float], Tensor]] = Registry("TIS mode", flag="--tis-mode")


@TIS_MODES.register("tis")
def _truncate(ratio: Tensor, low: float, high: float) -> Tensor:
    return ratio.clamp(low, high)


@TIS_MODES.register("icepop")
def _icepop(ratio: Tensor, low: float, high: float) -> Tensor:
    keep = (ratio >= low) & (ratio <= high)
    return torch.where(keep, ratio, torch.zeros_like(ratio))


def tis_weights(
    train_log_probs: Tensor, rollout_log_probs: Tensor, low: float, high: float, mode: str = "tis"
) -> tuple[Tensor, Tensor]:
    """Per-token importance weights ``w(rho)``, ``rho = exp(log p0 - log q)``.

    ``tis``: ``clamp(rho, low, high)`` (slime defaults low=0, high=2). ``icepop``: ``rho`` inside
    ``[low, high]``, 0 outside (e.g. low=0.5, high=2). Both detached.

    Args: train_log_probs [B, T] (p0), rollout_log_probs [B, T] (q).
    Returns: (weights [B, T], clipfrac [B, T] float: 1 where the weight differs from rho).

    >>> w, c = tis_weights(torch.log(torch.tensor([[4.0, 1.0]])), torch.zeros(1, 2), 0.0, 2.0)
    >>> w.tolist(), c.tolist()
    ([[2.0, 1.0]], [[1.0, 0.0]])
    """
    ratio = torch.exp(train_log_probs.detach() - rollout_log_probs.detach())
    weights = TIS_MODES[mode](ratio, low, high)
    return weights, (weights != ratio).float()


def opsm_mask(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, loss_mask: Tensor, delta: float
) -> tuple[Tensor, Tensor]:
    """Off-policy sequence masking (DeepSeek-V3.2 report, 2025; slime ``--use-opsm``).

    ``seq_kl_i = mean_t (log p0 - log p_theta)`` over the loss mask (a sample estimate of
    KL(p0 || p_theta)); a token is dropped when its advantage is negative and ``seq_kl_i > delta``
    (``--opsm-delta``, slime default 1e-4). Positive-advantage tokens are always kept: only
    "push down" updates from stale sequences are treated as unreliable.

    Args: all [B, T]; the mask of no-gradient comparisons carries no gradient.
    Returns: (keep [B, T] float 0/1, clipfrac [B, T] float = 1 - keep). Aggregated with the
    per-sample mean, clipfrac equals slime's ``opsm_clipfrac``.
    """
    mask = loss_mask.to(log_probs.dtype)
    diff = (old_log_probs - log_probs).detach() * mask
    seq_kl = diff.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp_min(1.0)
    dropped = ((advantages < 0) & (seq_kl > delta)).to(log_probs.dtype)
    return 1.0 - dropped, dropped


# A custom TIS function: (pg_loss, train_log_probs, rollout_log_probs, loss_mask, cfg) ->
# (pg_loss, loss_mask, metrics); all tensors [B, T]. The returned mask may reject tokens (it
# multiplies the loss numerator; the normaliser stays the original mask's, as in slime).
CustomTISFn = Callable[..., "tuple[Tensor, Tensor, Metrics]"]


def load_custom_tis_function(path: str) -> CustomTISFn:
    """Load ``--custom-tis-function-path``: ``"pkg.module:fn"`` or ``"pkg.module.fn"``, as it is
    (the builders adapt a slime signature, ``fn(args, *, pg_loss, ...)``: ``rlvr.runtime.plugins.custom_tis``)."""
    return load_function(path, "--custom-tis-function-path")


def apply_corrections(
    pg_loss: Tensor,
    log_probs: Tensor,
    old_log_probs: Tensor,
    rollout_log_probs: Tensor | None,
    advantages: Tensor,
    loss_mask: Tensor,
    cfg: AlgoConfig,
    tis_fn: CustomTISFn | None = None,
) -> tuple[Tensor, Metrics]:
    """OPSM, then TIS / ICE-POP / a custom function, on a per-token ``pg_loss`` [B, T].

    ``tis_fn``: the ``--custom-tis-function-path`` function as loaded by the builders (default:
    the function the path names, as it is).

    Returns the corrected per-token loss (rejected tokens already zeroed, so the caller aggregates
    with the *original* ``loss_mask`` and normaliser, as slime) and per-token metrics:
    ``opsm_clipfrac`` (with ``--use-opsm``), ``tis``, ``tis_clipfrac``, ``tis_abs`` (with ``--use-tis``).
    The TIS numerator is p0, except for the REINFORCE loss whose numerator is sg(p_theta).
    """
    from rlvr.algo.policy_loss import POLICY_LOSSES, policy_loss_name  # local: policy_loss imports nothing from here

    metrics: Metrics = {}
    if cfg.use_opsm:
        keep, metrics["opsm_clipfrac"] = opsm_mask(log_probs, old_log_probs, advantages, loss_mask, cfg.opsm_delta)
        pg_loss = pg_loss * keep
    if not cfg.use_tis:
        return pg_loss, metrics
    if rollout_log_probs is None:
        raise ValueError("--use-tis needs the engine's rollout log-probs (q) for every sample")
    current = POLICY_LOSSES[policy_loss_name(cfg)].tis_numerator == "current"
    numerator = log_probs.detach() if current else old_log_probs
    rho = torch.exp(numerator.detach() - rollout_log_probs)
    metrics["tis"], metrics["tis_abs"] = rho, (rho - 1.0).abs()
    if cfg.custom_tis_function_path is not None:
        fn = tis_fn or load_custom_tis_function(cfg.custom_tis_function_path)
        pg_loss, new_mask, extra = fn(pg_loss, numerator.detach(), rollout_log_probs, loss_mask, cfg)
        metrics.update(extra)
        return pg_loss * new_mask.to(pg_loss.dtype), metrics
    weights, metrics["tis_clipfrac"] = tis_weights(
        numerator, rollout_log_probs, cfg.tis_clip_low, cfg.tis_clip, cfg.tis_mode
    )
    return pg_loss * weights, metrics


def score_centering_loss(
    log_probs: Tensor,
    rollout_log_probs: Tensor,
    head_log_probs: Tensor,
    head_rollout_log_probs: Tensor,
    advantages: Tensor,
    weight_fn: Callable[[Tensor], Tensor] = torch.ones_like,
    head_mask: Tensor | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """Score-centred REINFORCE loss with a top-k head and reconstructed tail ("SC").

    With ``w_v = f(sg(p_v) / q_v)`` and the sampler's head H (top-k tokens, probabilities *not*
    renormalised), ``P_H = sum_H p``, ``Q_H = sum_H q``, ``alpha = (1 - Q_H) / (1 - P_H)``, the tail is
    approximated by ``q_v ~ alpha p_v`` and the weighted score mean becomes
    ``mu = sum_H c_v s_v``, ``c_v = q_v f(p_v / q_v) - alpha f(1 / alpha) p_v``. The loss
    ``-sg(A) [sg(w_a) log p_a - sum_H sg(c_v) log p_v]`` has gradient ``-A (w_a s_a - mu)``.
    Exact when H is the whole vocabulary (then the alpha term's gradient is ``∇ sum p = 0``).
    ``1 - P_H`` and alpha are floored at ``eps`` (a tiny tail mass would blow the weights up).

    Args:
        log_probs [B, T], rollout_log_probs [B, T]: log p_theta / log q of the sampled token.
        head_log_probs [B, T, K]: log p_theta of the head tokens (differentiable).
        head_rollout_log_probs [B, T, K]: log q of the same head tokens.
        advantages [B, T]; weight_fn: f, e.g. ``torch.ones_like`` or a TIS clamp.
        head_mask [B, T, K]: 1 on real head entries (pad rows with 0).
    Returns: per-token loss [B, T] (unmasked). Use with the REINFORCE loss only.
    """
    p_head = head_log_probs.detach().exp()
    q_head = head_rollout_log_probs.exp()
    if head_mask is not None:
        p_head, q_head = p_head * head_mask, q_head * head_mask
    alpha = (1.0 - q_head.sum(-1)).clamp_min(0.0) / (1.0 - p_head.sum(-1)).clamp_min(eps)
    alpha = alpha.clamp_min(eps)[..., None]  # [B, T, 1]
    tail_weight = alpha * weight_fn(1.0 / alpha)  # alpha f(1 / alpha)
    head_w = weight_fn(p_head / q_head.clamp_min(eps))
    coef = q_head * head_w - tail_weight * p_head
    if head_mask is not None:
        coef = coef * head_mask
    w_a = weight_fn(torch.exp(log_probs.detach() - rollout_log_probs))
    centred = w_a * log_probs - (coef.detach() * head_log_probs).sum(-1)
    return -advantages.detach() * centred
