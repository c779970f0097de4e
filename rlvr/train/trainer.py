"""The trainer: turns a ``RolloutBatch`` into optimizer steps (DESIGN "Layers": ``train``).

Per rollout (seed 000 §2.6): recompute the old policy's log-probs p0 and the reference model's
log-probs, compute advantages with the registered estimator, then for each global batch of
``global_batch_size`` samples run micro-batches forward/backward and one optimizer step. The
loss of every micro-batch is normalised by the *global* batch's denominator (samples, or tokens
with ``--calculate-per-token-loss``), so the accumulated gradient does not depend on how the
batch is split.

The trainer is algorithm-blind beyond the functions it looks up in ``rlvr.algo``'s registries.
Dropout stays off (``model.eval()``) in training too, as in slime, so p0 is exactly the policy
before the update.

Simplification of this first version (the trainer issue replaces it): micro-batches are
right-padded, not packed; the token cap counts real tokens, as slime's does for packed data.
"""

from __future__ import annotations

import copy
import shutil
import time
from collections import defaultdict
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM

from rlvr.algo import (
    ADVANTAGES,
    POLICY_LOSSES,
    AdvantageInputs,
    AlgoConfig,
    aggregate_loss,
    apply_corrections,
    compute_approx_kl,
    compute_value_loss,
    global_denominator,
    masked_mean,
    masked_whiten,
    policy_loss_name,
)
from rlvr.config import TrainConfig
from rlvr.train.batching import first_fit, fixed_size, pad_right, token_batch
from rlvr.train.critic import Critic
from rlvr.train.schedule import lr_at
from rlvr.types import Sample

def response_log_probs(
    model: torch.nn.Module, samples: list[Sample], temperature: float, width: int, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[b, width]`` of each sample's response tokens under ``model`` at ``temperature``
    (right-padded with 0), and optionally the entropy of each position's distribution."""
    seq, attn = token_batch(samples)
    logits = model(input_ids=seq, attention_mask=attn).logits
    logp = torch.zeros(len(samples), width)
    ent = torch.zeros(len(samples), width) if with_entropy else None
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), s.response_length
        # Token t is predicted by the logits at position t - 1.
        row = (logits[i, p - 1 : p + r - 1].float() / temperature).log_softmax(-1)
        logp[i, :r] = row.gather(-1, seq[i, p : p + r].unsqueeze(-1)).squeeze(-1)
        if ent is not None:
            ent[i, :r] = -(row.exp() * row).sum(-1)
    return logp, ent


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


class Trainer:
    def __init__(
        self,
        train: TrainConfig,
        algo: AlgoConfig,
        temperature: float = 1.0,
        global_batch_size: int | None = None,
        n_samples_per_prompt: int = 1,
        total_steps: int = 1,
    ):
        self.cfg, self.algo = train, algo
        self.total_steps = total_steps  # optimizer steps in the run, for the LR schedule
        self.temperature = temperature
        self.global_batch_size = global_batch_size
        self.n_samples_per_prompt = n_samples_per_prompt
        torch.manual_seed(train.seed)
        self.model = AutoModelForCausalLM.from_pretrained(train.hf_checkpoint, dtype=torch.float32).eval()
        needs_ref = algo.use_kl_loss or algo.kl_coef != 0
        self.ref_model = copy.deepcopy(self.model).requires_grad_(False) if needs_ref else None
        self.optimizer = self._adamw(self.model.parameters(), train.lr)
        # PPO's critic (GAE needs values); every other estimator is critic-free.
        self.critic = Critic(train.critic_load or train.hf_checkpoint) if algo.advantage_estimator == "ppo" else None
        self.critic_optimizer = (
            self._adamw(self.critic.parameters(), train.critic_lr or train.lr) if self.critic is not None else None
        )
        self.step = 0  # optimizer steps taken (train/step)

    def _adamw(self, params, lr: float) -> torch.optim.Optimizer:
        c = self.cfg
        opt = torch.optim.AdamW(params, lr=lr, betas=(c.adam_beta1, c.adam_beta2), weight_decay=c.weight_decay)
        for group in opt.param_groups:
            group["initial_lr"] = lr  # the schedule scales this (critic and actor alike)
        return opt

    # ---- what the loop calls --------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in self.model.named_parameters()}

    def train(self, rollout_id: int, samples: list[Sample]) -> dict[str, float]:
        """One rollout's optimizer steps. Returns ``train/*`` and ``perf/*`` metrics."""
        t0 = time.perf_counter()
        algo, n, per_token = self.algo, len(samples), self.algo.calculate_per_token_loss
        width = max(s.response_length for s in samples)
        mask = pad_right([s.loss_mask for s in samples], width)
        rollout_lp = pad_right([s.rollout_log_probs for s in samples], width)
        with torch.no_grad():
            old_lp = self._forward_all(lambda mb: self._log_probs(self.model, mb, width, False)[0], samples, width)
            ref_lp = None
            if self.ref_model is not None:
                ref_lp = self._forward_all(lambda mb: self._log_probs(self.ref_model, mb, width, False)[0], samples, width)
            old_values = self._forward_all(lambda mb: self.critic(mb, width), samples, width) if self.critic else None
        rewards = torch.tensor([s.scalar_reward() for s in samples], dtype=torch.float32)
        inputs = AdvantageInputs(rewards, mask, self.n_samples_per_prompt, log_probs=old_lp, ref_log_probs=ref_lp,
                                 values=old_values, train_metadata=collate_train_metadata(samples, width))
        advantages, returns = ADVANTAGES[algo.advantage_estimator](inputs, algo)
        if algo.normalize_advantages:
            advantages = masked_whiten(advantages, mask)
        pg_loss_fn = POLICY_LOSSES[policy_loss_name(algo)]
        correct = algo.use_tis or algo.use_opsm

        def actor_loss(idx: list[int], lp: torch.Tensor, ent: torch.Tensor):
            m = mask[idx]
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
        gbs = self.global_batch_size or n
        out: dict[str, list[float]] = defaultdict(list)
        for start in range(0, n, gbs):
            idx = list(range(start, min(start + gbs, n)))
            step_metrics = self._accumulate(samples, idx, mask, per_token, actor_forward, actor_loss,
                                            self.model, self.optimizer)
            if self.critic is not None:
                critic_metrics = self._accumulate(samples, idx, mask, per_token, lambda mb: (self.critic(mb, width),),
                                                  critic_loss, self.critic, self.critic_optimizer)
                step_metrics |= {k: v for k, v in critic_metrics.items() if k.startswith("value")}
                step_metrics["critic_grad_norm"] = critic_metrics["grad_norm"]
            self.step += 1
            for k, v in step_metrics.items():
                out[k].append(v)
        metrics = {f"train/{k}": sum(v) / len(v) for k, v in out.items()}
        metrics["train/train_rollout_logprob_abs_diff"] = float(masked_mean((old_lp - rollout_lp).abs(), mask))
        metrics["train/advantage_mean"] = float(masked_mean(advantages, mask))
        if old_values is not None:
            metrics["train/explained_variance"] = explained_variance(old_values, returns, mask)
        metrics["perf/train_time"] = time.perf_counter() - t0
        metrics["perf/train_tokens_per_s"] = sum(s.total_length for s in samples) / metrics["perf/train_time"]
        return metrics

    def train_sft(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step of negative log-likelihood on the response tokens (per-token mean)."""
        width = max(s.response_length for s in samples)
        mask = pad_right([s.loss_mask for s in samples], width)

        def nll(idx: list[int], lp: torch.Tensor, ent: torch.Tensor):
            return -lp, {"entropy_loss": ent}

        metrics = self._accumulate(samples, list(range(len(samples))), mask, True,
                                   lambda mb: self._log_probs(self.model, mb, width, True), nll,
                                   self.model, self.optimizer)
        self.step += 1
        return {f"train/{k}": v for k, v in metrics.items()}

    # ---- internals -------------------------------------------------------------------------
    def _log_probs(self, model, mb: list[Sample], width: int, with_entropy: bool):
        return response_log_probs(model, mb, self.temperature, width, with_entropy)

    def _micro_batches(self, samples: list[Sample], idx: list[int]) -> list[list[int]]:
        if self.cfg.use_dynamic_batch_size:
            bins = first_fit([samples[i].total_length for i in idx], self.cfg.max_tokens_per_gpu)
        else:
            bins = fixed_size(len(idx), self.cfg.micro_batch_size)
        return [[idx[j] for j in b] for b in bins]

    def _forward_all(self, forward, samples: list[Sample], width: int) -> torch.Tensor:
        """``forward(micro-batch samples) -> [b, width]`` run over all samples, micro-batched."""
        out = torch.zeros(len(samples), width)
        for mb in self._micro_batches(samples, list(range(len(samples)))):
            out[mb] = forward([samples[i] for i in mb])
        return out

    def _accumulate(self, samples: list[Sample], idx: list[int], mask: torch.Tensor, per_token: bool,
                    forward, loss_fn, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, float]:
        """Accumulate gradients over the micro-batches of global batch ``idx``; one optimizer step.

        ``forward(mb_samples) -> tuple of [b, T] tensors``; ``loss_fn(mb_idx, *tensors) -> (per-token
        loss, per-token metrics)``. Every micro-batch is normalised by the global batch's
        denominator, so the summed gradient equals the one-batch gradient.
        """
        denominator = global_denominator([mask[idx]], per_token)
        totals: dict[str, float] = defaultdict(float)
        optimizer.zero_grad(set_to_none=True)
        for mb in self._micro_batches(samples, idx):
            loss_tok, tok_metrics = loss_fn(mb, *forward([samples[i] for i in mb]))
            loss = aggregate_loss(loss_tok, mask[mb], per_token, denominator)
            loss.backward()
            totals["loss"] += float(loss.detach())
            for k, v in tok_metrics.items():
                totals[k] += float(aggregate_loss(v.detach(), mask[mb], per_token, denominator))
        clip = self.cfg.clip_grad if self.cfg.clip_grad > 0 else float("inf")
        totals["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(module.parameters(), clip))
        c = self.cfg
        scale = lr_at(self.step, self.total_steps, c.lr, c.min_lr, c.lr_decay_style, c.lr_warmup_iters) / c.lr
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * scale
        optimizer.step()
        totals["lr"] = optimizer.param_groups[0]["lr"]
        return dict(totals)

    # ---- checkpoints -----------------------------------------------------------------------
    def save(self, directory: str | Path, tokenizer=None, extra: dict | None = None) -> Path:
        """Write the policy as a plain HF checkpoint plus ``trainer_state.pt`` (optimizer, step) and,
        with PPO, ``critic/``. Written under a temporary name and renamed, so a crash mid-save never
        leaves a half-written checkpoint under the final name."""
        directory = Path(directory)
        tmp = directory.with_name(directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        state = {"optimizer": self.optimizer.state_dict(), "step": self.step, "extra": extra or {}}
        if self.critic is not None:
            self.critic.save(tmp / "critic")
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
        torch.save(state, tmp / "trainer_state.pt")
        shutil.rmtree(directory, ignore_errors=True)
        tmp.rename(directory)
        return directory

    def load(self, directory: str | Path) -> dict:
        """Restore what ``save`` wrote (policy weights, optimizer(s), step); returns its ``extra``."""
        directory = Path(directory)
        saved = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        self.model.load_state_dict(saved.state_dict())
        state = torch.load(directory / "trainer_state.pt", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = state["step"]
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
