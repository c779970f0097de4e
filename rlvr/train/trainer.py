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
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM
from transformers.modeling_layers import GradientCheckpointingLayer

from rlvr.algo import (
    AdvantageInputs,
    AlgoConfig,
    actor_loss,
    aggregate_loss,
    estimator_of,
    global_denominator,
    masked_mean,
    masked_whiten,
    silent_samples,
)
from rlvr.algo.advantages import estimator_rewards
from rlvr.algo.score_centering import head_rollout_log_probs, split_heads
from rlvr.algo.kl import TOKEN_LEVEL_KL
from rlvr.algo.opd import opd_advantages
from rlvr.config import TrainConfig
from rlvr.observe.rollout_data import rollout_data_metrics, slime_rewards
from rlvr.core.device import trim_host_heap
from rlvr.core.testing import hook_loss, skip_silent_samples, trainer_seam
from rlvr.train import lora, routing_replay
from rlvr.train.batching import first_fit_decreasing, fixed_size, micro_batches, pad_right
from rlvr.train.critic import CriticTrainer
from rlvr.train.guard import BadStepGuard
from rlvr.train.memory import peak_memory_gb, reset_peak_memory
from rlvr.train.attention import ATTN_IMPLEMENTATION
from rlvr.train.logprobs import auto_chunk_size, decoder_and_head, response_log_probs
from rlvr.train.packing import Layout
from rlvr.train.parallel import Parallel, SingleProcess
from rlvr.train.schedule import lr_at
from rlvr.train.step import Learner, accumulate, adamw, optimizer_step
from rlvr.train.token_kl import ReferenceStates, reference_forward
from rlvr.core.types import Sample, Status

log = logging.getLogger(__name__)


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


def load_policy(path: str, bf16: bool, device: torch.device | str = "cpu") -> torch.nn.Module:
    """A causal LM on ``device`` in eval mode (no dropout) whose attention understands packed micro-batches."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
    return model.to(device).eval()


def enable_recompute(model: torch.nn.Module) -> int:
    """Gradient checkpointing of every decoder layer (``--recompute-activations``); returns the
    number of layers. transformers only checkpoints a layer in training mode, and the trainer
    keeps the model in eval mode (no dropout), so only the layer's own flag is set, not its
    children's: dropout inside stays off."""
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        layer.gradient_checkpointing = True
        layer._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False)
        layer.training = True  # read by the checkpoint wrapper only
    if not layers:
        raise ValueError(f"{type(model).__name__} has no checkpointable layers; drop --recompute-activations")
    return len(layers)


COMPILED_PARTS = ("mlp", "input_layernorm", "post_attention_layernorm")  # a decoder layer's element-wise work


def compile_layers(model: torch.nn.Module) -> int:
    """``--compile-layers``: each decoder layer's MLP and norms compiled in place
    (``Module.compile``, dynamic shapes: packed rows of any length, one compiled graph for every
    layer); parameter names, checkpoints and weight syncs are unchanged, and the embedded engine
    sharing the module runs the compiled parts too. The packed attention stays eager. Returns the
    number of layers."""
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    parts = [getattr(layer, name) for layer in layers for name in COMPILED_PARTS if hasattr(layer, name)]
    if not parts:
        raise ValueError(f"{type(model).__name__} has no decoder layer with {COMPILED_PARTS}; drop --compile-layers")
    for part in parts:
        part.compile(dynamic=True)
    return len(layers)


def prepare_layers(model: torch.nn.Module, train) -> None:
    """The decoder layers as ``--recompute-activations`` and ``--compile-layers`` ask."""
    if train.recompute_activations:
        enable_recompute(model)
    if train.compile_layers:
        log.info("--compile-layers: %s of %d decoder layers compiled (inductor, dynamic shapes)",
                 "/".join(COMPILED_PARTS), compile_layers(model))


@dataclass
class RolloutTensors:
    """One rollout as the trainer's ``[B, width]`` tensors (B = every sample of the rollout; rows of
    samples left out of training are zero in what the trainer computes)."""

    samples: list[Sample]
    kept: set[int]  # the samples that fit a micro-batch (``Trainer._fitting``)
    mask: torch.Tensor  # loss mask; zero rows for the samples left out
    rollout_log_probs: torch.Tensor  # q, the engine's
    old_log_probs: torch.Tensor  # p0; with ``p0_in_loss`` filled from the training forward
    p0_in_loss: bool
    ref_log_probs: torch.Tensor | None  # None without a KL term
    values: torch.Tensor | None  # V_old, PPO's critic only
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    sampler_head: tuple[torch.Tensor, torch.Tensor] | None = None  # score centering: (log q, mask) [B, width, K]
    rewards: torch.Tensor | None = None  # [B] what the advantages were built from, as slime's rollout_data["rewards"]
    ref_states: ReferenceStates | None = None  # token_level_kl: the reference's hidden states
    teacher_log_probs: torch.Tensor | None = None  # --use-opd; NaN rows: the teacher failed
    opd_reverse_kl: torch.Tensor | None = None
    silent: set[int] = dataclasses.field(default_factory=set)  # kept samples without signal (``_skippable``)
    skipped: int = 0  # silent samples the policy's steps left out (data-parallel puts a few back)
    unscored: set[int] = dataclasses.field(default_factory=set)  # p0_in_loss rows no forward filled

    @property
    def width(self) -> int:
        return self.mask.shape[1]


def save_hf(model, tokenizer, directory: str | Path) -> Path:
    """A plain HF checkpoint of ``model`` and ``tokenizer`` (a LoRA-wrapped policy is written merged)."""
    merged = lora.merged_weights(model) if lora.has_adapter(model) else None
    model.save_pretrained(directory, state_dict=merged)
    tokenizer.save_pretrained(directory)
    return Path(directory)


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
        self.total_steps = total_steps  # optimizer steps in the run, for the LR schedule
        self.temperature = temperature
        self.global_batch_size = global_batch_size
        self.n_samples_per_prompt = n_samples_per_prompt
        self.layout = layout  # packed micro-batches; benchmarks/train_throughput.py compares padded ones
        torch.manual_seed(train.seed)
        # Policy, reference, critic, masters, optimizer state and every rollout tensor live on
        # ``device``; --bf16's float32 masters too (rlvr.core.device).
        self.device = torch.device(device)
        self.model = load_policy(train.hf_checkpoint, train.bf16, self.device)
        # LoRA (rlvr.train.lora): PEFT's layers in self.model, only the adapters trainable; the
        # engines receive the adapters (merged weights for external engines).
        self.peft = lora.add_adapter(self.model, train) if lora.enabled(train) else None
        self.lora_sync_merged = lora_sync_merged
        # The reference model exists only when a KL term reads it; frozen, never trained. With
        # LoRA it is the policy itself with the adapter disabled (``_reference``): no copy.
        needs_ref = algo.use_kl_loss or algo.kl_coef != 0
        self.ref_model = None
        if needs_ref and self.peft is not None and not train.ref_load:
            self.ref_model = self.model
            log.info("LoRA: the KL reference is the base model with the adapter disabled; no reference copy "
                     "(%.1f MB saved)", lora.base_bytes(self.model) / 2**20)
        elif needs_ref:
            ref = load_policy(train.ref_load, train.bf16, self.device) if train.ref_load else copy.deepcopy(self.model)
            self.ref_model = ref.requires_grad_(False)
        # R3: policy and reference forwards use the engine's experts (routing_replay.py)
        self.routing_replay = routing_replay.install(self.model, self.ref_model) if train.use_rollout_routing_replay else []
        self.exact_kl = needs_ref and algo.kl_loss_type == TOKEN_LEVEL_KL
        self.teacher = teacher  # --use-opd: rlvr.train.teacher.LoadedTeacher or ServedTeacher
        prepare_layers(self.model, train)
        # Policy forwards go through the strategy's module (under --ray: DDP/FSDP2-wrapped, one rank).
        self.dp = parallel or SingleProcess()
        self.policy = self.dp.wrap(self.model)
        # Master weights: the parameters themselves in float32; float32 copies under --bf16.
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.master = self.params if not train.bf16 else [
            p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.optimizer = self._adamw(self.master, train.lr)
        self.learner = Learner(self.model, self.optimizer, self.params, self.master, self.dp, self.policy)
        # PPO's critic (GAE needs values); every other estimator is critic-free.
        self.critic = self._critic() if estimator_of(algo).needs_critic else None
        self.guard = BadStepGuard(train.max_consecutive_skipped_steps)
        self.ref_forwards = 0  # reference-model forward passes run (0 when no KL term)
        self.step = 0  # optimizer steps attempted (train/step), skipped ones included, as Megatron's iteration

    def _adamw(self, params, lr: float) -> torch.optim.Optimizer:
        return adamw(params, lr, (self.cfg.adam_beta1, self.cfg.adam_beta2), self.cfg.weight_decay)

    def _critic(self) -> CriticTrainer:
        c = self.cfg
        return CriticTrainer(c.critic_load or c.hf_checkpoint, partial(self._adamw, lr=c.critic_lr or c.lr),
                             self.algo.value_clip, c.clip_grad, self.device)

    # ---- what the loop calls --------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's parameters by HF name (data-parallel: whole tensors; FSDP2 gathers them on
        rank 0, every rank must call)."""
        if self.peft is not None:  # LoRA: the adapters only, or merged for engines without LoRA layers
            return lora.merged_weights(self.model) if self.lora_sync_merged else lora.adapter_weights(self.model)
        return self.dp.full_weights(self.policy, self.model)

    def train(self, rollout_id: int, samples: list[Sample]) -> dict[str, float]:
        """One rollout's optimizer steps. Returns ``train/*`` and ``perf/*`` metrics."""
        t0 = time.perf_counter()
        trim_host_heap()  # what the rollout phase freed, before the step's peak is counted
        reset_peak_memory(self.device)
        batch = self._rollout_tensors(samples)
        self._advantages(batch)
        batch.silent = self._skippable(batch)
        n, gbs = len(samples), self.global_batch_size or len(samples)
        out: dict[str, list[float]] = defaultdict(list)
        skipped = 0
        for start in range(0, n, gbs):
            idx = [i for i in range(start, min(start + gbs, n)) if i in batch.kept]
            if not idx:
                continue
            step_metrics = self._rl_step(rollout_id, batch, idx)
            skipped += int(step_metrics.pop("skipped"))
            for k, v in step_metrics.items():
                out[k].append(v)
        if batch.p0_in_loss:  # data-parallel: each rank filled its own rows
            self.dp.all_reduce_sum_(batch.old_log_probs)
        interval = self.cfg.ref_update_interval
        if self.ref_model is not None and interval and (rollout_id + 1) % interval == 0:
            self.ref_model.load_state_dict(self.model.state_dict())
        return self._rollout_metrics(batch, out, skipped, time.perf_counter() - t0)

    def train_sft(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step of negative log-likelihood on the response tokens (per-token mean)."""
        width = max(s.response_length for s in samples)
        mask = pad_right([s.loss_mask for s in samples], width).to(self.device)
        idx = list(range(len(samples)))

        def nll(mb: list[int], lp: torch.Tensor, ent: torch.Tensor):
            return -lp, {"entropy_loss": ent}

        metrics = self._policy_step(self.step, samples, self._micro_batches(samples, idx),
                                    mask, True, global_denominator([mask[idx]], True), nll)
        metrics.pop("skipped")
        self.step += 1
        return {f"train/{k}": v for k, v in metrics.items()}

    # ---- one rollout ----------------------------------------------------------------------
    def _rollout_tensors(self, samples: list[Sample]) -> RolloutTensors:
        """Masks, q, and the no-grad forwards before any step: p0 (unless taken from the engine or,
        on-policy, from the training forward), the reference's log-probs, the critic's values."""
        n, width = len(samples), max(s.response_length for s in samples)
        kept = self._fitting(samples)
        # Built on the host from the samples' lists, then one copy each to the device.
        mask = pad_right([s.loss_mask if i in kept else [] for i, s in enumerate(samples)], width).to(self.device)
        rollout_lp = pad_right([s.rollout_log_probs for s in samples], width).to(self.device)
        # On-policy (one optimizer step, nothing reads p0 before the loss): p0 is the training
        # forward's own log-probs, detached -- the numbers a separate forward would give, one forward fewer.
        p0_in_loss = (trainer_seam().p0_from_train_forward and (self.global_batch_size or n) >= n
                      and self.algo.kl_coef == 0 and not self.cfg.use_rollout_logprobs and self.teacher is None
                      and not self.cfg.lora_dropout)
        forward_all = partial(self._forward_all, samples=samples, kept=kept, width=width)
        with torch.no_grad():
            if self.cfg.use_rollout_logprobs:
                if any(len(s.rollout_log_probs) != s.response_length for s in samples):
                    raise ValueError("--use-rollout-logprobs: some samples carry no engine log-probs for every token")
                old_lp = rollout_lp
            elif p0_in_loss:
                old_lp = torch.zeros(n, width, device=self.device)  # filled by _rl_step from the training forward
            else:
                old_lp = forward_all(lambda mb: self._log_probs(self.policy, mb, width, False)[0])
            ref_lp, ref_states = None, None
            if self.ref_model is not None:
                self.ref_forwards += 1
                # LoRA: the policy's own (wrapped: FSDP2 gathers its shards) forward with the adapter off
                ref = self.policy if self.ref_model is self.model else partial(response_log_probs, self.ref_model)
                with self._reference():  # LoRA: the policy with its adapter disabled
                    if self.exact_kl:  # its hidden states too, for the exact KL in the steps
                        ref_lp, ref_states = self._reference_states(samples, kept, width)
                    else:
                        ref_lp = forward_all(lambda mb: self._log_probs(ref, mb, width, False)[0])
            values = forward_all(lambda mb: self.critic.values(mb, width)) if self.critic is not None else None
            teacher_lp = None if self.teacher is None else forward_all(  # the teacher answers on the host
                lambda mb: self.teacher.log_probs(mb, self.temperature, width, self._chunk(), self.layout).to(self.device))
        out = RolloutTensors(samples, kept, mask, rollout_lp, old_lp, p0_in_loss, ref_lp, values,
                             ref_states=ref_states, teacher_log_probs=teacher_lp)
        if self.algo.use_score_centering:
            out.sampler_head = tuple(t.to(self.device) for t in head_rollout_log_probs(samples, width))
        return out
    def _reference_states(self, samples: list[Sample], kept: set[int], width: int):
        """token_level_kl: the reference's log-probs [B, width] and the response hidden states of
        every kept sample (this rank's), from one reference forward."""
        states, out = ReferenceStates(decoder_and_head(self.ref_model)[1]), torch.zeros(len(samples), width, device=self.device)
        for mb in self._micro_batches(samples, sorted(kept)):
            out[mb] = reference_forward(self.ref_model, [samples[i] for i in mb], mb, states, self.temperature,
                                        width, self._chunk(), self.layout)
        return self.dp.all_reduce_sum_(out), states

    def _advantages(self, batch: RolloutTensors) -> None:
        """Sets ``batch.advantages`` (whitened with --normalize-advantages) and ``batch.returns``
        from the registered estimator."""
        algo, samples = self.algo, batch.samples
        rewards = torch.tensor([s.scalar_reward() for s in samples], dtype=torch.float32, device=self.device)
        rewards = estimator_rewards(samples, rewards)  # a reward post-process's rewards for the estimator, if any
        inputs = AdvantageInputs(rewards, batch.mask, self.n_samples_per_prompt,
                                 log_probs=None if batch.p0_in_loss else batch.old_log_probs,
                                 ref_log_probs=batch.ref_log_probs, values=batch.values,
                                 train_metadata={k: v.to(self.device) for k, v in
                                                 collate_train_metadata(samples, batch.width).items()})
        est = estimator_of(algo)
        advantages, batch.returns = est(inputs, algo)
        batch.rewards = slime_rewards(rewards, self.n_samples_per_prompt, algo, est.group_relative)
        if batch.teacher_log_probs is not None:  # on-policy distillation (rlvr.algo.opd)
            answered = ~batch.teacher_log_probs.isnan().any(dim=1, keepdim=True)
            advantages, batch.opd_reverse_kl = opd_advantages(
                advantages, batch.old_log_probs, batch.teacher_log_probs.nan_to_num(0.0), batch.mask * answered,
                algo.opd_kl_coef)
        batch.advantages = masked_whiten(advantages, batch.mask) if algo.normalize_advantages else advantages

    def _skippable(self, batch: RolloutTensors) -> set[int]:
        """The kept samples that add nothing to the policy's gradient (``rlvr.algo.silent_samples``:
        advantage 0 everywhere and no term that survives it): no forward or backward runs for them.
        Not with LoRA dropout, whose random masks for the other samples would then differ."""
        if not skip_silent_samples() or (self.peft is not None and self.cfg.lora_dropout):
            return set()
        silent = silent_samples(batch.advantages, batch.mask, self.algo).tolist()
        return {i for i in batch.kept if silent[i]}

    def _with_signal(self, batch: RolloutTensors, idx: list[int]) -> list[int]:
        """``idx`` without its silent samples. Data-parallel: as many as a multiple of the world
        size (silent ones put back, they add exact zeros), so every rank gets an equal share and
        so as many micro-batches, and every rank leaves the same ones out (the advantages are the
        same on every rank); with an uneven ``idx`` (overlong samples left out) nothing is left out."""
        trained = [i for i in idx if i not in batch.silent]
        world = self.dp.world_size
        if world > 1 and len(idx) % world:
            return idx
        back = set([i for i in idx if i in batch.silent][: -len(trained) % world])
        return [i for i in idx if i not in batch.silent or i in back]

    def _rl_step(self, rollout_id: int, batch: RolloutTensors, idx: list[int]) -> dict[str, float]:
        """One optimizer step of the policy on global batch ``idx`` (``actor_loss``), then one of the
        critic on the same micro-batches (on all of ``idx``: its value loss does not vanish with the
        advantage). The policy's micro-batches hold the samples with signal only; the normaliser
        is still the whole batch's."""
        per_token = self.algo.calculate_per_token_loss
        trained = self._with_signal(batch, idx)
        mbs = self._micro_batches(batch.samples, trained)
        denominator = global_denominator([batch.mask[idx]], per_token)
        batch.skipped += len(idx) - len(trained)
        if batch.p0_in_loss:
            batch.unscored |= set(idx) - set(trained)
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
            critic_mbs = mbs if len(trained) == len(idx) else self._micro_batches(batch.samples, idx)
            step_metrics |= self.critic.step(batch.samples, critic_mbs, batch.mask, per_token, denominator,
                                             batch.values, batch.returns, self._lr_scale())
        self.step += 1
        return step_metrics

    def _rollout_metrics(self, batch: RolloutTensors, out: dict[str, list[float]], skipped: int,
                         seconds: float) -> dict[str, float]:
        n, mask = len(batch.samples), batch.mask
        metrics = {f"train/{k}": sum(v) / len(v) for k, v in out.items()}
        metrics["train/skipped_steps"] = skipped
        metrics["train/overlong_samples"] = n - len(batch.kept)
        # Samples without signal that ran no forward/backward, as a fraction of those trained on.
        metrics["perf/zero_adv_skipped_frac"] = batch.skipped / max(len(batch.kept), 1)
        scored = self._scored(batch)  # p0 from the training forward: none for the samples it skipped
        if scored:
            log_ratio = batch.old_log_probs[scored] - batch.rollout_log_probs[scored]  # log p (trainer) - log q (engine)
            metrics["train/train_rollout_logprob_abs_diff"] = float(masked_mean(log_ratio.abs(), mask[scored]))
            # KL(q || p) per token, k3 estimator on q's own samples (Schulman 2020): (p/q - 1) - log(p/q) >= 0
            metrics["train/train_rollout_kl"] = float(masked_mean(torch.expm1(log_ratio) - log_ratio, mask[scored]))
        metrics["train/advantage_mean"] = float(masked_mean(batch.advantages, mask))
        metrics |= self._rollout_data_metrics(batch)
        if batch.opd_reverse_kl is not None:  # slime's name; tokens with a teacher answer
            answered = mask * ~batch.teacher_log_probs.isnan().any(dim=1, keepdim=True)
            metrics["train/opd_reverse_kl"] = float(masked_mean(batch.opd_reverse_kl, answered))
            metrics["train/opd_teacher_failures"] = int(batch.teacher_log_probs.isnan().any(dim=1).sum())
        if batch.values is not None:
            metrics["train/explained_variance"] = explained_variance(batch.values, batch.returns, mask)
        metrics["perf/train_time"] = seconds
        metrics["perf/train_tokens_per_s"] = sum(batch.samples[i].total_length for i in batch.kept) / seconds
        metrics["perf/peak_memory_gb"] = peak_memory_gb(self.device)
        trim_host_heap()  # the step's activations and log-prob chunks, for the rollout phase
        if self.routing_replay:
            metrics |= routing_replay.rollout_metrics(self.routing_replay[0], batch.samples)
        return metrics

    def _rollout_data_metrics(self, batch: RolloutTensors) -> dict[str, float]:
        """slime's per-rollout means (``rlvr.observe.rollout_data``), logged at ``rollout/step``."""
        samples = batch.samples
        host = partial(torch.tensor, device="cpu")  # per-sample values from the samples (reduced on their own)
        per_sample = {"rewards": batch.rewards,
                      "response_lengths": host([float(s.response_length) for s in samples]),
                      "total_lengths": host([float(s.total_length) for s in samples]),
                      "truncated": host([float(s.status == Status.TRUNCATED) for s in samples])}
        for key in (samples[0].train_metadata if samples else {}):
            if all(isinstance(s.train_metadata.get(key), (int, float)) for s in samples):
                per_sample[key] = host([float(s.train_metadata[key]) for s in samples])
        per_token = {"log_probs": batch.old_log_probs, "ref_log_probs": batch.ref_log_probs,
                     "rollout_log_probs": batch.rollout_log_probs, "advantages": batch.advantages,
                     "returns": batch.returns, "values": batch.values}
        if batch.unscored:  # p0 from the training forward: the mean over the samples that had one, if any
            per_token["log_probs"] = None
        out = rollout_data_metrics(batch.mask, per_token, per_sample)
        scored = self._scored(batch)
        if batch.unscored and scored:
            out |= rollout_data_metrics(batch.mask[scored], {"log_probs": batch.old_log_probs[scored]}, {})
        return out

    @staticmethod
    def _scored(batch: RolloutTensors) -> list[int]:
        """The rows whose p0 is known: all but the samples the training forward skipped (p0_in_loss)."""
        return [i for i in range(len(batch.samples)) if i not in batch.unscored]

    # ---- internals -------------------------------------------------------------------------
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
            with lora.dropout_in_training(self.model) if self.cfg.lora_dropout else contextlib.nullcontext():
                out = self._log_probs(self.policy, [samples[i] for i in mb], width, True, heads=heads,
                                      kl_ref=kl_ref(mb) if kl_ref is not None else None)
            loss_tok, tok_metrics = token_loss(mb, *(t.float() for t in out))
            return hook_loss(rollout_id, aggregate_loss(loss_tok, mask[mb], per_token, denominator)), tok_metrics

        totals = accumulate(self.learner, mbs, loss_fn, mask, per_token, denominator)
        totals = {k: v if k in ("loss", "pg_loss") else v * metric_scale for k, v in totals.items()}
        reason = optimizer_step(self.learner, totals, self._lr_scale(), self.cfg.clip_grad)
        self.guard.record(rollout_id, self.step, reason)
        totals["skipped"] = float(reason is not None)
        return totals

    def _reference(self):
        """Context of the reference forwards: LoRA's disabled adapter when the policy is its own reference."""
        return lora.reference(self.peft) if self.ref_model is self.model else contextlib.nullcontext()

    def _lr_scale(self) -> float:
        c = self.cfg
        return lr_at(self.step, self.total_steps, c.lr, c.min_lr, c.lr_decay_style, c.lr_warmup_iters) / c.lr

    def _chunk(self) -> int:
        """Rows per output-layer chunk: --log-probs-chunk-size, or by the vocabulary for -1."""
        if self.cfg.log_probs_chunk_size > 0:
            return self.cfg.log_probs_chunk_size
        return auto_chunk_size(self.model.get_output_embeddings().weight.shape[0])

    def _log_probs(self, forward, mb: list[Sample], width: int, with_entropy: bool, **kwargs):
        """``forward`` is ``self.policy`` or ``response_log_probs`` bound to a model (same arguments)."""
        return forward(mb, self.temperature, width, with_entropy, self._chunk(), self.layout.packed,
                       self.layout.share_prompts, **kwargs)

    def _fitting(self, samples: list[Sample]) -> set[int]:
        """Indices of the samples that fit one micro-batch; the others are logged and left out."""
        cap = self.cfg.max_tokens_per_gpu if self.cfg.use_dynamic_batch_size else None
        kept = {i for i, s in enumerate(samples) if cap is None or s.total_length <= cap}
        if len(kept) < len(samples):
            longest = max(s.total_length for s in samples)
            log.warning("%d of %d samples are longer than --max-tokens-per-gpu %d (longest %d tokens) and are "
                        "left out of training; raise the cap or lower --rollout-max-response-len",
                        len(samples) - len(kept), len(samples), cap, longest)
        return kept

    def _micro_batches(self, samples: list[Sample], idx: list[int]) -> list[list[int]]:
        """Micro-batches of ``idx`` (data-parallel: of this rank's share, as many on every rank)."""
        idx = self.dp.share(idx, [samples[i].total_length for i in idx])
        lengths = [samples[i].total_length for i in idx]
        cap = self.cfg.max_tokens_per_gpu
        if self.cfg.use_dynamic_batch_size:
            count = len(first_fit_decreasing(lengths, cap)) if lengths else 0
            bins = micro_batches(lengths, cap, self.dp.agree_count(count))
        else:
            bins = fixed_size(len(idx), self.cfg.micro_batch_size)
        if self.dp.agree_count(len(bins)) != len(bins):
            raise ValueError(f"rank {self.dp.rank}: {len(idx)} samples make {len(bins)} micro-batches, fewer than "
                             "another rank's; data-parallel ranks must run as many (raise the batch size)")
        return [[idx[j] for j in b] for b in bins]

    def _forward_all(self, forward, samples: list[Sample], kept: set[int], width: int) -> torch.Tensor:
        """``forward(micro-batch samples) -> [b, width]`` run over the kept samples, micro-batched
        (rows of the others stay 0)."""
        out = torch.zeros(len(samples), width, device=self.device)
        for mb in self._micro_batches(samples, sorted(kept)):
            out[mb] = forward([samples[i] for i in mb]).float()
        return self.dp.all_reduce_sum_(out)

    # ---- checkpoints -----------------------------------------------------------------------
    def save_hf(self, tokenizer, directory: str | Path) -> Path:
        """The policy as a plain HF checkpoint (``--save-hf``; rlvr.runtime.roles.TrainerRole)."""
        return save_hf(self.model, tokenizer, directory)

    def check_bad_steps(self, skipped_path: Callable[[int], str]) -> None:
        """``TrainingStopped`` after ``--max-consecutive-skipped-steps`` skipped in a row (``BadStepGuard``)."""
        self.guard.raise_if_exhausted(skipped_path)

    def save(self, directory: str | Path, tokenizer=None, extra: dict | None = None) -> Path:
        """Write the policy as a plain HF checkpoint plus ``trainer_state.pt`` (optimizer, step) and,
        with PPO, ``critic/``. Written under a temporary name and renamed, so a crash mid-save never
        leaves a half-written checkpoint under the final name."""
        directory = Path(directory)
        # Data-parallel: whole tensors (a collective under FSDP2), written by rank 0 alone; with
        # LoRA the adapters only.
        adapter = lora.adapter_weights(self.model) if self.peft is not None else None
        model_state = self.dp.full_state_dict(self.policy, self.model) if self.peft is None else None
        optimizer_state = self.dp.optimizer_state(self.policy, self.optimizer)
        if self.dp.rank != 0:
            return directory
        tmp = directory.with_name(directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if self.peft is not None:  # LoRA: the adapter alone, as PEFT writes it
            lora.save_adapter(self.peft, tmp, adapter)
        else:
            self.model.save_pretrained(tmp, state_dict=model_state)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        state = {"optimizer": optimizer_state, "step": self.step, "extra": extra or {},
                 "guard_streak": list(self.guard.streak)}
        # What an exact resume needs beyond the HF weights: --bf16's float32 masters, and a
        # reference model that --ref-update-interval has moved away from its starting weights.
        if self.master is not self.params:
            state["master"] = [m.detach() for m in self.master]
        if self.ref_model is not None and self.cfg.ref_update_interval:
            state["ref_model"] = self.ref_model.state_dict()
        if self.critic is not None:
            state["critic_optimizer"] = self.critic.save(tmp / "critic")
        torch.save(state, tmp / "trainer_state.pt")
        shutil.rmtree(directory, ignore_errors=True)
        tmp.rename(directory)
        return directory

    def load(self, directory: str | Path) -> dict:
        """Restore what ``save`` wrote (policy weights and masters, optimizer(s), step, a moved
        reference model, the bad-step streak); returns its ``extra``."""
        directory = Path(directory)
        state = torch.load(directory / "trainer_state.pt", weights_only=True)
        if self.peft is not None:  # LoRA: the adapter and its optimizer state (the base is the checkpoint's)
            self.dp.load(self.policy, self.model, self.optimizer, lora.read_adapter(self.model, directory),
                         state["optimizer"], strict=False)
        else:
            saved = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
            # Data-parallel: every rank reads the whole checkpoint; FSDP2 keeps its shards.
            self.dp.load(self.policy, self.model, self.optimizer, saved.state_dict(), state["optimizer"])
        self.step = state["step"]
        self.guard.streak[:] = [tuple(x) for x in state.get("guard_streak", [])]
        if "master" in state:
            with torch.no_grad():
                for m, saved_m in zip(self.master, state["master"], strict=True):
                    m.copy_(saved_m)
        if "ref_model" in state:
            self.ref_model.load_state_dict(state["ref_model"])
        if self.critic is not None:
            self.critic.load(directory / "critic", state["critic_optimizer"])
        return state["extra"]


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked tokens (1 = perfect critic)."""
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    residual = returns - values
    var_residual = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    return float(1.0 - var_residual / var_returns.clamp(min=1e-8))
