"""Trainer: exact gradient accumulation, p0 == q on-policy, SFT and RL steps move the weights."""

import pytest
import torch

from rlvr.algo import AlgoConfig
from rlvr.config import TrainConfig
from rlvr.train.trainer import Trainer
from rlvr.core.types import Sample
from tests.conftest import random_samples


def _samples(n=8, seed=0):
    return random_samples(n, seed, lambda i, rng: float(rng.random() > 0.5))


def _grad(ckpt, samples, per_token, max_tokens, micro=1, expect_bins=None):
    algo = AlgoConfig(calculate_per_token_loss=per_token, use_kl_loss=True, kl_loss_coef=0.1,
                      kl_loss_type="low_var_kl", entropy_coef=0.01)
    dyn = max_tokens is not None
    tr = Trainer(TrainConfig(hf_checkpoint=str(ckpt), lr=1e-3, use_dynamic_batch_size=dyn,
                             max_tokens_per_gpu=max_tokens, micro_batch_size=micro),
                 algo, temperature=0.9, n_samples_per_prompt=4)
    captured = {}
    real_step = tr.optimizer.adamw.step

    def capture():
        captured["g"] = torch.cat([p.grad.flatten() for p in tr.model.parameters()])
        real_step()

    tr.optimizer.adamw.step = capture
    if expect_bins is not None:
        bins = tr.batches.split(samples, list(range(len(samples))))
        sizes = sorted(len(b) for b in bins)
        assert len(bins) == expect_bins and (expect_bins == 1 or sizes[0] != sizes[-1]), sizes
    with torch.no_grad():  # make p_theta differ from the reference so the KL term has a gradient
        next(tr.model.parameters()).add_(0.01)
    tr.train(0, samples)
    return captured["g"]


@pytest.mark.parametrize("per_token", [False, True])
def test_gradient_is_independent_of_the_micro_batch_split(tiny_qwen2, per_token):
    samples = _samples()
    whole = _grad(tiny_qwen2, samples, per_token, max_tokens=10_000, expect_bins=1)
    uneven = _grad(tiny_qwen2, samples, per_token, max_tokens=28, expect_bins=3)  # FFD count 3, KK: 2, 3, 3
    ones = _grad(tiny_qwen2, samples, per_token, max_tokens=None, micro=1)
    scale = whole.norm()
    assert scale > 0
    assert (whole - uneven).abs().max() / scale <= 1e-6
    assert (whole - ones).abs().max() / scale <= 1e-6


def test_on_policy_old_log_probs_equal_engine_log_probs(tiny_qwen2):
    from transformers import AutoTokenizer

    from rlvr.engine.base import GenerateRequest, SamplingParams
    from rlvr.engine.local.embedded import EmbeddedEngine

    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    tr = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), lr=1e-3), AlgoConfig(), temperature=0.8,
                 n_samples_per_prompt=2)
    eng = EmbeddedEngine(tr.model, pad_token_id=tok.pad_token_id, seed=3)
    prompts = [tok(x, add_special_tokens=False)["input_ids"] for x in ["1+2=", "30-4=", "5+5="]]
    res = eng.generate_sync([GenerateRequest(p, SamplingParams(temperature=0.8, max_new_tokens=5))
                             for p in prompts for _ in range(2)])
    samples = [Sample("", prompts[i // 2], response_ids=r.token_ids, rollout_log_probs=r.log_probs,
                      loss_mask=[1] * len(r.token_ids), reward=float(i % 2)) for i, r in enumerate(res)]
    metrics = tr.train(0, samples)
    assert metrics["train/train_rollout_logprob_abs_diff"] < 1e-5
    assert metrics["train/ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["train/pg_clipfrac"] == 0.0


def test_sft_step_lowers_nll(tiny_qwen2):
    tr = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), lr=1e-2, micro_batch_size=4), AlgoConfig())
    samples = _samples(4, seed=1)
    first = tr.train_sft(samples)["train/loss"]
    for _ in range(5):
        last = tr.train_sft(samples)["train/loss"]
    assert last < first - 0.1 and tr.step == 6
