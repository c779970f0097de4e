"""Per-token KL estimators between the trained policy and a reference (Schulman, "Approximating KL
Divergence", http://joschu.net/blog/kl-approx.html).

Contract: every estimator maps ``(log_probs [B, T], ref_log_probs [B, T]) -> kl [B, T]``, token by
token, with no masking (the caller aggregates with its loss mask). Names and semantics follow
slime's ``--kl-loss-type``:

* ``k1``: ``log p - log p_ref`` — unbiased for KL(p || p_ref) under samples from p, high variance,
  can be negative.
* ``k2``: ``(log p - log p_ref)^2 / 2`` — biased, non-negative.
* ``k3``: ``r - 1 - log r`` with ``r = p_ref / p`` — unbiased, non-negative, low variance.
* ``low_var_kl``: k3 clamped to ``[-10, 10]`` for numerical safety. slime clamps *only* this name,
  and clamps *after* the optional importance ratio is applied; we do the same.

``token_level_kl`` is exact, not an estimate: ``sum_v p(v) (log p(v) - log p_ref(v))``
over the whole vocabulary at each position (``exact_kl`` below). It needs both full distributions,
which a ``(log p, log p_ref)`` pair of the sampled token does not carry, so it is not in the
registry; the trainer computes it inside its chunked output layer (``rlvr.train.token_kl``) and
passes it to ``actor_loss``. It serves the KL loss only (config validation refuses it for the KL
reward).
"""

from __future__ import annotations

import math  # noqa: F401 (doctest)
from typing import Callable

import torch  # noqa: F401 (doctest)
from torch import Tensor

from rlvr.config.algo import TOKEN_LEVEL_KL
from rlvr.core.registry import Registry

KLFn = Callable[[Tensor, "Tensor | None"], Tensor]
# Each entry maps (log-ratio ``log p - log p_ref`` [B, T], optional IS ratio [B, T]) to [B, T].
KL: Registry[KLFn] = Registry("KL estimator", flag="--kl-loss-type")

# The bound slime uses for low_var_kl.
LOW_VAR_KL_CLAMP = 10.0


def _weighted(kl: Tensor, importance_ratio: Tensor | None) -> Tensor:
    return kl if importance_ratio is None else importance_ratio * kl


@KL.register("k1")
def _k1(log_ratio: Tensor, importance_ratio: Tensor | None) -> Tensor:
    return _weighted(log_ratio, importance_ratio)


@KL.register("k2")
def _k2(log_ratio: Tensor, importance_ratio: Tensor | None) -> Tensor:
    return _weighted(log_ratio.pow(2) / 2.0, importance_ratio)


@KL.register("k3")
def _k3(log_ratio: Tensor, importance_ratio: Tensor | None) -> Tensor:
    # Schulman's k3 is written with r = p_ref / p, i.e. the *negated* log-ratio.
    neg = -log_ratio
    return _weighted(neg.exp() - 1.0 - neg, importance_ratio)


@KL.register("low_var_kl")
def _low_var_kl(log_ratio: Tensor, importance_ratio: Tensor | None) -> Tensor:
    # Same value as k3; slime clamps only this name, and after the IS ratio.
    return _k3(log_ratio, importance_ratio).clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


def kl_loss_types() -> list[str]:
    """Every ``--kl-loss-type`` choice: the registered estimators and ``token_level_kl``."""
    return [*KL.names(), TOKEN_LEVEL_KL]


def exact_kl(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """KL(p || p_ref) of whole distributions: ``log_probs``, ``ref_log_probs`` [..., V] (log-softmax
    outputs) -> [...], summed over the last (vocabulary) axis; differentiable in both.

    >>> p, q = torch.tensor([0.5, 0.5]).log(), torch.tensor([0.25, 0.75]).log()
    >>> round(exact_kl(p, q).item(), 6), round(0.5 * math.log(4 / 3), 6)  # 0.5 ln 2 + 0.5 ln(2/3)
    (0.143841, 0.143841)
    """
    return (log_probs.exp() * (log_probs - ref_log_probs)).sum(-1)


def compute_approx_kl(
    log_probs: Tensor,
    ref_log_probs: Tensor,
    kl_type: str,
    importance_ratio: Tensor | None = None,
) -> Tensor:
    """Per-token approximate KL(p || p_ref).

    Args:
        log_probs: [B, T] log p(token) under the policy being measured.
        ref_log_probs: [B, T] log p_ref(token) under the reference model.
        kl_type: a ``KL`` registry name (k1, k2, k3, low_var_kl).
        importance_ratio: optional [B, T] ratio p_theta / p_old multiplying the estimate, which
            makes it unbiased when samples come from p_old (slime's ``--use-unbiased-kl``,
            after DeepSeek-V3.2). Pass it detached unless you want gradient through it.

    Returns:
        [B, T] float32 estimate (unmasked).

    >>> lp, ref = torch.tensor([[0.0]]), torch.tensor([[-1.0]])
    >>> compute_approx_kl(lp, ref, "k1").item(), compute_approx_kl(lp, ref, "k2").item()
    (1.0, 0.5)
    """
    if kl_type == TOKEN_LEVEL_KL:
        raise ValueError("token_level_kl is exact and needs both full distributions, not the sampled token's "
                         "log-probs: the trainer computes it (rlvr.train.token_kl) and passes it to actor_loss")
    estimator = KL[kl_type]  # fails with the valid list for an unknown name
    return estimator(log_probs.float() - ref_log_probs.float(), importance_ratio)
