"""``AlgoConfig``: the algorithm part of the typed config.

Field names are slime's flag names with underscores; the CLI flag is ``"--" + name.replace("_", "-")``.
Each field has ``metadata["help"]`` (one line), ``metadata["choices"]`` when finite and its numeric
bounds (``rlvr.config.fields``). A field naming an estimator, loss or mode declares its registry's
kind (``names=``); ``rlvr.runtime.configure`` checks it against the registry once plugins are
imported, so an estimator or loss registered by user code needs no edit here. Defaults are slime's. Bounds are
checked by ``rlvr.config.fields.check_bounds``; ``validate()`` holds the rules between fields and raises
``ConfigError(flag, what to change)``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from rlvr.core.errors import ConfigError
from rlvr.config.fields import check_bounds
from rlvr.config.fields import option as _f

TOKEN_LEVEL_KL = "token_level_kl"  # --kl-loss-type: the exact KL summed over the vocabulary (rlvr.train.token_kl)
OPD_TYPES = ("sglang", "megatron")  # --opd-type: where the teacher runs


@dataclass
class AlgoConfig:
    """Advantage estimator, policy loss, KL, clipping and off-policy corrections."""

    # --- advantage estimation
    advantage_estimator: str = _f("grpo", "how per-token advantages are computed", names="advantage estimator")
    custom_advantage_function_path: str | None = _f(
        None, "your estimator, pkg.module:fn(inputs, cfg) -> (advantages, returns); its traits from "
              "rlvr.algo.register_estimator in that module (default: critic-free); replaces --advantage-estimator"
    )
    disable_grpo_std_normalization: bool = _f(False, "GRPO: subtract the group mean only (Dr. GRPO)")
    disable_rewards_normalization: bool = _f(False, "use raw rewards, no group normalisation")
    normalize_advantages: bool = _f(False, "whiten advantages over the batch's masked tokens")
    gamma: float = _f(1.0, "discount factor (PPO/GAE, REINFORCE++)", ge=0, le=1)
    lambd: float = _f(1.0, "GAE lambda (PPO)", ge=0, le=1)
    kl_coef: float = _f(0.0, "KL(old || ref) penalty folded into token rewards (PPO-style)", ge=0)
    dcpo_hybrid_alpha: float = _f(0.5, "DCPO: weight of the sample's accuracy in the hybrid accuracy", ge=0, le=1)
    dcpo_calibration_weight: float = _f(0.5, "DCPO: scale of the calibration reward (hybrid - conf)^2")
    # --- policy loss
    pg_loss_type: str | None = _f(
        None, "policy loss; default follows --advantage-estimator", names="policy loss"
    )
    eps_clip: float = _f(0.2, "PPO clip range below 1 (ratio >= 1 - eps_clip)", ge=0)
    eps_clip_high: float | None = _f(None, "PPO clip range above 1; None = eps_clip (DAPO: 0.28)", ge=0)
    eps_clip_c: float | None = _f(None, "dual-clip PPO bound for negative advantages; unset = no dual clip", gt=1)
    value_clip: float = _f(0.2, "PPO value-loss clip range", ge=0)
    entropy_coef: float = _f(0.0, "entropy bonus coefficient (loss -= coef * entropy)", ge=0)
    calculate_per_token_loss: bool = _f(False, "normalise the loss by tokens, not by samples")
    # --- KL to the reference model as a loss term
    use_kl_loss: bool = _f(False, "add kl_loss_coef * KL(policy || ref) to the loss (GRPO)")
    kl_loss_coef: float = _f(0.0, "weight of the KL loss", ge=0)
    kl_loss_type: str = _f("k1", "KL estimator for the KL loss and the KL reward; token_level_kl: exact, "
                                 "summed over the vocabulary (KL loss only)", names="KL loss type")
    use_unbiased_kl: bool = _f(False, "weight the KL loss by p_theta / p_old (DeepSeek-V3.2)")
    # --- train-inference mismatch corrections
    use_tis: bool = _f(False, "multiply the loss by truncated IS weights p_old / p_rollout")
    tis_clip: float = _f(2.0, "upper bound of the TIS weight", ge=0)
    tis_clip_low: float = _f(0.0, "lower bound of the TIS weight", ge=0)
    tis_mode: str = _f("tis", "tis = clamp the weight; icepop = zero it outside the bounds", names="TIS mode")
    custom_tis_function_path: str | None = _f(None, "replace TIS by pkg.module:function")
    use_score_centering: bool = _f(False, "score-centred REINFORCE loss; the engine returns q's top-k head")
    score_centering_top_k: int = _f(128, "score centering: sampler head size (top-k tokens of q kept per token)", ge=1)
    use_opsm: bool = _f(False, "off-policy sequence masking of stale negative-advantage samples")
    opsm_delta: float = _f(1e-4, "OPSM threshold on the sequence-mean log(p_old / p_theta)", ge=0)
    # --- on-policy distillation (rlvr.algo.opd)
    use_opd: bool = _f(False, "on-policy distillation: advantages -= opd_kl_coef * (log p_student - log p_teacher)")
    opd_type: str | None = _f(None, "where the teacher runs: sglang = an engine at --rm-url, megatron = in the "
                                    "trainer from --opd-teacher-load", list(OPD_TYPES))
    opd_kl_coef: float = _f(1.0, "weight of the OPD reverse-KL term in the advantages", ge=0)
    opd_teacher_load: str | None = _f(None, "teacher for --opd-type megatron: a Hugging Face model directory")

    def clip_range(self) -> tuple[float, float]:
        """(eps_clip, eps_clip_high), the upper bound defaulting to the lower one (slime)."""
        high = self.eps_clip if self.eps_clip_high is None else self.eps_clip_high
        return self.eps_clip, high

    def validate(self) -> AlgoConfig:
        """Raise ``ConfigError`` naming the flag and the fix; return self when valid. (Ranges and
        choices are declared on the fields: ``check_bounds``.)"""
        check_bounds(self)
        if self.tis_clip_low > self.tis_clip:
            raise ConfigError("--tis-clip-low", f"{self.tis_clip_low} is above --tis-clip {self.tis_clip}; lower it")
        if self.kl_loss_coef > 0 and not self.use_kl_loss:
            raise ConfigError("--kl-loss-coef", "is set but --use-kl-loss is off; add --use-kl-loss or set it to 0")
        if self.kl_coef != 0 and self.kl_loss_coef != 0:
            raise ConfigError("--kl-coef", "only one of --kl-coef (KL in reward) and --kl-loss-coef may be non-zero")
        if self.use_score_centering:
            self._check_score_centering()
        if self.custom_tis_function_path is not None and not self.use_tis:
            raise ConfigError("--custom-tis-function-path", "does nothing without --use-tis; add --use-tis")
        self._validate_token_level_kl()
        self._validate_opd()
        return self

    def _check_score_centering(self) -> None:
        """SC is its own REINFORCE loss: no PPO/GSPO/CISPO clipping; TIS/ICE-POP weights
        combine with it as f(p / q), a custom TIS function or OPSM does not. (The estimator's own
        loss is checked by ``rlvr.runtime.configure``: the estimators are registered above.)"""
        if self.pg_loss_type not in (None, "reinforce"):  # None: SC trains with reinforce (policy_loss_name)
            raise ConfigError("--use-score-centering", f"is a REINFORCE loss and cannot be combined with --pg-loss-type "
                              f"{self.pg_loss_type}; use --pg-loss-type reinforce")
        for name, on in (("--custom-tis-function-path", self.custom_tis_function_path), ("--use-opsm", self.use_opsm)):
            if on:
                raise ConfigError(name, "is not combined with --use-score-centering (TIS/ICE-POP are: --use-tis "
                                        "--tis-mode); drop one")

    def _validate_token_level_kl(self) -> None:
        if self.kl_loss_type != TOKEN_LEVEL_KL:
            return
        if self.kl_coef != 0:
            raise ConfigError("--kl-loss-type", "token_level_kl needs the policy's whole distribution, which the "
                                                "KL reward (--kl-coef) does not have; use it with --use-kl-loss")
        if self.use_unbiased_kl:
            raise ConfigError("--use-unbiased-kl", "reweights a sampled-token estimate; token_level_kl sums over "
                                                   "the vocabulary and samples nothing: drop one")

    def _validate_opd(self) -> None:
        if not self.use_opd:
            for name in ("opd_type", "opd_teacher_load"):
                if getattr(self, name) is not None:
                    raise ConfigError("--" + name.replace("_", "-"), "does nothing without --use-opd; add it")
            return
        if self.opd_type is None:
            raise ConfigError("--opd-type", f"is required with --use-opd: one of {', '.join(OPD_TYPES)}")
        if self.opd_type == "megatron":
            if not self.opd_teacher_load:
                raise ConfigError("--opd-teacher-load", "is required with --opd-type megatron: the teacher's "
                                                        "Hugging Face model directory")
            if not (Path(self.opd_teacher_load) / "config.json").is_file():
                raise ConfigError("--opd-teacher-load", f"{self.opd_teacher_load} has no config.json; point it at a "
                                                        "Hugging Face model directory (convert a Megatron checkpoint first)")
        elif self.opd_teacher_load is not None:
            raise ConfigError("--opd-teacher-load", "must not be set with --opd-type sglang (the teacher is served "
                                                    "at --rm-url); drop it or use --opd-type megatron")


# Every field must document itself (the CLI generator relies on it).
assert all("help" in f.metadata for f in fields(AlgoConfig))
