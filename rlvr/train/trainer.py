"""The trainer: turns a ``RolloutBatch`` into optimizer steps (DESIGN "Layers": ``train``).

Per rollout (seed 000 §2.6): recompute the old policy's log-probs p0 (or take the engine's with
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
lengths can be known in advance, config validation and ``rlvr.build`` reject the setting instead.

A non-finite loss or gradient norm skips the optimizer step (``guard.py``). With ``--bf16`` the
model runs in bfloat16 and AdamW updates float32 master copies of the weights.

The trainer is algorithm-blind beyond the functions it looks up in ``rlvr.algo``'s registries.
Dropout stays off (``model.eval()``) in training too, as in slime, so p0 is exactly the policy
before the update.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import shutil
import time
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM
from transformers.modeling_layers import GradientCheckpointingLayer

from rlvr.algo import (
    POLICY_LOSSES,
    AdvantageInputs,
    AlgoConfig,
    aggregate_loss,
    apply_corrections,
    compute_approx_kl,
    compute_value_loss,
    estimator_of,
    global_denominator,
    masked_mean,
    masked_whiten,
    policy_loss_name,
)
from rlvr.config import TrainConfig
from rlvr.train.batching import first_fit_decreasing, fixed_size, micro_batches, pad_right
from rlvr.train.critic import Critic
from rlvr.train.guard import BadStepGuard, bad_step_reason
from rlvr.train.memory import peak_memory_gb, reset_peak_memory
from rlvr.train.packing import ATTN_IMPLEMENTATION, response_log_probs
from rlvr.train.parallel import DataParallel
from rlvr.train.schedule import lr_at
from rlvr.types import Sample

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
            out[key] = torch.tensor([float(v) for v in values], dtype=torch.float32)
    return out


def load_policy(path: str, bf16: bool) -> torch.nn.Module:
    """A causal LM in eval mode (no dropout) whose attention understands packed micro-batches."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION).eval()


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


class Trainer:
    def __init__(
        self,
        train: TrainConfig,
        algo: AlgoConfig,
        temperature: float = 1.0,
        global_batch_size: int | None = None,
        n_samples_per_prompt: int = 1,
        total_steps: int = 1,
        parallel: DataParallel | None = None,
    ):
        self.cfg, self.algo = train, algo
        self.total_steps = total_steps  # optimizer steps in the run, for the LR schedule
        self.temperature = temperature
        self.global_batch_size = global_batch_size
        self.n_samples_per_prompt = n_samples_per_prompt
        self.packed = True  # False lays micro-batches out right-padded (benchmarks compare the two)
        self.share_prompts = True  # packed: a prompt shared by several samples is computed once
        self.p0_from_train_forward = True  # False: always a separate p0 forward (tests compare the two)
        torch.manual_seed(train.seed)
        self.model = load_policy(train.hf_checkpoint, train.bf16)
        # The reference model exists only when a KL term reads it; frozen, never trained.
        needs_ref = algo.use_kl_loss or algo.kl_coef != 0
        self.ref_model = None
        if needs_ref:
            ref = load_policy(train.ref_load, train.bf16) if train.ref_load else copy.deepcopy(self.model)
            self.ref_model = ref.requires_grad_(False)
        if train.recompute_activations:
            enable_recompute(self.model)
        # Data-parallel rank (under --ray): policy forwards go through the DDP/FSDP2-wrapped module.
        self.dp = parallel
        self.policy = parallel.wrap(self.model) if parallel is not None else None
        # Master weights: the parameters themselves in float32; float32 copies under --bf16.
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.master = self.params if not train.bf16 else [
            p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.optimizer = self._adamw(self.master, train.lr)
        # PPO's critic (GAE needs values); every other estimator is critic-free.
        self.critic = Critic(train.critic_load or train.hf_checkpoint) if estimator_of(algo).needs_critic else None
        self.critic_optimizer = (
            self._adamw(self.critic.parameters(), train.critic_lr or train.lr) if self.critic is not None else None
        )
        self.guard = BadStepGuard(train.max_consecutive_skipped_steps)
        self.loss_hook: Callable[[int, torch.Tensor], torch.Tensor] | None = None  # test hook: (rollout, loss) -> loss
        self.ref_forwards = 0  # reference-model forward passes run (0 when no KL term)
        self.step = 0  # optimizer steps attempted (train/step), skipped ones included, as Megatron's iteration

    def _adamw(self, params, lr: float) -> torch.optim.Optimizer:
        c = self.cfg
        params = list(params)
        # The fused kernel (one pass over all tensors) where it is available: CPU and CUDA.
        fused = all(p.device.type in ("cpu", "cuda") and p.dtype == torch.float32 for p in params)
        opt = torch.optim.AdamW(params, lr=lr, betas=(c.adam_beta1, c.adam_beta2), weight_decay=c.weight_decay,
                                fused=fused or None)
        for group in opt.param_groups:
            group["initial_lr"] = lr  # the schedule scales this (critic and actor alike)
        return opt

    # ---- what the loop calls --------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's parameters by HF name (data-parallel: whole tensors; FSDP2 gathers them on
        rank 0, every rank must call)."""
        if self.dp is not None:
            return self.dp.full_weights(self.policy, self.model)
        return {n: p.detach() for n, p in self.model.named_parameters()}

    def train(self, rollout_id: int, samples: list[Sample]) -> dict[str, float]:
        """One rollout's optimizer steps. Returns ``train/*`` and ``perf/*`` metrics."""
        t0 = time.perf_counter()
        reset_peak_memory()
        algo, n, per_token = self.algo, len(samples), self.algo.calculate_per_token_loss
        width = max(s.response_length for s in samples)
        kept = self._fitting(samples)
        mask = pad_right([s.loss_mask if i in kept else [] for i, s in enumerate(samples)], width)
        rollout_lp = pad_right([s.rollout_log_probs for s in samples], width)
        gbs = self.global_batch_size or n
        # On-policy (one optimizer step, nothing reads p0 before the loss): p0 is the training
        # forward's own log-probs, detached -- the numbers a separate forward would give, one forward fewer.
        p0_in_loss = self.p0_from_train_forward and gbs >= n and algo.kl_coef == 0 and not self.cfg.use_rollout_logprobs
        with torch.no_grad():
            if self.cfg.use_rollout_logprobs:
                if any(len(s.rollout_log_probs) != s.response_length for s in samples):
                    raise ValueError("--use-rollout-logprobs: some samples carry no engine log-probs for every token")
                old_lp = rollout_lp
            elif p0_in_loss:
                old_lp = torch.zeros(n, width)  # filled by actor_loss from the training forward
            else:
                old_lp = self._forward_all(lambda mb: self._log_probs(self.model, mb, width, False)[0], samples, kept, width)
            ref_lp = None
            if self.ref_model is not None:
                self.ref_forwards += 1
                ref_lp = self._forward_all(lambda mb: self._log_probs(self.ref_model, mb, width, False)[0],
                                           samples, kept, width)
            old_values = self._forward_all(lambda mb: self.critic(mb, width), samples, kept, width) if self.critic else None
        rewards = torch.tensor([s.scalar_reward() for s in samples], dtype=torch.float32)
        inputs = AdvantageInputs(rewards, mask, self.n_samples_per_prompt, log_probs=None if p0_in_loss else old_lp,
                                 ref_log_probs=ref_lp, values=old_values, train_metadata=collate_train_metadata(samples, width))
        advantages, returns = estimator_of(algo)(inputs, algo)
        if algo.normalize_advantages:
            advantages = masked_whiten(advantages, mask)
        pg_loss_fn = POLICY_LOSSES[policy_loss_name(algo)]
        correct = algo.use_tis or algo.use_opsm

        def actor_loss(idx: list[int], lp: torch.Tensor, ent: torch.Tensor):
            m = mask[idx]
            if p0_in_loss:
                old_lp[idx] = lp.detach()
            pg_loss, metrics = pg_loss_fn(lp, old_lp[idx], advantages[idx], m, algo)
            if correct:  # train-inference corrections (seed 002): p0 / q weights, OPSM
                pg_loss, extra = apply_corrections(pg_loss, lp, old_lp[idx], rollout_lp[idx], advantages[idx], m, algo)
                metrics |= extra
            loss = pg_loss - algo.entropy_coef * ent if algo.entropy_coef else pg_loss
            metrics = {"pg_loss": pg_loss, "entropy_loss": ent, **metrics}
            if ref_lp is not None:
                # DeepSeek-V3.2's unbiased KL weights the estimate by p_theta / p0.
                ratio = torch.exp(lp - old_lp[idx]) if algo.use_unbiased_kl else None
                kl = compute_approx_kl(lp, ref_lp[idx], algo.kl_loss_type, importance_ratio=ratio)
                if algo.use_kl_loss:
                    loss = loss + algo.kl_loss_coef * kl
                metrics["kl_loss"] = kl
            return loss, metrics

        def critic_loss(idx: list[int], values: torch.Tensor):
            loss, clipfrac = compute_value_loss(values, old_values[idx], returns[idx], algo.value_clip)
            return 0.5 * loss, {"value_loss": 0.5 * loss, "value_clipfrac": clipfrac}

        actor_forward = lambda mb: self._log_probs(self.model, mb, width, True)  # noqa: E731
        out: dict[str, list[float]] = defaultdict(list)
        skipped = 0
        for start in range(0, n, gbs):
            idx = [i for i in range(start, min(start + gbs, n)) if i in kept]
            if not idx:
                continue
            step_metrics = self._accumulate(rollout_id, samples, idx, mask, per_token, actor_forward, actor_loss,
                                            self.model, self.optimizer)
            skipped += int(step_metrics.pop("skipped"))
            if self.critic is not None:
                critic_metrics = self._accumulate(rollout_id, samples, idx, mask, per_token,
                                                  lambda mb: (self.critic(mb, width),),
                                                  critic_loss, self.critic, self.critic_optimizer)
                critic_metrics.pop("skipped")
                step_metrics |= {k: v for k, v in critic_metrics.items() if k.startswith("value")}
                step_metrics["critic_grad_norm"] = critic_metrics["grad_norm"]
            self.step += 1
            for k, v in step_metrics.items():
                out[k].append(v)
        interval = self.cfg.ref_update_interval
        if p0_in_loss and self.dp is not None:  # each rank filled its own rows
            self.dp.all_reduce_sum_(old_lp)
        if self.ref_model is not None and interval and (rollout_id + 1) % interval == 0:
            self.ref_model.load_state_dict(self.model.state_dict())
        metrics = {f"train/{k}": sum(v) / len(v) for k, v in out.items()}
        metrics["train/skipped_steps"] = skipped
        metrics["train/overlong_samples"] = n - len(kept)
        metrics["train/train_rollout_logprob_abs_diff"] = float(masked_mean((old_lp - rollout_lp).abs(), mask))
        metrics["train/advantage_mean"] = float(masked_mean(advantages, mask))
        if old_values is not None:
            metrics["train/explained_variance"] = explained_variance(old_values, returns, mask)
        metrics["perf/train_time"] = time.perf_counter() - t0
        metrics["perf/train_tokens_per_s"] = sum(samples[i].total_length for i in kept) / metrics["perf/train_time"]
        metrics["perf/peak_memory_gb"] = peak_memory_gb()
        return metrics

    def train_sft(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step of negative log-likelihood on the response tokens (per-token mean)."""
        width = max(s.response_length for s in samples)
        mask = pad_right([s.loss_mask for s in samples], width)

        def nll(idx: list[int], lp: torch.Tensor, ent: torch.Tensor):
            return -lp, {"entropy_loss": ent}

        metrics = self._accumulate(self.step, samples, list(range(len(samples))), mask, True,
                                   lambda mb: self._log_probs(self.model, mb, width, True), nll,
                                   self.model, self.optimizer)
        metrics.pop("skipped")
        self.step += 1
        return {f"train/{k}": v for k, v in metrics.items()}

    # ---- internals -------------------------------------------------------------------------
    def _log_probs(self, model, mb: list[Sample], width: int, with_entropy: bool):
        chunk = self.cfg.log_probs_chunk_size if self.cfg.log_probs_chunk_size > 0 else 1 << 62
        if model is self.model and self.policy is not None:
            return self.policy(mb, self.temperature, width, with_entropy, chunk, self.packed, self.share_prompts)
        return response_log_probs(model, mb, self.temperature, width, with_entropy, chunk, packed=self.packed,
                                  share_prompts=self.share_prompts)

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
        if self.dp is not None:
            idx = self.dp.share(idx, [samples[i].total_length for i in idx])
        lengths = [samples[i].total_length for i in idx]
        cap = self.cfg.max_tokens_per_gpu
        if self.cfg.use_dynamic_batch_size:
            count = len(first_fit_decreasing(lengths, cap)) if lengths else 0
            bins = micro_batches(lengths, cap, self.dp.agree_count(count) if self.dp is not None else 1)
        else:
            bins = fixed_size(len(idx), self.cfg.micro_batch_size)
        if self.dp is not None and self.dp.agree_count(len(bins)) != len(bins):
            raise ValueError(f"rank {self.dp.rank}: {len(idx)} samples make {len(bins)} micro-batches, fewer than "
                             "another rank's; data-parallel ranks must run as many (raise the batch size)")
        return [[idx[j] for j in b] for b in bins]

    def _forward_all(self, forward, samples: list[Sample], kept: set[int], width: int) -> torch.Tensor:
        """``forward(micro-batch samples) -> [b, width]`` run over the kept samples, micro-batched
        (rows of the others stay 0)."""
        out = torch.zeros(len(samples), width)
        for mb in self._micro_batches(samples, sorted(kept)):
            out[mb] = forward([samples[i] for i in mb]).float()
        return self.dp.all_reduce_sum_(out) if self.dp is not None else out

    def _accumulate(self, rollout_id: int, samples: list[Sample], idx: list[int], mask: torch.Tensor,
                    per_token: bool, forward, loss_fn, module: torch.nn.Module,
                    optimizer: torch.optim.Optimizer) -> dict[str, float]:
        """Accumulate gradients over the micro-batches of global batch ``idx``; one optimizer step,
        skipped when the loss or the gradient norm is not finite.

        ``forward(mb_samples) -> tuple of [b, T] tensors``; ``loss_fn(mb_idx, *tensors) -> (per-token
        loss, per-token metrics)``. Every micro-batch is normalised by the global batch's
        denominator, so the summed gradient equals the one-batch gradient.
        """
        denominator = global_denominator([mask[idx]], per_token)
        totals: dict[str, float] = defaultdict(float)
        optimizer.zero_grad(set_to_none=True)
        module.zero_grad(set_to_none=True)
        dp = self.dp if module is self.model else None
        mbs = self._micro_batches(samples, idx)
        for k, mb in enumerate(mbs):
            with dp.no_sync(self.policy, last=k == len(mbs) - 1) if dp is not None else contextlib.nullcontext():
                loss_tok, tok_metrics = loss_fn(mb, *[t.float() for t in forward([samples[i] for i in mb])])
                loss = aggregate_loss(loss_tok, mask[mb], per_token, denominator)
                if self.loss_hook is not None and module is self.model:
                    loss = self.loss_hook(rollout_id, loss)
                # Data-parallel: DDP/FSDP2 average the ranks' gradients; the loss is already global.
                (loss * dp.loss_scale if dp is not None else loss).backward()
            totals["loss"] += float(loss.detach())
            for k, v in tok_metrics.items():
                totals[k] += float(aggregate_loss(v.detach(), mask[mb], per_token, denominator))
        if dp is not None:  # every rank holds its share of the global batch's sums
            totals = defaultdict(float, dp.sum_metrics(dict(totals)))
        params = list(optimizer.param_groups[0]["params"])
        if module is self.model and self.master is not self.params:  # --bf16: float32 grads on the masters
            for m, p in zip(self.master, self.params):
                m.grad = p.grad.float() if p.grad is not None else None
        grads = [p.grad for p in params if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads)  # FSDP2: a replicated DTensor (clipping takes it)
        totals["grad_norm"] = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        c = self.cfg
        scale = lr_at(self.step, self.total_steps, c.lr, c.min_lr, c.lr_decay_style, c.lr_warmup_iters) / c.lr
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * scale
        totals["lr"] = optimizer.param_groups[0]["lr"]
        reason = bad_step_reason(totals["loss"], totals["grad_norm"])
        if module is self.model:
            self.guard.record(rollout_id, self.step, reason)
        totals["skipped"] = float(reason is not None)
        if reason is not None:  # weights and optimizer state stay as they are
            optimizer.zero_grad(set_to_none=True)
            module.zero_grad(set_to_none=True)
            return dict(totals)
        if c.clip_grad > 0:
            torch.nn.utils.clip_grads_with_norm_(params, c.clip_grad, grad_norm)
        optimizer.step()
        if module is self.model and self.master is not self.params:
            with torch.no_grad():
                for m, p in zip(self.master, self.params):
                    p.copy_(m)
        return dict(totals)

    # ---- checkpoints -----------------------------------------------------------------------
    def save(self, directory: str | Path, tokenizer=None, extra: dict | None = None) -> Path:
        """Write the policy as a plain HF checkpoint plus ``trainer_state.pt`` (optimizer, step) and,
        with PPO, ``critic/``. Written under a temporary name and renamed, so a crash mid-save never
        leaves a half-written checkpoint under the final name."""
        directory = Path(directory)
        # Data-parallel: whole tensors (a collective under FSDP2), written by rank 0 alone.
        model_state = self.dp.full_state_dict(self.policy, self.model) if self.dp is not None else None
        optimizer_state = (self.dp.optimizer_state(self.policy, self.optimizer) if self.dp is not None
                           else self.optimizer.state_dict())
        if self.dp is not None and self.dp.rank != 0:
            return directory
        tmp = directory.with_name(directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
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
            self.critic.save(tmp / "critic")
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
        torch.save(state, tmp / "trainer_state.pt")
        shutil.rmtree(directory, ignore_errors=True)
        tmp.rename(directory)
        return directory

    def load(self, directory: str | Path) -> dict:
        """Restore what ``save`` wrote (policy weights and masters, optimizer(s), step, a moved
        reference model, the bad-step streak); returns its ``extra``."""
        directory = Path(directory)
        saved = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        state = torch.load(directory / "trainer_state.pt", weights_only=True)
        if self.dp is not None:  # every rank reads the whole checkpoint; FSDP2 keeps its shards
            self.dp.load(self.policy, self.model, self.optimizer, saved.state_dict(), state["optimizer"])
        else:
            self.model.load_state_dict(saved.state_dict())
            self.optimizer.load_state_dict(state["optimizer"])
        self.step = state["step"]
        self.guard.streak[:] = [tuple(x) for x in state.get("guard_streak", [])]
        if "master" in state:
            with torch.no_grad():
                for m, saved_m in zip(self.master, state["master"], strict=True):
                    m.copy_(saved_m)
        if "ref_model" in state:
            self.ref_model.load_state_dict(state["ref_model"])
        if self.critic is not None:
            saved_critic = Critic(directory / "critic", head_path=directory / "critic" / "value_head.pt")
            self.critic.load_state_dict(saved_critic.state_dict())
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        return state["extra"]


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked tokens (1 = perfect critic)."""
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    residual = returns - values
    var_residual = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    return float(1.0 - var_residual / var_returns.clamp(min=1e-8))
