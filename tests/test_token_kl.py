"""Exact token-level KL (``--kl-loss-type token_level_kl``): the formula by hand, the chunked
forward against a brute-force full-vocabulary computation (values and gradients), the trainer."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algo import AlgoConfig, actor_loss
from rlvr.algo.kl import compute_approx_kl, exact_kl, kl_loss_types
from rlvr.config import TrainConfig
from rlvr.core.errors import ConfigError
from rlvr.models.tiny import build_tiny_model
from rlvr.train.logprobs import decoder_and_head
from rlvr.train.packing import Layout
from rlvr.train.token_kl import ReferenceStates, reference_forward
from rlvr.train.trainer import Trainer, load_policy
from tests.conftest import SMALL, random_samples


def test_exact_kl_and_its_gradient_by_hand():
    # p = (1/2, 1/4, 1/4), q = (1/4, 1/2, 1/4):
    # KL = 1/2 ln 2 + 1/4 ln(1/2) + 0 = (1/4) ln 2.
    logits = torch.tensor([math.log(2.0), 0.0, 0.0], requires_grad=True)
    q = torch.tensor([0.25, 0.5, 0.25]).log()
    kl = exact_kl(logits.log_softmax(-1), q)
    assert kl.item() == pytest.approx(0.25 * math.log(2), abs=1e-7)
    # d KL / d z_k = p_k (log p_k - log q_k - KL): (1/2)(ln 2 - KL), (1/4)(-ln 2 - KL), (1/4)(-KL).
    kl.backward()
    k = 0.25 * math.log(2)
    expected = [0.5 * (math.log(2) - k), 0.25 * (-math.log(2) - k), 0.25 * (-k)]
    assert logits.grad.tolist() == pytest.approx(expected, abs=1e-7)
    assert exact_kl(q, q).item() == 0.0


def test_token_level_kl_is_a_choice_but_not_a_sampled_estimator():
    assert "token_level_kl" in kl_loss_types() and "low_var_kl" in kl_loss_types()
    with pytest.raises(ValueError, match="full distributions"):
        compute_approx_kl(torch.zeros(1, 1), torch.zeros(1, 1), "token_level_kl")
    cfg = AlgoConfig(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="token_level_kl")
    with pytest.raises(ValueError, match="exact_kl"):
        actor_loss(*(torch.zeros(1, 2) for _ in range(6)), torch.zeros(1, 2), cfg)
    AlgoConfig(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="token_level_kl").validate()
    with pytest.raises(ConfigError, match="--kl-loss-type"):
        AlgoConfig(kl_coef=0.1, kl_loss_type="token_level_kl").validate()
    with pytest.raises(ConfigError, match="--use-unbiased-kl"):
        AlgoConfig(use_kl_loss=True, kl_loss_type="token_level_kl", use_unbiased_kl=True).validate()


@pytest.fixture(scope="module")
def pair(tiny_qwen2, tmp_path_factory):
    other = build_tiny_model(tmp_path_factory.mktemp("ref"), seed=5, **SMALL)
    return load_policy(str(tiny_qwen2), False), load_policy(str(other), False), other


def _brute_force_kl(policy, ref, samples, temperature):
    """KL per response token from each model's own full logits, sample by sample, no chunks."""
    out = []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        n = len(s.response_ids)
        lp = (policy(input_ids=ids).logits[0, -n - 1 : -1].float() / temperature).log_softmax(-1)
        with torch.no_grad():
            lq = (ref(input_ids=ids).logits[0, -n - 1 : -1].float() / temperature).log_softmax(-1)
        out.append((lp.exp() * (lp - lq)).sum(-1))
    return torch.cat(out)


@pytest.mark.parametrize("chunk", [3, 1 << 30])
def test_chunked_exact_kl_matches_brute_force_values_and_gradients(pair, chunk):
    policy, ref, _ = pair
    samples = random_samples(5, 1, lambda i, rng: 0.0)
    states = ReferenceStates(decoder_and_head(ref)[1])
    width = max(s.response_length for s in samples)
    reference_forward(ref, samples, list(range(5)), states, 0.8, width, chunk, Layout())
    from rlvr.train.logprobs import response_log_probs

    policy.zero_grad()
    _, _, kl_rows = response_log_probs(policy, samples, 0.8, width, True, chunk, kl_ref=states.for_micro_batch([0, 1, 2, 3, 4]))
    mask = torch.zeros_like(kl_rows, dtype=torch.bool)
    for i, s in enumerate(samples):
        mask[i, : s.response_length] = True
    kl_rows[mask].sum().backward()
    got_grad = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    brute = _brute_force_kl(policy, ref, samples, 0.8)
    brute.sum().backward()
    assert torch.allclose(kl_rows[mask], brute, atol=1e-5)
    assert (brute > 0).all()
    for g, p in zip(got_grad, policy.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-5)


def test_trainer_kl_loss_is_the_exact_kl(tiny_qwen2, pair):
    _, ref, other = pair
    samples = random_samples(8, 2, lambda i, rng: float(i % 2))
    algo = AlgoConfig(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="token_level_kl", calculate_per_token_loss=True)
    tr = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), ref_load=str(other), lr=1e-3, log_probs_chunk_size=4),
                 algo, n_samples_per_prompt=4)
    with torch.no_grad():
        expected = _brute_force_kl(tr.model, ref, samples, 1.0).mean().item()  # per-token mean, step 0
    m = tr.train(0, samples)
    assert m["train/kl_loss"] == pytest.approx(expected, rel=1e-4)
    assert tr.reference.forwards == 1
    # low_var_kl on the same batch estimates the same quantity from the sampled tokens only.
    approx = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), ref_load=str(other), lr=1e-3),
                     AlgoConfig(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl",
                                calculate_per_token_loss=True), n_samples_per_prompt=4).train(0, samples)
    assert approx["train/kl_loss"] != pytest.approx(expected, rel=1e-3)


@pytest.mark.slow
def test_cli_two_rollouts_with_token_level_kl(tiny_qwen2, arith_files, tmp_path):
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "rlvr", "train", "--hf-checkpoint", str(tiny_qwen2), "--prompt-data",
         str(arith_files[0]), "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len",
         "6", "--num-rollout", "2", "--lr", "1e-2", "--use-kl-loss", "--kl-loss-coef", "0.1", "--kl-loss-type",
         "token_level_kl", "--log-probs-chunk-size", "4", "--entropy-coef", "0.1", "--output-dir", str(out)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    trains = [x for x in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "train/step" in x]
    assert len(trains) == 2
    assert trains[0]["train/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # the policy is its reference at first
    # One step later (the entropy bonus moves it even when every reward is 0) the KL is positive.
    assert trains[1]["train/kl_loss"] > 1e-6
