"""Trainer behaviour added by the trainer issue: steps per rollout, rollout log-probs, the
reference model, bf16 master weights, recompute, overlong samples and the bad-step guard."""

import math

import pytest
import torch

from rlvr.algo import AlgoConfig
from rlvr.config import TrainConfig
from rlvr.core.errors import TrainingStopped
from rlvr.models.tiny import build_tiny_model
from rlvr.core.testing import override_trainer
from rlvr.train.packing import Layout
from rlvr.train.trainer import Trainer
from rlvr.core.types import Sample
from tests.conftest import SMALL, random_samples


def _samples(n=8, seed=0):
    return random_samples(n, seed, lambda i, rng: float(i % 2))


def _trainer(ckpt, algo=None, layout=Layout(), **train):  # noqa: B008 (Layout is frozen)
    cfg = TrainConfig(hf_checkpoint=str(ckpt), **{"lr": 1e-3, **train})
    return Trainer(cfg, algo or AlgoConfig(), n_samples_per_prompt=4, layout=layout)


def _weights(tr):
    return torch.cat([p.detach().float().flatten() for p in tr.model.parameters()])


def test_several_optimizer_steps_per_rollout_are_off_policy(tiny_qwen2):
    tr = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), lr=1e-2), AlgoConfig(), n_samples_per_prompt=4,
                 global_batch_size=4)
    steps = []
    real = tr._policy_step

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        steps.append(out)
        return out

    tr._policy_step = spy
    tr.train(0, _samples())
    assert tr.step == 2 and len(steps) == 2
    assert steps[0]["ppo_kl"] == pytest.approx(0.0, abs=1e-6)  # first step: p_theta == p0
    assert abs(steps[1]["ppo_kl"]) > 1e-6  # second step: the policy moved, the ratio acts


def test_use_rollout_logprobs_takes_the_engines_log_probs_as_p0(tiny_qwen2):
    recomputed = _trainer(tiny_qwen2).train(0, _samples())
    engine = _trainer(tiny_qwen2, use_rollout_logprobs=True).train(0, _samples())
    assert recomputed["train/train_rollout_logprob_abs_diff"] > 1.0  # the model's p0 is far from -1.0
    assert engine["train/train_rollout_logprob_abs_diff"] == 0.0
    # the k3 estimate of KL(q || p): zero when p0 is q, positive when they differ
    assert engine["train/train_rollout_kl"] == 0.0 and recomputed["train/train_rollout_kl"] > 0.0
    no_engine_lp = [Sample("", [1, 2], response_ids=[3, 4], loss_mask=[1, 1], reward=float(i % 2)) for i in range(4)]
    with pytest.raises(ValueError, match="--use-rollout-logprobs"):
        _trainer(tiny_qwen2, use_rollout_logprobs=True).train(0, no_engine_lp)


def test_reference_model_only_with_kl_and_frozen(tiny_qwen2):
    no_kl = _trainer(tiny_qwen2)
    no_kl.train(0, _samples())
    assert no_kl.reference is None
    kl = AlgoConfig(use_kl_loss=True, kl_loss_coef=0.1)
    tr = _trainer(tiny_qwen2, kl)
    before = torch.cat([p.flatten() for p in tr.reference.model.parameters()]).clone()
    m = tr.train(0, _samples())
    assert tr.reference.forwards == 1 and "train/kl_loss" in m
    assert torch.equal(before, torch.cat([p.flatten() for p in tr.reference.model.parameters()]))  # frozen
    assert not any(p.requires_grad for p in tr.reference.model.parameters())


def test_ref_load_and_ref_update_interval(tiny_qwen2, tmp_path):
    other = build_tiny_model(tmp_path / "other", seed=7, **SMALL)
    kl = AlgoConfig(use_kl_loss=True, kl_loss_coef=0.1)
    m = _trainer(tiny_qwen2, kl, ref_load=str(other)).train(0, _samples())
    assert m["train/kl_loss"] > 0.01  # the reference is another model from step 0
    tr = _trainer(tiny_qwen2, kl, ref_update_interval=2)
    tr.train(0, _samples())
    assert not torch.equal(_weights(tr), torch.cat([p.flatten() for p in tr.reference.model.parameters()]))
    tr.train(1, _samples())  # rollout 1 is the 2nd: the reference becomes the current policy
    assert torch.equal(_weights(tr), torch.cat([p.flatten() for p in tr.reference.model.parameters()]))


def test_bf16_keeps_float32_master_weights(tiny_qwen2):
    tr = _trainer(tiny_qwen2, bf16=True, lr=1e-2)
    assert {p.dtype for p in tr.model.parameters()} == {torch.bfloat16}
    assert {m.dtype for m in tr.optimizer.master} == {torch.float32}
    before = [m.clone() for m in tr.optimizer.master]
    metrics = tr.train(0, _samples())
    assert math.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.optimizer.master))
    for m, p in zip(tr.optimizer.master, tr.model.parameters()):
        assert torch.equal(m.to(torch.bfloat16), p.detach())


@pytest.mark.parametrize("per_token", [False, True])
def test_recompute_and_padding_do_not_change_the_gradient(tiny_qwen2, per_token):
    def grad(**kw):
        tr = _trainer(tiny_qwen2, AlgoConfig(calculate_per_token_loss=per_token, entropy_coef=0.01),
                      use_dynamic_batch_size=True, max_tokens_per_gpu=28, **kw)
        captured = {}
        real = tr.optimizer.adamw.step
        tr.optimizer.adamw.step = lambda: (captured.setdefault("g", torch.cat([p.grad.flatten() for p in tr.optimizer.master])),
                                     real())
        tr.train(0, _samples())
        return captured["g"]

    plain = grad()
    for other in (grad(recompute_activations=True), grad(layout=Layout(packed=False))):
        assert (plain - other).abs().max() / plain.norm() <= 1e-6


def test_overlong_samples_are_left_out_and_counted(tiny_qwen2):
    samples = _samples()
    samples[3] = Sample("", [1] * 30, response_ids=[2] * 5, loss_mask=[1] * 5, rollout_log_probs=[-1.0] * 5,
                        reward=1.0)
    m = _trainer(tiny_qwen2, use_dynamic_batch_size=True, max_tokens_per_gpu=28).train(0, samples)
    assert m["train/overlong_samples"] == 1 and math.isfinite(m["train/loss"])


def _poison(rollouts):
    return lambda rollout_id, loss: loss * float("nan") if rollout_id in rollouts else loss


def test_a_poisoned_step_is_skipped_and_training_continues(tiny_qwen2):
    tr = _trainer(tiny_qwen2, lr=1e-2)
    with override_trainer(loss_hook=_poison({1})):
        tr.train(0, _samples())
        w0 = _weights(tr)
        m1 = tr.train(1, _samples())
        assert m1["train/skipped_steps"] == 1 and math.isnan(m1["train/loss"])
        assert torch.equal(_weights(tr), w0)  # untouched
        m2 = tr.train(2, _samples())
    assert m2["train/skipped_steps"] == 0 and torch.isfinite(_weights(tr)).all()
    assert not torch.equal(_weights(tr), w0)
    tr.guard.raise_if_exhausted()  # one skip, then a good step: no stop


def test_k_poisoned_steps_in_a_row_stop_with_the_rollout_named(tiny_qwen2):
    tr = _trainer(tiny_qwen2, max_consecutive_skipped_steps=2)
    with override_trainer(loss_hook=_poison({1, 2})):
        tr.train(0, _samples())
        tr.train(1, _samples())
        tr.guard.raise_if_exhausted()
        tr.train(2, _samples())
    with pytest.raises(TrainingStopped, match=r"began at rollout 1 \(train step 1: non-finite loss"):
        tr.guard.raise_if_exhausted()


@pytest.mark.parametrize("algo", [AlgoConfig(), AlgoConfig(use_tis=True, calculate_per_token_loss=True)])
def test_on_policy_p0_from_the_training_forward_equals_a_separate_forward(tiny_qwen2, algo):
    def run(reuse):
        tr = _trainer(tiny_qwen2, algo, use_dynamic_batch_size=True, max_tokens_per_gpu=28)
        captured = {}
        real = tr.optimizer.adamw.step
        tr.optimizer.adamw.step = lambda: (captured.setdefault("g", torch.cat([p.grad.flatten() for p in tr.optimizer.master])),
                                     real())
        forward_all, p0_forwards = tr.batches.forward_all, []
        tr.batches.forward_all = lambda *a, **kw: (p0_forwards.append(1), forward_all(*a, **kw))[1]
        with override_trainer(p0_from_train_forward=reuse):
            metrics = tr.train(0, _samples())
        assert len(p0_forwards) == (0 if reuse else 1)  # the seam reached the trainer
        return captured, metrics

    (g_reuse, m_reuse), (g_sep, m_sep) = run(True), run(False)
    assert (g_reuse["g"] - g_sep["g"]).abs().max() / g_sep["g"].norm() <= 1e-6
    for key in ("train/train_rollout_logprob_abs_diff", "train/pg_loss", "train/ppo_kl", "train/pg_clipfrac"):
        assert m_reuse[key] == pytest.approx(m_sep[key], abs=1e-6)
