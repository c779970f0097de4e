"""The actor's per-token loss: policy loss, train-inference corrections, entropy bonus, KL loss.

Contract: ``actor_loss(...) -> (loss [B, T], metrics)``, every metric a per-token [B, T] tensor;
the caller aggregates loss and metrics with one mask and the global batch's normaliser
(``aggregate_loss``), so nothing here masks or reduces. The composition follows slime's
``policy_loss_function``:

    pg_loss = POLICY_LOSSES[policy_loss_name(cfg)](p_theta, p0, A)     (ppo, gspo, cispo, reinforce)
    pg_loss = apply_corrections(pg_loss, ...)                           (OPSM, then TIS / ICE-POP)
    loss    = pg_loss - entropy_coef * entropy + kl_loss_coef * KL(p_theta || p_ref)

The KL term is computed (and reported as ``kl_loss``) whenever reference log-probs are given, and
added to the loss only with ``--use-kl-loss``; ``--use-unbiased-kl`` weights it by
``p_theta / p0`` (DeepSeek-V3.2), that ratio not detached, as slime. With ``--kl-loss-type
token_level_kl`` the term is the exact per-position KL over the vocabulary, which the trainer
computes in its output layer and passes as ``exact_kl``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from rlvr.algo.corrections import apply_corrections
from rlvr.algo.kl import TOKEN_LEVEL_KL, compute_approx_kl
from rlvr.algo.policy_loss import POLICY_LOSSES, policy_loss_name
from rlvr.algo.score_centering import SamplerHead, score_centering_policy_loss

if TYPE_CHECKING:
    from rlvr.config.algo import AlgoConfig


def actor_loss(
    log_probs: Tensor,
    entropy: Tensor,
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    ref_log_probs: Tensor | None,
    cfg: AlgoConfig,
    head: SamplerHead | None = None,
    exact_kl: Tensor | None = None,
    tis_fn: Callable | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The per-token loss to minimise for the policy, and its per-token metrics.

    Args: all [B, T]: ``log_probs`` p_theta (carries the gradient), ``entropy`` of p_theta per
    position, ``old_log_probs`` p0, ``rollout_log_probs`` q (read by TIS only), ``advantages``,
    ``loss_mask`` (OPSM and GSPO read it), ``ref_log_probs`` (None: no KL term at all); ``head``: the
    sampler's top-k head, read by ``--use-score-centering`` only (it replaces policy loss and TIS);
    ``exact_kl`` KL(p_theta || p_ref) summed over the vocabulary (``token_level_kl`` only);
    ``tis_fn`` the loaded ``--custom-tis-function-path`` (``apply_corrections``).
    Returns: (loss [B, T], metrics: ``pg_loss``, ``entropy_loss``, the policy loss's
    ``pg_clipfrac`` / ``ppo_kl``, the corrections' metrics, ``kl_loss`` with a reference).
    """
    if cfg.use_score_centering:  # its own REINFORCE loss, TIS/ICE-POP as its weight rule (score_centering.py)
        pg_loss, metrics = score_centering_policy_loss(log_probs, rollout_log_probs, head, advantages, cfg)
    else:
        pg_loss, metrics = POLICY_LOSSES[policy_loss_name(cfg)](log_probs, old_log_probs, advantages, loss_mask, cfg)
    if (cfg.use_tis or cfg.use_opsm) and not cfg.use_score_centering:  # train-inference corrections: p0 / q weights, OPSM
        pg_loss, extra = apply_corrections(pg_loss, log_probs, old_log_probs, rollout_log_probs, advantages,
                                           loss_mask, cfg, tis_fn)
        metrics |= extra
    loss = pg_loss - cfg.entropy_coef * entropy if cfg.entropy_coef else pg_loss
    metrics = {"pg_loss": pg_loss, "entropy_loss": entropy, **metrics}
    if ref_log_probs is not None:
        if cfg.kl_loss_type == TOKEN_LEVEL_KL:
            if exact_kl is None:
                raise ValueError("--kl-loss-type token_level_kl: actor_loss needs exact_kl from the trainer")
            kl = exact_kl
        else:
            ratio = torch.exp(log_probs - old_log_probs) if cfg.use_unbiased_kl else None
            kl = compute_approx_kl(log_probs, ref_log_probs, cfg.kl_loss_type, importance_ratio=ratio)
        if cfg.use_kl_loss:
            loss = loss + cfg.kl_loss_coef * kl
        metrics["kl_loss"] = kl
    return loss, metrics


def silent_samples(advantages: Tensor, loss_mask: Tensor, cfg: AlgoConfig) -> Tensor:
    """Which samples add exactly nothing to ``actor_loss``'s aggregated gradient: ``[B]`` bool.

    A sample is silent when no token of it is in ``loss_mask`` (the aggregation multiplies every
    term by the mask), or when every masked token's advantage is 0 and every term of the loss
    vanishes with the advantage: the policy loss (each built-in multiplies it in; a registered
    loss says so with ``zero_without_advantage``), OPSM and TIS (they multiply the policy loss),
    score centering (``-sg(A) * centred``). The terms that do not vanish: the entropy bonus
    (``--entropy-coef``), the KL loss (``--use-kl-loss`` with a non-zero ``--kl-loss-coef``) and a
    ``--custom-tis-function-path`` (it may return any loss). The global normaliser counts a silent
    sample as before, so leaving it out of the forward and backward leaves the gradient as it was.
    A non-finite advantage is never silent (the bad-step guard must see it).

    Args: advantages, loss_mask [B, T]. Returns: [B] bool.
    """
    masked = loss_mask != 0
    empty = ~masked.any(dim=1)
    policy_vanishes = cfg.use_score_centering or POLICY_LOSSES[policy_loss_name(cfg)].zero_without_advantage
    others_vanish = not cfg.entropy_coef and not (cfg.use_kl_loss and cfg.kl_loss_coef) and not (
        cfg.use_tis and cfg.custom_tis_function_path is not None)
    if not (policy_vanishes and others_vanish):
        return empty
    return empty | ((advantages == 0) | ~masked).all(dim=1)
