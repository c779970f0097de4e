"""``AlgoConfig``: the algorithm part of the typed config (STYLE point 5).

Field names are slime's flag names with underscores; the CLI flag is ``"--" + name.replace("_", "-")``.
Each field has ``metadata["help"]`` (one line) and ``metadata["choices"]`` when finite; choices come
from the registries, so adding an estimator or loss needs no edit here. Defaults are slime's.
``validate()`` raises ``ConfigError(flag, what to change)`` for impossible values.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from rlvr.algo.advantages import ADVANTAGES
from rlvr.algo.corrections import TIS_MODES
from rlvr.algo.kl import KL
from rlvr.algo.policy_loss import POLICY_LOSSES
from rlvr.errors import ConfigError
from rlvr.fields import flag_of
from rlvr.fields import option as _f


@dataclass
class AlgoConfig:
    """Advantage estimator, policy loss, KL, clipping and off-policy corrections."""

    # --- advantage estimation
    advantage_estimator: str = _f("grpo", "how per-token advantages are computed", ADVANTAGES.names())
    disable_grpo_std_normalization: bool = _f(False, "GRPO: subtract the group mean only (Dr. GRPO)")
    disable_rewards_normalization: bool = _f(False, "use raw rewards, no group normalisation")
    normalize_advantages: bool = _f(False, "whiten advantages over the batch's masked tokens")
    gamma: float = _f(1.0, "discount factor (PPO/GAE, REINFORCE++)")
    lambd: float = _f(1.0, "GAE lambda (PPO)")
    kl_coef: float = _f(0.0, "KL(old || ref) penalty folded into token rewards (PPO-style)")
    dcpo_hybrid_alpha: float = _f(0.5, "DCPO: weight of the sample's accuracy in the hybrid accuracy")
    dcpo_calibration_weight: float = _f(0.5, "DCPO: scale of the calibration reward (hybrid - conf)^2")
    # --- policy loss
    pg_loss_type: str | None = _f(
        None, "policy loss; default follows --advantage-estimator", POLICY_LOSSES.names()
    )
    eps_clip: float = _f(0.2, "PPO clip range below 1 (ratio >= 1 - eps_clip)")
    eps_clip_high: float | None = _f(None, "PPO clip range above 1; None = eps_clip (DAPO: 0.28)")
    eps_clip_c: float | None = _f(None, "dual-clip PPO bound for negative advantages; must be > 1")
    value_clip: float = _f(0.2, "PPO value-loss clip range")
    entropy_coef: float = _f(0.0, "entropy bonus coefficient (loss -= coef * entropy)")
    calculate_per_token_loss: bool = _f(False, "normalise the loss by tokens, not by samples")
    # --- KL to the reference model as a loss term
    use_kl_loss: bool = _f(False, "add kl_loss_coef * KL(policy || ref) to the loss (GRPO)")
    kl_loss_coef: float = _f(0.0, "weight of the KL loss")
    kl_loss_type: str = _f("k1", "KL estimator for the KL loss and the KL reward", KL.names())
    use_unbiased_kl: bool = _f(False, "weight the KL loss by p_theta / p_old (DeepSeek-V3.2)")
    # --- train-inference mismatch corrections
    use_tis: bool = _f(False, "multiply the loss by truncated IS weights p_old / p_rollout")
    tis_clip: float = _f(2.0, "upper bound of the TIS weight")
    tis_clip_low: float = _f(0.0, "lower bound of the TIS weight")
    tis_mode: str = _f("tis", "tis = clamp the weight; icepop = zero it outside the bounds", TIS_MODES.names())
    custom_tis_function_path: str | None = _f(None, "replace TIS by pkg.module:function")
    use_opsm: bool = _f(False, "off-policy sequence masking of stale negative-advantage samples")
    opsm_delta: float = _f(1e-4, "OPSM threshold on the sequence-mean log(p_old / p_theta)")

    def clip_range(self) -> tuple[float, float]:
        """(eps_clip, eps_clip_high), the upper bound defaulting to the lower one (slime)."""
        high = self.eps_clip if self.eps_clip_high is None else self.eps_clip_high
        return self.eps_clip, high

    def validate(self) -> AlgoConfig:
        """Raise ``ConfigError`` naming the flag and the fix; return self when valid."""
        _choice("advantage_estimator", self.advantage_estimator, ADVANTAGES.names())
        _choice("kl_loss_type", self.kl_loss_type, KL.names())
        _choice("tis_mode", self.tis_mode, TIS_MODES.names())
        if self.pg_loss_type is not None:
            _choice("pg_loss_type", self.pg_loss_type, POLICY_LOSSES.names())
        for name in ("kl_coef", "kl_loss_coef", "entropy_coef", "value_clip", "tis_clip", "tis_clip_low", "opsm_delta"):
            if getattr(self, name) < 0:
                raise ConfigError(flag_of(name), f"must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.eps_clip:
            raise ConfigError("--eps-clip", f"must be >= 0, got {self.eps_clip}")
        if self.eps_clip_high is not None and self.eps_clip_high < 0:
            raise ConfigError("--eps-clip-high", f"must be >= 0, got {self.eps_clip_high}")
        if self.eps_clip_c is not None and self.eps_clip_c <= 1.0:
            msg = f"dual-clip bound must be > 1, got {self.eps_clip_c}; unset it to disable dual clip"
            raise ConfigError("--eps-clip-c", msg)
        for name in ("gamma", "lambd", "dcpo_hybrid_alpha"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(flag_of(name), f"must be in [0, 1], got {getattr(self, name)}")
        if self.tis_clip_low > self.tis_clip:
            raise ConfigError("--tis-clip-low", f"{self.tis_clip_low} is above --tis-clip {self.tis_clip}; lower it")
        if self.kl_loss_coef > 0 and not self.use_kl_loss:
            raise ConfigError("--kl-loss-coef", "is set but --use-kl-loss is off; add --use-kl-loss or set it to 0")
        if self.kl_coef != 0 and self.kl_loss_coef != 0:
            raise ConfigError("--kl-coef", "only one of --kl-coef (KL in reward) and --kl-loss-coef may be non-zero")
        if self.custom_tis_function_path is not None and not self.use_tis:
            raise ConfigError("--custom-tis-function-path", "does nothing without --use-tis; add --use-tis")
        return self


def _choice(name: str, value: str, valid: list[str]) -> None:
    if value not in valid:
        raise ConfigError(flag_of(name), f"unknown value {value!r}; valid: {', '.join(valid)}")


# Every field must document itself (the CLI generator relies on it).
assert all("help" in f.metadata for f in fields(AlgoConfig))
