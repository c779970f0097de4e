"""Score centering wired: engine head, loss with TIS, config rules, a CLI run."""

import json

import pytest
import torch

from rlvr.algo import AlgoConfig, actor_loss, policy_loss_name
from rlvr.algo.score_centering import SamplerHead
from rlvr.entrypoints.cli import main
from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.local.embedded import EmbeddedEngine
from rlvr.core.errors import ConfigError
from rlvr.core.testing import override_trainer
from rlvr.runtime.configure import check_algo
from rlvr.train.logprobs import response_log_probs
from rlvr.train.trainer import load_policy
from rlvr.core.types import Sample


def _sc_grad(p, q, head, sampled, advantage, cfg):
    """d loss / d logits for one token whose trainer distribution is ``p`` (logits = log p)."""
    z = torch.tensor(p).log().requires_grad_(True)
    logp = z.log_softmax(-1)
    h = torch.tensor(head)
    sc = SamplerHead(logp[h].view(1, 1, -1), torch.tensor(q)[h].log().view(1, 1, -1), torch.ones(1, 1, len(head)))
    loss, metrics = actor_loss(logp[sampled].view(1, 1), torch.zeros(1, 1), torch.zeros(1, 1),
                               torch.tensor(q[sampled]).log().view(1, 1), torch.tensor([[advantage]]),
                               torch.ones(1, 1), None, cfg, head=sc)
    loss.sum().backward()
    return z.grad, {k: float(v.detach()) for k, v in metrics.items()}


def test_seed_example_full_support_centres_the_score():
    # By hand: p = (0.6, 0.4), q = (0.5, 0.5), s_a = e_a - p; the uncentred mean is q - p = (-0.1, 0.1).
    # -grad = A (s_a - (q - p)) = A (e_a - q): for a = 0, A = 1 that is (0.5, -0.5); plain REINFORCE
    # would give e_0 - p = (0.4, -0.4).
    cfg = AlgoConfig(use_score_centering=True).validate()
    grad, metrics = _sc_grad([0.6, 0.4], [0.5, 0.5], [0, 1], 0, 1.0, cfg)
    torch.testing.assert_close(grad, torch.tensor([-0.5, 0.5]), atol=1e-5, rtol=0)
    assert metrics["score_centering_sampler_head_mass"] == pytest.approx(1.0)
    assert metrics["score_centering_sampled_token_weight"] == pytest.approx(1.0)


def test_top_k_head_with_tis_weights_by_hand():
    # V = 3, head {0, 1}: p = (0.5, 0.3, 0.2), q = (0.4, 0.4, 0.2); TIS clamp to [0, 1.2].
    # w_0 = clamp(1.25) = 1.2, w_1 = 0.75; alpha = (1 - 0.8) / (1 - 0.8) = 1, alpha f(1 / alpha) = 1.
    # mu_w = (0.4 * 1.2 - 0.5) s_0 + (0.4 * 0.75 - 0.3) s_1 = -0.02 (e_0 - p).
    # Sampled a = 1, A = 2: -grad = 2 (0.75 (e_1 - p) + 0.02 (e_0 - p)) = (-0.73, 1.038, -0.308).
    cfg = AlgoConfig(use_score_centering=True, use_tis=True, tis_clip=1.2).validate()
    grad, metrics = _sc_grad([0.5, 0.3, 0.2], [0.4, 0.4, 0.2], [0, 1], 1, 2.0, cfg)
    torch.testing.assert_close(grad, torch.tensor([0.73, -1.038, 0.308]), atol=1e-5, rtol=0)
    # here the tail of q is exactly alpha p, so the head formula equals the full-vocabulary centring
    full, _ = _sc_grad([0.5, 0.3, 0.2], [0.4, 0.4, 0.2], [0, 1, 2], 1, 2.0, cfg)
    torch.testing.assert_close(grad, full, atol=1e-5, rtol=0)
    assert metrics["score_centering_sampler_head_mass"] == pytest.approx(0.8)
    assert metrics["score_centering_trainer_head_mass"] == pytest.approx(0.8)
    assert metrics["score_centering_sampled_token_weight"] == pytest.approx(0.75)
    assert metrics["tis"] == pytest.approx(0.75) and metrics["tis_clipfrac"] == 0.0


def test_engine_returns_the_head_of_q_the_trainer_recomputes(tiny_qwen2):
    model = load_policy(str(tiny_qwen2), False)
    engine = EmbeddedEngine(model, pad_token_id=256, seed=0)
    try:
        (r,) = engine.generate_sync([GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=6, top_logprobs_num=4))])
        (plain,) = engine.generate_sync([GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=6))])
    finally:
        engine.close()
    assert len(r.top_token_ids) == len(r.token_ids) and all(len(h) == 4 for h in r.top_token_ids)
    assert plain.top_token_ids == []
    s = Sample("", [5, 6, 7], response_ids=r.token_ids, rollout_log_probs=r.log_probs, loss_mask=[1] * len(r.token_ids),
               rollout_topk_token_ids=r.top_token_ids, rollout_topk_log_probs=r.top_log_probs)
    with torch.no_grad():
        lp, _ = response_log_probs(model, [s], 1.0, len(r.token_ids), False, heads=True)
    torch.testing.assert_close(lp[0, :, 1:], torch.tensor(r.top_log_probs), atol=1e-4, rtol=0)
    torch.testing.assert_close(lp[0, :, 0], torch.tensor(r.log_probs), atol=1e-4, rtol=0)
    assert (torch.tensor(r.top_log_probs).diff(dim=-1) <= 0).all()  # most likely first


def test_config_rules():
    assert policy_loss_name(AlgoConfig(use_score_centering=True).validate()) == "reinforce"
    with pytest.raises(ConfigError, match="--use-score-centering.*--pg-loss-type reinforce"):
        AlgoConfig(use_score_centering=True, pg_loss_type="ppo").validate()
    with pytest.raises(ConfigError, match="--use-opsm"):
        AlgoConfig(use_score_centering=True, use_opsm=True).validate()
    with pytest.raises(ConfigError, match="--use-score-centering.*gspo"):
        check_algo(AlgoConfig(use_score_centering=True, advantage_estimator="gspo").validate())


def test_two_rollouts_with_score_centering_and_tis(tiny_qwen2, arith_files, tmp_path):
    base = ["train", "--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0]),
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "6",
            "--num-rollout", "2", "--no-use-tensorboard", "--use-score-centering", "--score-centering-top-k", "16"]
    out = tmp_path / "sc"
    # Every sample runs its forward: the tiny model's answers may all score 0 (no advantage, so
    # no micro-batch at all), and the metrics checked below come from the training forward.
    with override_trainer(skip_silent_samples=False):
        code = main(base + ["--output-dir", str(out), "--use-tis", "--disable-grpo-std-normalization",
                            "--calculate-per-token-loss"])
    assert code == 0
    train = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"train/step"' in x]
    assert [r["train/step"] for r in train] == [1, 2]
    for r in train:
        assert 0 < r["train/score_centering_sampler_head_mass"] <= 1.0 + 1e-6
        assert abs(r["train/score_centering_trainer_head_mass"] - r["train/score_centering_sampler_head_mass"]) < 1e-3
        assert "train/tis" in r and "train/pg_clipfrac" not in r
    assert main(base + ["--output-dir", str(tmp_path / "bad"), "--rollout-top-p", "0.9"]) == 2
