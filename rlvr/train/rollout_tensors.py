"""One rollout as the trainer's tensors, complete when built.

``RolloutBuilder`` is made at start-up with the parts the configured loss reads (the policy, the
reference when a KL term reads it, the critic for PPO, the teacher for ``--use-opd``, the
sampler's heads for score centering); ``build`` then fills every field those need in one pass,
before any optimizer step: the masks and the engine's log-probs q; the no-grad forwards (p0
unless it is the engine's or, on-policy, the training forward's own; the reference's log-probs
and hidden states; the critic's values; the teacher's log-probs); the advantages and returns of
the registered estimator (lowered by on-policy distillation, whitened with
``--normalize-advantages``) together with the rewards as the estimator normalised them; and the
samples without signal. A field is None only when the configured loss does not read it.

The one field written later is ``old_log_probs`` when ``p0_in_loss``: on-policy (one optimizer
step, nothing reads p0 before the loss) p0 is the training forward's own log-probs, detached --
the numbers a separate forward would give, one forward fewer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlvr.algo import AdvantageInputs, estimator_of, masked_whiten, silent_samples
from rlvr.algo.advantages import estimator_rewards, group_normalize
from rlvr.algo.opd import opd_advantages
from rlvr.algo.score_centering import head_rollout_log_probs
from rlvr.core.testing import skip_silent_samples, trainer_seam
from rlvr.core.types import Sample
from rlvr.train.batching import MicroBatcher, pad_right
from rlvr.train.critic import CriticTrainer
from rlvr.train.policy import Policy
from rlvr.train.reference import Reference
from rlvr.train.token_kl import ReferenceStates


def collate_train_metadata(samples: list[Sample], width: int) -> dict[str, torch.Tensor]:
    """``Sample.train_metadata`` as tensors: a scalar per sample -> [B]; a per-token list -> [B, width]."""
    keys = set(samples[0].train_metadata) if samples else set()
    out: dict[str, torch.Tensor] = {}
    for key in sorted(keys):
        values = [s.train_metadata.get(key) for s in samples]
        if any(v is None for v in values):
            raise ValueError(f"train_metadata key {key!r} is missing on some samples of the rollout")
        if isinstance(values[0], (list, tuple)):
            out[key] = pad_right([list(v) for v in values], width)
        else:
            out[key] = torch.tensor([float(v) for v in values], dtype=torch.float32, device="cpu")
    return out


@dataclass(frozen=True)
class RolloutTensors:
    """One rollout as ``[B, width]`` tensors (B = every sample of the rollout; rows of samples left
    out of training are zero in what the trainer computes)."""

    samples: list[Sample]
    kept: set[int]  # the samples that fit a micro-batch (``MicroBatcher.fitting``)
    mask: torch.Tensor  # loss mask; zero rows for the samples left out
    rollout_log_probs: torch.Tensor  # q, the engine's
    old_log_probs: torch.Tensor  # p0; with ``p0_in_loss`` filled by the training forward
    p0_in_loss: bool
    rewards: torch.Tensor  # [B] as the estimator normalised them (slime's rollout_data["rewards"])
    advantages: torch.Tensor
    silent: set[int]  # kept samples without signal (``rlvr.algo.silent_samples``): no forward/backward
    ref_log_probs: torch.Tensor | None  # a KL term only
    ref_states: ReferenceStates | None  # token_level_kl: the reference's hidden states
    values: torch.Tensor | None  # V_old, PPO's critic only
    returns: torch.Tensor | None  # PPO's critic only
    teacher_log_probs: torch.Tensor | None  # --use-opd; NaN rows: the teacher failed
    opd_reverse_kl: torch.Tensor | None  # --use-opd
    sampler_head: tuple[torch.Tensor, torch.Tensor] | None  # score centering: (log q, mask) [B, width, K]

    @property
    def width(self) -> int:
        return self.mask.shape[1]


@dataclass(frozen=True)
class Advantages:
    """What the advantage step computed for a rollout."""

    advantages: torch.Tensor
    returns: torch.Tensor | None
    rewards: torch.Tensor
    opd_reverse_kl: torch.Tensor | None


class RolloutBuilder:
    """Builds each rollout's ``RolloutTensors`` with the parts the configured loss reads (None for
    those it does not: the reference, the critic, the teacher)."""

    def __init__(self, train, algo, policy: Policy, batches: MicroBatcher, reference: Reference | None,
                 critic: CriticTrainer | None, teacher, n_samples_per_prompt: int, global_batch_size: int | None):
        self.algo, self.policy, self.batches = algo, policy, batches
        self.reference, self.critic, self.teacher = reference, critic, teacher
        self.n_samples_per_prompt, self.global_batch_size = n_samples_per_prompt, global_batch_size
        self.use_rollout_logprobs = train.use_rollout_logprobs
        self.lora_dropout = bool(train.lora_dropout)
        self.estimator = estimator_of(algo)
        self.device = batches.device

    def build(self, samples: list[Sample]) -> RolloutTensors:
        n, width = len(samples), max(s.response_length for s in samples)
        kept = self.batches.fitting(samples)
        # Built on the host from the samples' lists, then one copy each to the device.
        mask = pad_right([s.loss_mask if i in kept else [] for i, s in enumerate(samples)], width).to(self.device)
        rollout_lp = pad_right([s.rollout_log_probs for s in samples], width).to(self.device)
        p0_in_loss = self._p0_in_loss(n)
        with torch.no_grad():
            old_lp = self._old_log_probs(samples, kept, width, rollout_lp, p0_in_loss)
            ref_lp, ref_states = (None, None) if self.reference is None else self.reference.log_probs(
                self.policy, self.batches, samples, kept, width)
            values = None if self.critic is None else self.batches.forward_all(
                lambda mb: self.critic.values(mb, width), samples, kept, width)
            teacher_lp = None if self.teacher is None else self.batches.forward_all(  # answers on the host
                lambda mb: self.teacher.log_probs(mb, self.policy.temperature, width, self.policy.chunk(),
                                                  self.policy.layout).to(self.device), samples, kept, width)
        adv = self._advantages(samples, mask, None if p0_in_loss else old_lp, old_lp, ref_lp, values, teacher_lp)
        head = None
        if self.algo.use_score_centering:
            head = tuple(t.to(self.device) for t in head_rollout_log_probs(samples, width))
        return RolloutTensors(samples, kept, mask, rollout_lp, old_lp, p0_in_loss, adv.rewards, adv.advantages,
                              self._silent(adv.advantages, mask, kept), ref_lp, ref_states, values, adv.returns,
                              teacher_lp, adv.opd_reverse_kl, head)

    def _p0_in_loss(self, n: int) -> bool:
        """On-policy: p0 from the training forward (one optimizer step, nothing reads p0 before the loss)."""
        return (trainer_seam().p0_from_train_forward and (self.global_batch_size or n) >= n
                and self.algo.kl_coef == 0 and not self.use_rollout_logprobs and self.teacher is None
                and not self.lora_dropout)

    def _old_log_probs(self, samples, kept, width, rollout_lp, p0_in_loss: bool) -> torch.Tensor:
        if self.use_rollout_logprobs:
            if any(len(s.rollout_log_probs) != s.response_length for s in samples):
                raise ValueError("--use-rollout-logprobs: some samples carry no engine log-probs for every token")
            return rollout_lp
        if p0_in_loss:
            return torch.zeros(len(samples), width, device=self.device)  # filled by the training forward
        return self.batches.forward_all(lambda mb: self.policy.log_probs(mb, width, False)[0], samples, kept, width)

    def _advantages(self, samples, mask, log_probs, old_lp, ref_lp, values, teacher_lp) -> Advantages:
        """The registered estimator's advantages and returns (lowered by on-policy distillation,
        whitened with --normalize-advantages), and the rewards as it normalised them."""
        algo = self.algo
        rewards = torch.tensor([s.scalar_reward() for s in samples], dtype=torch.float32, device=self.device)
        rewards = estimator_rewards(samples, rewards)  # a reward post-process's rewards for the estimator, if any
        metadata = collate_train_metadata(samples, mask.shape[1])
        inputs = AdvantageInputs(rewards, mask, self.n_samples_per_prompt, log_probs=log_probs,
                                 ref_log_probs=ref_lp, values=values,
                                 train_metadata={k: v.to(self.device) for k, v in metadata.items()})
        advantages, returns = self.estimator(inputs, algo)
        opd_kl = None
        if teacher_lp is not None:  # on-policy distillation (rlvr.algo.opd)
            answered = ~teacher_lp.isnan().any(dim=1, keepdim=True)
            advantages, opd_kl = opd_advantages(advantages, old_lp, teacher_lp.nan_to_num(0.0), mask * answered,
                                                algo.opd_kl_coef)
        if algo.normalize_advantages:
            advantages = masked_whiten(advantages, mask)
        return Advantages(advantages, returns, self._normalised_rewards(rewards), opd_kl)

    def _normalised_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        """The rewards as the estimator normalised them: group-normalised for the group-relative
        estimators (slime's ``_post_process_rewards``) unless normalisation is off."""
        algo, n = self.algo, self.n_samples_per_prompt
        if not self.estimator.group_relative or algo.disable_rewards_normalization or len(rewards) % n:
            return rewards
        return group_normalize(rewards, n, std_normalize=not algo.disable_grpo_std_normalization)

    def _silent(self, advantages: torch.Tensor, mask: torch.Tensor, kept: set[int]) -> set[int]:
        """The kept samples that add nothing to the policy's gradient (``rlvr.algo.silent_samples``:
        advantage 0 everywhere and no term that survives it): no forward or backward runs for them.
        Not with LoRA dropout, whose random masks for the other samples would then differ."""
        if not skip_silent_samples() or (self.policy.lora is not None and self.lora_dropout):
            return set()
        silent = silent_samples(advantages, mask, self.algo).tolist()
        return {i for i in kept if silent[i]}


@dataclass
class RolloutProgress:
    """What the policy's steps did with a rollout's samples."""

    skipped: int = 0  # silent samples the steps left out (data-parallel puts a few back)
    unscored: set[int] = field(default_factory=set)  # p0_in_loss rows no training forward filled

    def scored(self, batch: RolloutTensors) -> list[int]:
        """The rows whose p0 is known: all but the samples the training forward skipped (p0_in_loss)."""
        return [i for i in range(len(batch.samples)) if i not in self.unscored]
