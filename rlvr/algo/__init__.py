"""Algorithm maths: pure tensor functions, registered by name (DESIGN "Layers": ``algo``).

Estimators (``ADVANTAGES``), policy losses (``POLICY_LOSSES``), KL estimators (``KL``), importance
corrections (TIS, ICE-POP, OPSM, score centering) and loss aggregation. No state, no global config:
algorithm code receives ``cfg.algo`` (an ``AlgoConfig``) and tensors. See docs/algorithms.md.
"""

from rlvr.algo.actor_loss import actor_loss, silent_samples
from rlvr.algo.advantages import (
    ADVANTAGES,
    AdvantageInputs,
    Estimator,
    estimator_of,
    register_estimator,
    discounted_returns,
    gae,
    group_normalize,
    leave_one_out,
)
from rlvr.algo.aggregation import aggregate_loss, global_denominator, masked_mean, masked_whiten
from rlvr.config.algo import AlgoConfig
from rlvr.algo.corrections import (
    TIS_MODES,
    apply_corrections,
    load_custom_tis_function,
    opsm_mask,
    score_centering_loss,
    tis_weights,
)
from rlvr.algo.kl import KL, compute_approx_kl
from rlvr.algo.policy_loss import (
    POLICY_LOSSES,
    PolicyLoss,
    register_policy_loss,
    compute_cispo_loss,
    compute_policy_loss,
    compute_value_loss,
    policy_loss_name,
)

__all__ = [
    "ADVANTAGES",
    "KL",
    "POLICY_LOSSES",
    "TIS_MODES",
    "AdvantageInputs",
    "AlgoConfig",
    "Estimator",
    "PolicyLoss",
    "actor_loss",
    "aggregate_loss",
    "apply_corrections",
    "compute_approx_kl",
    "compute_cispo_loss",
    "compute_policy_loss",
    "compute_value_loss",
    "discounted_returns",
    "estimator_of",
    "gae",
    "global_denominator",
    "group_normalize",
    "leave_one_out",
    "load_custom_tis_function",
    "masked_mean",
    "masked_whiten",
    "opsm_mask",
    "policy_loss_name",
    "register_estimator",
    "register_policy_loss",
    "score_centering_loss",
    "silent_samples",
    "tis_weights",
]
