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
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM

from rlvr.algo import (
    ADVANTAGES,
    POLICY_LOSSES,
    AdvantageInputs,
    AlgoConfig,
    aggregate_loss,
    compute_approx_kl,
    global_denominator,
    masked_mean,
    masked_whiten,
    policy_loss_name,
)
from rlvr.config import TrainConfig
from rlvr.train.batching import first_fit, fixed_size
from rlvr.types import Sample

# loss_fn(indices, log_probs, entropy) -> (per-token loss [b, T], per-token metrics {name: [b, T]})
LossFn = Callable[[list[int], torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def pad_right(rows: list[list[float]] | list[list[int]], width: int, value: float = 0.0, dtype=torch.float32):
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def response_log_probs(
    model: torch.nn.Module, samples: list[Sample], temperature: float, width: int, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[b, width]`` of each sample's response tokens under ``model`` at ``temperature``
    (right-padded with 0), and optionally the entropy of each position's distribution."""
    lengths = [s.total_length for s in samples]
    seq = pad_right([s.prompt_ids + s.response_ids for s in samples], max(lengths), dtype=torch.long)
    attn = pad_right([[1] * n for n in lengths], max(lengths), dtype=torch.long)
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


class Trainer:
    def __init__(
        self,
        train: TrainConfig,
        algo: AlgoConfig,
        temperature: float = 1.0,
        global_batch_size: int | None = None,
        n_samples_per_prompt: int = 1,
    ):
        self.cfg, self.algo = train, algo
        self.temperature = temperature
        self.global_batch_size = global_batch_size
        self.n_samples_per_prompt = n_samples_per_prompt
        torch.manual_seed(train.seed)
        self.model = AutoModelForCausalLM.from_pretrained(train.hf_checkpoint, dtype=torch.float32).eval()
        needs_ref = algo.use_kl_loss or algo.kl_coef != 0
        self.ref_model = copy.deepcopy(self.model).requires_grad_(False) if needs_ref else None
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=train.lr,
            betas=(train.adam_beta1, train.adam_beta2),
            weight_decay=train.weight_decay,
        )
        self.step = 0  # optimizer steps taken (train/step)

    # ---- what the loop calls --------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in self.model.named_parameters()}

    def train(self, rollout_id: int, samples: list[Sample]) -> dict[str, float]:
        """One rollout's optimizer steps. Returns ``train/*`` and ``perf/*`` metrics."""
        t0 = time.perf_counter()
        algo, n = self.algo, len(samples)
        width = max(s.response_length for s in samples)
        mask = pad_right([s.loss_mask for s in samples], width)
        rollout_lp = pad_right([s.rollout_log_probs for s in samples], width)
        with torch.no_grad():
            old_lp = self._forward_all(self.model, samples, width)
            ref_lp = self._forward_all(self.ref_model, samples, width) if self.ref_model is not None else None
        rewards = torch.tensor([s.scalar_reward() for s in samples], dtype=torch.float32)
        advantages, _returns = ADVANTAGES[algo.advantage_estimator](
            AdvantageInputs(rewards, mask, self.n_samples_per_prompt, log_probs=old_lp, ref_log_probs=ref_lp),
            algo,
        )
        if algo.normalize_advantages:
            advantages = masked_whiten(advantages, mask)
        pg_loss_fn = POLICY_LOSSES[policy_loss_name(algo)]

        def rl_loss(idx: list[int], lp: torch.Tensor, ent: torch.Tensor):
            m = mask[idx]
            pg_loss, metrics = pg_loss_fn(lp, old_lp[idx], advantages[idx], m, algo)
            loss = pg_loss - algo.entropy_coef * ent if algo.entropy_coef else pg_loss
            metrics = {"pg_loss": pg_loss, "entropy_loss": ent, **metrics}
            if ref_lp is not None:
                kl = compute_approx_kl(lp, ref_lp[idx], algo.kl_loss_type)
                if algo.use_kl_loss:
                    loss = loss + algo.kl_loss_coef * kl
                metrics["kl_loss"] = kl
            return loss, metrics

        gbs = self.global_batch_size or n
        out: dict[str, list[float]] = defaultdict(list)
        for start in range(0, n, gbs):
            idx = list(range(start, min(start + gbs, n)))
            for k, v in self._optimizer_step(samples, idx, mask, width, rl_loss, algo.calculate_per_token_loss).items():
                out[k].append(v)
        metrics = {f"train/{k}": sum(v) / len(v) for k, v in out.items()}
        metrics["train/train_rollout_logprob_abs_diff"] = float(masked_mean((old_lp - rollout_lp).abs(), mask))
        metrics["train/advantage_mean"] = float(masked_mean(advantages, mask))
        metrics["perf/train_time"] = time.perf_counter() - t0
        metrics["perf/train_tokens_per_s"] = sum(s.total_length for s in samples) / metrics["perf/train_time"]
        return metrics

    def train_sft(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step of negative log-likelihood on the response tokens (per-token mean)."""
        width = max(s.response_length for s in samples)
        mask = pad_right([s.loss_mask for s in samples], width)

        def nll(idx: list[int], lp: torch.Tensor, ent: torch.Tensor):
            return -lp, {"entropy_loss": ent}

        metrics = self._optimizer_step(samples, list(range(len(samples))), mask, width, nll, per_token=True)
        return {f"train/{k}": v for k, v in metrics.items()}

    # ---- internals -------------------------------------------------------------------------
    def _micro_batches(self, samples: list[Sample], idx: list[int]) -> list[list[int]]:
        if self.cfg.use_dynamic_batch_size:
            bins = first_fit([samples[i].total_length for i in idx], self.cfg.max_tokens_per_gpu)
        else:
            bins = fixed_size(len(idx), self.cfg.micro_batch_size)
        return [[idx[j] for j in b] for b in bins]

    def _forward_all(self, model, samples: list[Sample], width: int) -> torch.Tensor:
        out = torch.zeros(len(samples), width)
        for mb in self._micro_batches(samples, list(range(len(samples)))):
            out[mb] = response_log_probs(model, [samples[i] for i in mb], self.temperature, width, False)[0]
        return out

    def _optimizer_step(
        self, samples: list[Sample], idx: list[int], mask: torch.Tensor, width: int, loss_fn: LossFn, per_token: bool
    ) -> dict[str, float]:
        """Accumulate gradients over the micro-batches of ``idx`` and take one step."""
        denominator = global_denominator([mask[idx]], per_token)  # of the whole global batch
        totals: dict[str, float] = defaultdict(float)
        self.optimizer.zero_grad(set_to_none=True)
        for mb in self._micro_batches(samples, idx):
            mb_samples = [samples[i] for i in mb]
            lp, ent = response_log_probs(self.model, mb_samples, self.temperature, width, True)
            loss_tok, tok_metrics = loss_fn(mb, lp, ent)
            loss = aggregate_loss(loss_tok, mask[mb], per_token, denominator)
            loss.backward()
            totals["loss"] += float(loss.detach())
            for k, v in tok_metrics.items():
                totals[k] += float(aggregate_loss(v.detach(), mask[mb], per_token, denominator))
        clip = self.cfg.clip_grad if self.cfg.clip_grad > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.optimizer.step()
        self.step += 1
        totals["grad_norm"] = float(grad_norm)
        totals["lr"] = self.optimizer.param_groups[0]["lr"]
        return dict(totals)

    # ---- checkpoints -----------------------------------------------------------------------
    def save(self, directory: str | Path, tokenizer=None, extra: dict | None = None) -> Path:
        """Write a HF checkpoint (``model/``) and the optimizer/step state, atomically."""
        directory = Path(directory)
        tmp = directory.with_name(directory.name + ".tmp")
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp)
        self.model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        torch.save(
            {"optimizer": self.optimizer.state_dict(), "step": self.step, "extra": extra or {}},
            tmp / "trainer_state.pt",
        )
        if directory.exists():
            import shutil

            shutil.rmtree(directory)
        tmp.rename(directory)
        return directory
