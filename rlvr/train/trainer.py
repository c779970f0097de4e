"""The trainer: turns a ``RolloutBatch`` into optimizer steps (DESIGN "Layers": ``train``).

Per rollout: recompute the old policy's log-probs p0 (or take the engine's with
``--use-rollout-logprobs``) and the reference model's (only when a KL term uses them), compute
advantages with the registered estimator, then for each global batch of ``global_batch_size``
samples run micro-batches forward/backward and take one optimizer step; a rollout of several
global batches takes several steps, and from the second one on p_theta != p0, so the PPO ratio and
clip act (off-policy). The loss of every micro-batch is normalised by the *global* batch's
denominator (samples, or tokens with ``--calculate-per-token-loss``), so the accumulated gradient
does not depend on how the batch is split (tested, packed, both modes).

Micro-batches are packed (``packing.py``: no padding, attention within each sample) and formed by
token count (``batching.micro_batches``: first-fit count, Karmarkar–Karp balance, never over the
cap, never empty) or by sample count. A sample longer than ``--max-tokens-per-gpu`` on its own is
left out of training (its loss mask is zeroed; ``train/overlong_samples`` counts it); when the
lengths can be known in advance, config validation and ``rlvr.runtime.build`` reject the setting instead.

The policy's loss is ``rlvr.algo.actor_loss`` (policy loss, corrections, entropy, KL: a pure
function); gradient accumulation and the optimizer step are ``step.py``'s, shared with PPO's critic
(``critic.CriticTrainer``, its own step after the policy's on the same micro-batches). A
non-finite loss or gradient norm skips the optimizer step (``guard.py``). With ``--bf16`` the
model runs in bfloat16 and AdamW updates float32 master copies of the weights.

One code path for one process and for a data-parallel rank: the trainer asks a strategy
(``parallel.py``: ``SingleProcess`` by default, ``DataParallel`` under ``--ray``) for its share
of a batch, the micro-batch count, gradient synchronisation, sums and whole tensors. Test-only
switches are read from ``rlvr.core.testing.trainer_seam()``; the micro-batch ``Layout`` (packed, or
padded as the throughput benchmark's reference) is a constructor argument.

On-policy distillation (``--use-opd``): a teacher (``teacher.py``, built by ``rlvr.runtime.build``) scores
the sampled tokens before the steps, and ``rlvr.algo.opd`` lowers the advantages by
``opd_kl_coef * (p0's log-prob - the teacher's)``. ``--kl-loss-type token_level_kl``: the reference
keeps its hidden states and the policy's chunked output layer sums the exact KL over the
vocabulary (``token_kl.py``).

The trainer is algorithm-blind beyond the functions it looks up in ``rlvr.algo``'s registries.
Dropout stays off (``model.eval()``) in training too, as in slime, so p0 is exactly the policy
before the update.

``Trainer`` composes its parts, each built complete in its constructor: the ``Policy``
(``policy.py``: the model, its LoRA, prepared layers, the strategy's wrapper, the log-prob
forward), the ``Reference`` (``reference.py``) and the teacher when the loss reads them, PPO's
critic (``critic.CriticTrainer``), the ``Optimizer`` (``optimizer.py``: AdamW, masters, LR
schedule, clipping), the ``MicroBatcher`` (``batching.py``), the ``RolloutBuilder``
(``rollout_tensors.py``: a rollout's tensors, complete before the steps), the ``BadStepGuard`` and
``CheckpointIO`` (``checkpoint.py``); ``report.py`` turns a rollout's tensors and steps into metrics.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import torch

from rlvr.algo import AlgoConfig, actor_loss, aggregate_loss, estimator_of, global_denominator
from rlvr.algo.score_centering import split_heads
from rlvr.config import TrainConfig
from rlvr.core.device import trim_host_heap
from rlvr.core.testing import hook_loss
from rlvr.core.types import Sample
from rlvr.train import routing_replay
from rlvr.train.batching import MicroBatcher, pad_right
from rlvr.train.checkpoint import CheckpointIO, save_hf
from rlvr.train.critic import CriticTrainer
from rlvr.train.guard import BadStepGuard
from rlvr.train.lora import LoraState
from rlvr.train.memory import reset_peak_memory
from rlvr.train.optimizer import Optimizer, adamw_of
from rlvr.train.packing import Layout
from rlvr.train.parallel import Parallel, SingleProcess
from rlvr.train.policy import Policy, load_policy
from rlvr.train.reference import Reference
from rlvr.train.report import replay_metrics, rollout_metrics
from rlvr.train.rollout_tensors import RolloutBuilder, RolloutProgress, RolloutTensors
from rlvr.train.step import accumulate

# Names that lived here before the trainer was split into parts, still importable from here
# (docs/changelog.md): the layer helpers are rlvr.train.policy's now.
from rlvr.train.logprobs import response_log_probs  # noqa: F401
from rlvr.train.policy import COMPILED_PARTS, compile_layers, enable_recompute, prepare_layers  # noqa: F401
from rlvr.train.rollout_tensors import collate_train_metadata  # noqa: F401


class Trainer:
    def __init__(
        self,
        train: TrainConfig,
        algo: AlgoConfig,
        temperature: float = 1.0,
        global_batch_size: int | None = None,
        n_samples_per_prompt: int = 1,
        total_steps: int = 1,
        parallel: Parallel | None = None,
        layout: Layout = Layout(),  # noqa: B008 (Layout is frozen)
        teacher=None,
        device: torch.device | str = "cpu",
        lora_sync_merged: bool = False, custom_tis=None,  # custom_tis: --custom-tis-function-path, loaded
    ):
        self.cfg, self.algo, self.custom_tis = train, algo, custom_tis  # (the builders: rlvr.runtime.plugins)
        self.global_batch_size = global_batch_size
        torch.manual_seed(train.seed)
        # Every part's tensors live on ``device``; --bf16's float32 masters too (rlvr.core.device).
        # The order is the order the parts draw from the seeded RNG (LoRA's init, the critic's head).
        self.device = torch.device(device)
        dp = parallel or SingleProcess()
        model = load_policy(train.hf_checkpoint, train.bf16, self.device)
        lora_state = LoraState.add(model, train, lora_sync_merged)
        self.reference = Reference.build(train, algo, model, lora_state, self.device)  # before layers are prepared
        # R3: policy and reference forwards use the engine's experts (routing_replay.py)
        self.routing_replay = routing_replay.install(model, self.reference and self.reference.model) \
            if train.use_rollout_routing_replay else []
        self.teacher = teacher  # --use-opd: rlvr.train.teacher.LoadedTeacher or ServedTeacher
        self.policy = Policy(model, lora_state, train, dp, temperature, layout)
        self.optimizer = Optimizer(model, self.policy.module, dp, train, total_steps)
        # PPO's critic (GAE needs values); every other estimator is critic-free.
        self.critic = CriticTrainer(train.critic_load or train.hf_checkpoint, adamw_of(train, train.critic_lr or train.lr),
                                    algo.value_clip, train.clip_grad, self.device) \
            if estimator_of(algo).needs_critic else None
        self.guard = BadStepGuard(train.max_consecutive_skipped_steps)
        self.batches = MicroBatcher(train, dp, self.device)
        self.rollouts = RolloutBuilder(train, algo, self.policy, self.batches, self.reference, self.critic, teacher,
                                       n_samples_per_prompt, global_batch_size)
        self.checkpoints = CheckpointIO(self.policy, self.optimizer, self.reference, self.critic, self.guard)
        self.step = 0  # optimizer steps attempted (train/step), skipped ones included, as Megatron's iteration

    @property
    def model(self) -> torch.nn.Module:
        """The policy's model (the embedded engine shares it; the builders and SFT read it)."""
        return self.policy.model

    # ---- what the loop calls --------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's parameters by HF name (data-parallel: whole tensors; FSDP2 gathers them on
        rank 0, every rank must call); with LoRA the adapters, or merged for engines without LoRA layers."""
        return self.policy.weights()

    def train(self, rollout_id: int, samples: list[Sample]) -> dict[str, float]:
        """One rollout's optimizer steps. Returns ``train/*`` and ``perf/*`` metrics."""
        t0 = time.perf_counter()
        trim_host_heap()  # what the rollout phase freed, before the step's peak is counted
        reset_peak_memory(self.device)
        batch, progress = self.rollouts.build(samples), RolloutProgress()
        n, gbs = len(samples), self.global_batch_size or len(samples)
        out: dict[str, list[float]] = defaultdict(list)
        skipped = 0
        for start in range(0, n, gbs):
            idx = [i for i in range(start, min(start + gbs, n)) if i in batch.kept]
            if not idx:
                continue
            step_metrics = self._rl_step(rollout_id, batch, progress, idx)
            skipped += int(step_metrics.pop("skipped"))
            for k, v in step_metrics.items():
                out[k].append(v)
        if batch.p0_in_loss:  # data-parallel: each rank filled its own rows
            self.policy.dp.all_reduce_sum_(batch.old_log_probs)
        if self.reference is not None:
            self.reference.refresh(rollout_id, self.policy.model)
        metrics = rollout_metrics(batch, progress, out, skipped, time.perf_counter() - t0, self.device)
        trim_host_heap()  # the step's activations and log-prob chunks, for the rollout phase
        return metrics | replay_metrics(self.routing_replay, samples)

    def train_sft(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step of negative log-likelihood on the response tokens (per-token mean)."""
        width = max(s.response_length for s in samples)
        mask = pad_right([s.loss_mask for s in samples], width).to(self.device)
        idx = list(range(len(samples)))

        def nll(mb: list[int], lp: torch.Tensor, ent: torch.Tensor):
            return -lp, {"entropy_loss": ent}

        metrics = self._policy_step(self.step, samples, self.batches.split(samples, idx),
                                    mask, True, global_denominator([mask[idx]], True), nll)
        metrics.pop("skipped")
        self.step += 1
        return {f"train/{k}": v for k, v in metrics.items()}

    # ---- one global batch ------------------------------------------------------------------
    def _rl_step(self, rollout_id: int, batch: RolloutTensors, progress: RolloutProgress,
                 idx: list[int]) -> dict[str, float]:
        """One optimizer step of the policy on global batch ``idx`` (``actor_loss``), then one of the
        critic on the same micro-batches (on all of ``idx``: its value loss does not vanish with the
        advantage). The policy's micro-batches hold the samples with signal only; the normaliser
        is still the whole batch's."""
        per_token = self.algo.calculate_per_token_loss
        trained = self.batches.with_signal(idx, batch.silent)
        mbs = self.batches.split(batch.samples, trained)
        denominator = global_denominator([batch.mask[idx]], per_token)
        progress.skipped += len(idx) - len(trained)
        if batch.p0_in_loss:
            progress.unscored |= set(idx) - set(trained)
        # The per-token metrics (entropy, clip fraction, ...) as means over the samples that ran;
        # loss and pg_loss stay the whole batch's (a skipped sample's are exactly 0).
        scale = denominator / global_denominator([batch.mask[trained]], per_token) if trained else 1.0

        def loss(mb: list[int], lp: torch.Tensor, ent: torch.Tensor, exact_kl: torch.Tensor | None = None):
            head = None
            if batch.sampler_head is not None:  # score centering: lp carries the head tokens' too
                lp, head = split_heads(lp, *(t[mb] for t in batch.sampler_head))
            if batch.p0_in_loss:
                batch.old_log_probs[mb] = lp.detach()
            ref_lp = batch.ref_log_probs[mb] if batch.ref_log_probs is not None else None
            return actor_loss(lp, ent, batch.old_log_probs[mb], batch.rollout_log_probs[mb], batch.advantages[mb],
                              batch.mask[mb], ref_lp, self.algo, head, exact_kl=exact_kl, tis_fn=self.custom_tis)

        kl_ref = batch.ref_states.for_micro_batch if batch.ref_states is not None else None
        step_metrics = self._policy_step(rollout_id, batch.samples, mbs, batch.mask, per_token, denominator, loss,
                                         heads=batch.sampler_head is not None, kl_ref=kl_ref, metric_scale=scale)
        if self.critic is not None:
            critic_mbs = mbs if len(trained) == len(idx) else self.batches.split(batch.samples, idx)
            step_metrics |= self.critic.step(batch.samples, critic_mbs, batch.mask, per_token, denominator,
                                             batch.values, batch.returns, self.optimizer.lr_scale(self.step))
        self.step += 1
        return step_metrics

    def _policy_step(self, rollout_id: int, samples: list[Sample], mbs: list[list[int]], mask: torch.Tensor,
                     per_token: bool, denominator: float, token_loss, heads: bool = False,
                     kl_ref=None, metric_scale: float = 1.0) -> dict[str, float]:
        """One optimizer step of the policy over micro-batches ``mbs``, skipped (and recorded by the
        guard) when the loss or the gradient norm is not finite.

        ``token_loss(mb, log_probs, entropy) -> (per-token loss, per-token metrics)``, all [b, T].
        Every micro-batch is normalised by the global batch's ``denominator``, so the summed
        gradient equals the one-batch gradient. ``kl_ref(mb) -> logprobs.KLReference`` (token_level_kl)
        adds the exact KL to the forward's outputs, passed to ``token_loss`` as a fourth argument.
        The per-token metrics but ``loss`` and ``pg_loss`` (exactly 0 on a skipped sample) are
        multiplied by ``metric_scale``.
        """
        width = mask.shape[1]

        def loss_fn(mb: list[int]):
            with self.policy.training():
                out = self.policy.log_probs([samples[i] for i in mb], width, True, heads=heads,
                                            kl_ref=kl_ref(mb) if kl_ref is not None else None)
            loss_tok, tok_metrics = token_loss(mb, *(t.float() for t in out))
            return hook_loss(rollout_id, aggregate_loss(loss_tok, mask[mb], per_token, denominator)), tok_metrics

        totals = accumulate(self.optimizer.learner, mbs, loss_fn, mask, per_token, denominator)
        totals = {k: v if k in ("loss", "pg_loss") else v * metric_scale for k, v in totals.items()}
        reason = self.optimizer.step(totals, self.step)
        self.guard.record(rollout_id, self.step, reason)
        totals["skipped"] = float(reason is not None)
        return totals

    # ---- checkpoints -----------------------------------------------------------------------
    @torch.no_grad()
    def probe_log_probs(self, sequences: list[tuple[list[int], list[int], torch.Tensor | None]]) -> list[list[float]]:
        """Log-probs of each ``(prompt, response, routed experts or None)``'s response tokens under the
        policy, at the rollout temperature, through the training forward (the policy-freshness probe's
        other side; with ``--use-rollout-routing-replay`` the forward replays the engine's routing, as
        training does)."""
        samples = [Sample("", list(p), response_ids=list(r), loss_mask=[1] * len(r), rollout_routed_experts=routes)
                   for p, r, routes in sequences]
        width = max((len(r) for _, r, _ in sequences), default=0)
        if width == 0:
            return [[] for _ in sequences]
        lp, _ = self.policy.log_probs(samples, width, with_entropy=False)
        return [lp[i, :len(r)].tolist() for i, (_, r, _) in enumerate(sequences)]

    @torch.no_grad()
    def probe_next_log_probs(self, prompts: list[list[int]]) -> torch.Tensor:
        """Log-probs ``[n, vocab]`` (float32, host) of every token as the next one after each prompt
        under the policy, at the rollout temperature, through the training forward (every vocabulary
        id a sampler head of one dummy response token): the probe's other side when the engine samples
        one token, computed before or while the engine samples it."""
        vocab = torch.arange(self.policy.model.config.vocab_size)
        samples = [Sample("", list(p), response_ids=[0], loss_mask=[1], rollout_topk_token_ids=[vocab]) for p in prompts]
        lp, _ = self.policy.log_probs(samples, 1, with_entropy=False, heads=True)
        return lp[:, 0, 1:].cpu()

    def save_hf(self, tokenizer, directory: str | Path) -> Path:
        """The policy as a plain HF checkpoint (``--save-hf``; rlvr.runtime.roles.TrainerRole)."""
        return save_hf(self.policy.model, tokenizer, directory)

    def check_bad_steps(self, skipped_path: Callable[[int], str]) -> None:
        """``TrainingStopped`` after ``--max-consecutive-skipped-steps`` skipped in a row (``BadStepGuard``)."""
        self.guard.raise_if_exhausted(skipped_path)

    def save(self, directory: str | Path, tokenizer=None, extra: dict | None = None) -> Path:
        """Write the policy as a plain HF checkpoint plus ``trainer_state.pt`` (optimizer, step) and,
        with PPO, ``critic/``, atomically (``CheckpointIO``)."""
        return self.checkpoints.save(directory, self.step, tokenizer, extra)

    def load(self, directory: str | Path) -> dict:
        """Restore what ``save`` wrote (policy weights and masters, optimizer(s), step, a moved
        reference model, the bad-step streak); returns its ``extra``."""
        self.step, extra = self.checkpoints.load(directory)
        return extra
