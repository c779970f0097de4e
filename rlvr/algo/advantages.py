"""Advantage estimators: per-sample rewards (+ optional KL, values) -> per-token advantages.

Contract: every entry of ``ADVANTAGES`` is an ``Estimator`` record, registered with
``register_estimator(name, traits...)``: a function ``fn(inp: AdvantageInputs, cfg: AlgoConfig) ->
(advantages [B, T], returns [B, T])`` plus the traits other layers read (group-relative, needs a
critic, its default policy loss, the side inputs it needs), float32, zero outside the loss mask for the critic-free
estimators. Rows are right-padded; samples of one prompt are consecutive (``n_samples_per_prompt``
of them). ``--normalize-advantages`` is *not* applied here: the trainer applies ``masked_whiten``
after the estimator (slime ``compute_advantages_and_returns``), except for REINFORCE++ whose
batch whitening is part of the algorithm and so lives in its estimator.

Simplifications against slime, all documented where they happen:

* slime group-normalises rewards on the rollout side (``_post_process_rewards``) and the trainer only
  broadcasts; here the estimator does both, so all of GRPO lives in one function.
* The "end of the response" is the last position where ``loss_mask`` is 1 (slime uses
  ``response_length``; they coincide unless a response ends in masked tokens, e.g. a tool output).
* DCPO's token split comes from a confidence-span mask instead of a character position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from rlvr.algo.aggregation import masked_whiten
from rlvr.algo.kl import compute_approx_kl
from rlvr.core.registry import Registry

if TYPE_CHECKING:  # config imports this module for its choices; avoid the cycle at runtime
    from rlvr.config.algo import AlgoConfig

# Added to the group std before dividing (slime _post_process_rewards).
GRPO_STD_EPS = 1e-6


@dataclass
class AdvantageInputs:
    """What an estimator may read. Shapes: B samples, T response positions (right-padded)."""

    rewards: Tensor  # [B] scalar reward per sample
    loss_mask: Tensor  # [B, T] float, 1 on trained response tokens (right-padded rows)
    n_samples_per_prompt: int
    log_probs: Tensor | None = None  # [B, T] old policy log-probs (for KL-in-reward)
    ref_log_probs: Tensor | None = None  # [B, T]
    values: Tensor | None = None  # [B, T] critic values (ppo)
    train_metadata: dict[str, Tensor] | None = None  # e.g. DCPO: per-sample tensors / span masks


AdvantageFn = Callable[[AdvantageInputs, "AlgoConfig"], "tuple[Tensor, Tensor]"]

# train_metadata key: the reward the estimator sees instead of the sample's own, written by a reward
# post-process that keeps the logged reward apart (slime's post-process: (raw_rewards, rewards)).
ESTIMATOR_REWARD = "estimator_reward"


def estimator_rewards(samples, rewards: Tensor) -> Tensor:
    """[B] rewards for the estimator: each sample's ``train_metadata[ESTIMATOR_REWARD]`` where a
    post-process wrote one (it writes every sample's, or none), else ``rewards`` unchanged.

    >>> from rlvr.core.types import Sample
    >>> s = [Sample(train_metadata={ESTIMATOR_REWARD: 0.5}), Sample(train_metadata={ESTIMATOR_REWARD: -1})]
    >>> estimator_rewards(s, torch.zeros(2)).tolist()
    [0.5, -1.0]
    """
    if not samples or ESTIMATOR_REWARD not in samples[0].train_metadata:
        return rewards
    return torch.tensor([float(s.train_metadata[ESTIMATOR_REWARD]) for s in samples], dtype=torch.float32,
                        device=rewards.device)


@dataclass(frozen=True)
class Estimator:
    """A registered advantage estimator: its function and the traits the rest of rlvr reads
    (config validation, the trainer, the policy-loss default), so that nothing compares names.
    Called like its function: ``ADVANTAGES["grpo"](inputs, cfg)``."""

    fn: AdvantageFn
    group_relative: bool = False  # compares the samples of one prompt: needs --n-samples-per-prompt >= 2
    needs_critic: bool = False  # reads critic values: a value model is trained beside the policy
    policy_loss: str = "ppo"  # the POLICY_LOSSES entry used when --pg-loss-type is not given
    side_inputs: tuple[str, ...] = ()  # train_metadata keys it reads, written by a reward post-process
    side_inputs_hint: str = ""  # what to add to the command line so that they are there

    def __call__(self, inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
        return self.fn(inp, cfg)


ADVANTAGES: Registry[Estimator] = Registry("advantage estimator", flag="--advantage-estimator")


def register_estimator(name: str, *, group_relative: bool = False, needs_critic: bool = False,
                       policy_loss: str = "ppo", side_inputs: tuple[str, ...] = (), side_inputs_hint: str = ""):
    """Decorator: register ``fn(inputs, cfg) -> (advantages, returns)`` as estimator ``name`` with
    its traits; returns ``fn`` unchanged, so one function can be registered under several names.
    User code calls it too (then ``--advantage-estimator name``, or name the function with
    ``--custom-advantage-function-path`` so that other processes import it); docs/algorithms.md."""

    def deco(fn: AdvantageFn) -> AdvantageFn:
        ADVANTAGES.register(name)(Estimator(fn, group_relative, needs_critic, policy_loss, tuple(side_inputs),
                                            side_inputs_hint))
        return fn

    return deco


def load_custom_estimator(path: str) -> str:
    """Import ``--custom-advantage-function-path`` (``pkg.module:fn``) and return its estimator's
    name: the name ``fn`` was registered under by ``register_estimator`` in its module, or else
    ``path`` itself, registered now with the default traits (critic-free, not group-relative, the
    PPO loss). Idempotent, so every process that reads the config may call it."""
    from rlvr.core.registry import load_function

    fn = load_function(path, "--custom-advantage-function-path")
    for name in ADVANTAGES.names():
        if ADVANTAGES[name].fn is fn or name == path:
            return name
    register_estimator(path)(fn)
    return path


def estimator_name(cfg: AlgoConfig) -> str:
    """The estimator a config names: ``--custom-advantage-function-path``'s (imported here, once
    per process: ``load_custom_estimator`` is idempotent) or else ``--advantage-estimator``. The
    config itself is not changed."""
    if cfg.custom_advantage_function_path is not None:
        return load_custom_estimator(cfg.custom_advantage_function_path)
    return cfg.advantage_estimator


def estimator_of(cfg: AlgoConfig) -> Estimator:
    """The estimator a config names (``estimator_name``)."""
    return ADVANTAGES[estimator_name(cfg)]


# ---------------------------------------------------------------------------- pure building blocks


def group_normalize(rewards: Tensor, n_samples_per_prompt: int, std_normalize: bool = True) -> Tensor:
    """GRPO group-relative rewards (DeepSeekMath, Shao et al. 2024, §4.1.2).

    ``A_i = (r_i - mean_g) / (std_g + 1e-6)``, std unbiased (torch default), as slime. A group of
    identical rewards gives zeros; a group of one sample gives 0 (its std is undefined, not NaN).

    Args:
        rewards: [B] float, B a multiple of ``n_samples_per_prompt``; consecutive samples form a group.
        std_normalize: False = Dr. GRPO (Liu et al. 2025), ``--disable-grpo-std-normalization``.
    Returns: [B].

    >>> group_normalize(torch.tensor([1., 0., 1., 1.]), 2, std_normalize=False)
    tensor([ 0.5000, -0.5000,  0.0000,  0.0000])
    """
    groups = _as_groups(rewards.float(), n_samples_per_prompt)
    centered = groups - groups.mean(dim=1, keepdim=True)
    if std_normalize and n_samples_per_prompt > 1:
        centered = centered / (groups.std(dim=1, keepdim=True) + GRPO_STD_EPS)
    return centered.reshape(-1)


def leave_one_out(rewards: Tensor, n_samples_per_prompt: int) -> Tensor:
    """RLOO baseline (Ahmadian et al. 2024, eq. 6): ``A_i = r_i - mean_{j != i} r_j`` per group.

    Equal to ``G / (G - 1) * (r_i - mean_g)``. Needs G >= 2. Args: rewards [B]. Returns: [B].
    """
    g = n_samples_per_prompt
    if g < 2:
        raise ValueError("rloo needs --n-samples-per-prompt >= 2 (the baseline leaves one sample out)")
    groups = _as_groups(rewards.float(), g)
    others_mean = (groups.sum(dim=1, keepdim=True) - groups) / (g - 1)
    return (groups - others_mean).reshape(-1)


def discounted_returns(rewards: Tensor, gamma: float) -> Tensor:
    """``G_t = r_t + gamma * G_{t+1}``, ``G_T = 0``, along the last axis.

    Args: rewards [B, T] token rewards (zero beyond each response). Returns: [B, T].
    """
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        out[:, t] = running
    return out


def gae(rewards: Tensor, values: Tensor, gamma: float, lambd: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16) over response tokens.

    ``delta_t = r_t + gamma V_{t+1} - V_t`` with ``V_T = 0``; ``A_t = sum_l (gamma lambd)^l delta_{t+l}``;
    ``returns = A + V``. Assumption: rewards *and values* are zero beyond each sample's last response
    token, so the token after the end bootstraps from 0 (the episode ends) and padding carries 0
    advantage. The PPO estimator zeroes them for you; callers of ``gae`` directly must do the same.

    Vectorised: deltas are discounted by ``gamma * lambd`` with ``discounted_returns``, which is the
    same recursion (``A_t = delta_t + gamma lambd A_{t+1}``).

    Args: rewards [B, T], values [B, T]. Returns: (advantages [B, T], returns [B, T]).
    """
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    deltas = rewards + gamma * next_values - values
    advantages = discounted_returns(deltas, gamma * lambd)
    return advantages, advantages + values


def response_extent(loss_mask: Tensor) -> Tensor:
    """[B, T] 1 up to and including each row's last masked token, 0 after (the right padding)."""
    return loss_mask.flip(1).cummax(dim=1).values.flip(1)


def last_token_onehot(loss_mask: Tensor) -> Tensor:
    """[B, T] one-hot of each row's last masked token; an all-zero row stays all-zero."""
    extent = response_extent(loss_mask)
    shifted = torch.cat([extent[:, 1:], torch.zeros_like(extent[:, :1])], dim=1)
    return extent - shifted


def _as_groups(rewards: Tensor, n: int) -> Tensor:
    if n < 1 or rewards.numel() % n != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of --n-samples-per-prompt={n}")
    return rewards.reshape(-1, n)


def _reward_kl(inp: AdvantageInputs, cfg: AlgoConfig) -> Tensor:
    """[B, T] per-token KL(old || ref) for KL-in-reward; zeros when ``--kl-coef`` is 0 (slime skips it).

    slime uses ``--kl-loss-type``'s estimator here too.
    """
    if cfg.kl_coef == 0 or inp.log_probs is None or inp.ref_log_probs is None:
        if cfg.kl_coef != 0:
            raise ValueError("--kl-coef > 0 needs log_probs and ref_log_probs (a reference model)")
        return torch.zeros_like(inp.loss_mask, dtype=torch.float32)
    return compute_approx_kl(inp.log_probs, inp.ref_log_probs, cfg.kl_loss_type)


def _broadcast(per_sample: Tensor, loss_mask: Tensor) -> Tensor:
    return per_sample.float()[:, None] * loss_mask.float()


# -------------------------------------------------------------------------------------- estimators


def _grpo_scalar(rewards: Tensor, n: int, cfg: AlgoConfig) -> Tensor:
    if cfg.disable_rewards_normalization:
        return rewards.float()
    return group_normalize(rewards, n, std_normalize=not cfg.disable_grpo_std_normalization)


@register_estimator("grpo", group_relative=True)
@register_estimator("gspo", group_relative=True, policy_loss="gspo")
@register_estimator("cispo", group_relative=True, policy_loss="cispo")
def grpo_advantages(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
    """GRPO outcome advantage: the group-normalised reward on every response token; returns = A.

    GSPO and CISPO use the same advantages in slime; they differ only in the policy loss.
    """
    adv = _broadcast(_grpo_scalar(inp.rewards, inp.n_samples_per_prompt, cfg), inp.loss_mask)
    return adv, adv.clone()


@register_estimator("rloo", group_relative=True)
def rloo_advantages(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al. 2024): leave-one-out baseline, broadcast; ``-kl_coef * kl`` per token.

    Not in slime; the KL shaping mirrors its reinforce_plus_plus_baseline.
    """
    base = _broadcast(leave_one_out(inp.rewards, inp.n_samples_per_prompt), inp.loss_mask)
    adv = base - cfg.kl_coef * _reward_kl(inp, cfg) * inp.loss_mask
    return adv, adv.clone()


@register_estimator("reinforce_plus_plus")
def reinforce_pp_advantages(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): token rewards ``-kl_coef * kl`` plus the reward on the
    last response token, discounted returns with ``--gamma``, then batch whitening over masked tokens.

    Returns are the unwhitened discounted returns (no critic uses them).
    """
    mask = inp.loss_mask.float()
    token_rewards = -cfg.kl_coef * _reward_kl(inp, cfg) * mask
    token_rewards = token_rewards + inp.rewards.float()[:, None] * last_token_onehot(mask)
    returns = discounted_returns(token_rewards, cfg.gamma) * mask
    return masked_whiten(returns, mask) * mask, returns


@register_estimator("reinforce_plus_plus_baseline", group_relative=True)
def reinforce_pp_baseline_advantages(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (Hu 2025): ``r_i - mean_group`` (unless ``--disable-rewards-normalization``)
    broadcast, minus ``kl_coef * kl`` per token, then batch whitening over masked tokens.
    """
    mask = inp.loss_mask.float()
    r = inp.rewards.float()
    if not cfg.disable_rewards_normalization:
        r = group_normalize(r, inp.n_samples_per_prompt, std_normalize=False)
    raw = (_broadcast(r, mask) - cfg.kl_coef * _reward_kl(inp, cfg)) * mask
    return masked_whiten(raw, mask) * mask, raw


@register_estimator("ppo", needs_critic=True)
def ppo_advantages(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
    """PPO (Schulman et al. 2017) with GAE: token rewards ``-kl_coef * kl``, the reward added on the
    last response token, then ``gae`` with the critic's values.

    Rewards and values are zeroed after the last masked token so the episode ends there.
    """
    if inp.values is None:
        raise ValueError("advantage estimator 'ppo' needs critic values (AdvantageInputs.values)")
    extent = response_extent(inp.loss_mask.float())
    token_rewards = -cfg.kl_coef * _reward_kl(inp, cfg) * extent
    token_rewards = token_rewards + inp.rewards.float()[:, None] * last_token_onehot(inp.loss_mask.float())
    return gae(token_rewards, inp.values.float() * extent, cfg.gamma, cfg.lambd)


# DCPO's train_metadata keys.
DCPO_CONFIDENCE = "dcpo_confidence"  # [B] stated confidence in [0, 1] (0 when none was given)
DCPO_CONFIDENCE_MASK = "dcpo_confidence_mask"  # [B, T] 1 on the confidence-span tokens


@register_estimator(
    "dcpo", group_relative=True, side_inputs=(DCPO_CONFIDENCE, DCPO_CONFIDENCE_MASK),
    side_inputs_hint="add --rm-type math_confidence --custom-reward-post-process-path dcpo (per-sample confidences)",
)
def dcpo_advantages(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
    """DCPO (Decoupled Calibration Policy Optimization, arXiv:2603.09117).

    Inputs: ``inp.rewards`` [B] is the accuracy reward; ``train_metadata`` holds
    ``dcpo_confidence`` [B] and ``dcpo_confidence_mask`` [B, T].
    Per group: ``hybrid = alpha * acc + (1 - alpha) * mean_group(acc)``,
    ``cal = w * (hybrid - confidence)^2``; each reward is group-normalised on its own (GRPO rules),
    then assigned by position, not added: reasoning tokens get ``A_acc``, confidence tokens get
    ``-A_cal`` (negated because a larger calibration error must lower those tokens' probability).
    A sample without a confidence span gets ``A_acc`` on every token (its confidence still enters
    the group's calibration statistics; the method leaves this case unspecified).
    """
    meta = inp.train_metadata or {}
    missing = [k for k in (DCPO_CONFIDENCE, DCPO_CONFIDENCE_MASK) if k not in meta]
    if missing:
        raise ValueError(f"advantage estimator 'dcpo' needs train_metadata keys {missing}")
    n, acc = inp.n_samples_per_prompt, inp.rewards.float()
    group_acc = _as_groups(acc, n).mean(dim=1).repeat_interleave(n)
    hybrid = cfg.dcpo_hybrid_alpha * acc + (1 - cfg.dcpo_hybrid_alpha) * group_acc
    cal = cfg.dcpo_calibration_weight * (hybrid - meta[DCPO_CONFIDENCE].float()) ** 2
    acc_adv, cal_adv = _grpo_scalar(acc, n, cfg), _grpo_scalar(cal, n, cfg)
    mask, conf = inp.loss_mask.float(), meta[DCPO_CONFIDENCE_MASK].float() * inp.loss_mask.float()
    adv = acc_adv[:, None] * (mask - conf) - cal_adv[:, None] * conf
    return adv, adv.clone()
