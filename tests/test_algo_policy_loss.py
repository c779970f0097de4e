"""Policy losses: hand-derived PPO / dual-clip / CISPO / GSPO / value numbers, gradients, registry."""

import math

import pytest
import torch

from rlvr.algo import POLICY_LOSSES, AlgoConfig, aggregate_loss, compute_cispo_loss, compute_policy_loss
from rlvr.algo import compute_value_loss, policy_loss_name
from rlvr.algo.policy_loss import gspo_token_log_ratio


def _kl(ratios):
    # ppo_kl = old - new = -log(ratio)
    return -torch.log(torch.tensor([ratios]))


def test_ppo_clip_hand_values():
    # (ratio, A): (1.5, 1) clipped at 1.28; (1.5, -1) unclipped; (0.5, 1) unclipped; (0.5, -1) clipped at 0.8
    loss, clipfrac = compute_policy_loss(_kl([1.5, 1.5, 0.5, 0.5]), torch.tensor([[1.0, -1.0, 1.0, -1.0]]), 0.2, 0.28)
    assert torch.allclose(loss, torch.tensor([[-1.28, 1.5, -0.5, 0.8]]), atol=1e-6)
    assert clipfrac.tolist() == [[1.0, 0.0, 0.0, 1.0]]


def test_dual_clip_caps_negative_advantage_losses():
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    loss, _ = compute_policy_loss(_kl([5.0, 1.5, 5.0]), adv, 0.2, 0.28, eps_clip_c=3.0)
    # ratio 5, A=-1: min(5, 3) = 3; ratio 1.5, A=-1: 1.5 < 3 kept; A>0 untouched (-1.28)
    assert torch.allclose(loss, torch.tensor([[3.0, 1.5, -1.28]]), atol=1e-6)
    with pytest.raises(ValueError, match="eps-clip-c"):
        compute_policy_loss(_kl([1.0]), torch.tensor([[1.0]]), 0.2, 0.2, eps_clip_c=1.0)


def test_ppo_gradient_is_zero_on_clipped_tokens_and_reinforce_at_ratio_one():
    lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1.0 - math.log(1.5), -1.0]])  # ratios 1.5 and 1
    loss, _ = compute_policy_loss(old - lp, torch.tensor([[1.0, 2.0]]), 0.2, 0.2)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert torch.allclose(g, torch.tensor([[0.0, -2.0]]))  # d(-r A)/d lp = -r A at r = 1


def test_cispo_keeps_gradient_on_clipped_tokens():
    lp = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    loss, clipfrac = compute_cispo_loss(_kl([1.5, 1.0]), lp, torch.tensor([[1.0, 2.0]]), 0.2, 0.28)
    # -sg(1.28) * 1 * (-0.5) = 0.64 ; -1 * 2 * (-1) = 2
    assert torch.allclose(loss, torch.tensor([[0.64, 2.0]]), atol=1e-6)
    assert clipfrac.tolist() == [[1.0, 0.0]]
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert torch.allclose(g, torch.tensor([[-1.28, -2.0]]), atol=1e-6)


def test_gspo_sequence_ratio_values():
    lp = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.0, 0.0]])
    old = torch.tensor([[-1.5, -1.5, 5.0], [-1.2, -1.4, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    # row 0: mean(.5, -.5) = 0 (the masked 5.0 is ignored); row 1: mean(.2, .4) = .3
    assert torch.allclose(gspo_token_log_ratio(lp, old, mask), torch.tensor([[0.0] * 3, [0.3] * 3]), atol=1e-6)
    cfg = AlgoConfig(advantage_estimator="gspo")
    loss, m = POLICY_LOSSES["gspo"](lp, old, torch.ones(2, 3), mask, cfg)
    # ratio 1 -> -1; ratio e^.3 = 1.35 > 1.2 -> clipped to -1.2
    assert torch.allclose(loss, torch.tensor([[-1.0] * 3, [-1.2] * 3]), atol=1e-6)
    assert m["pg_clipfrac"][1].tolist() == [1.0, 1.0, 1.0] and m["pg_clipfrac"][0].sum() == 0


@pytest.mark.parametrize("per_token", [False, True])
def test_gspo_token_form_matches_the_sequence_form_gradient(per_token):
    """GSPO-token (ours) vs differentiating the sequence mean on every token (slime): same gradient."""
    torch.manual_seed(3)
    lp = (-torch.rand(3, 5)).requires_grad_()
    old = lp.detach() + 0.05 * torch.randn(3, 5)
    mask = torch.tensor([[1.0] * 5, [1.0, 1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -0.5, 2.0])[:, None].expand(3, 5)
    denom = mask.sum().item() if per_token else 3.0
    cfg = AlgoConfig(eps_clip=0.02)  # small so some sequences clip
    ours, _ = POLICY_LOSSES["gspo"](lp, old, adv, mask, cfg)
    (g_ours,) = torch.autograd.grad(aggregate_loss(ours, mask, per_token, denom), lp)
    seq = ((old - lp) * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True)
    ref, _ = compute_policy_loss(seq.expand(3, 5), adv, 0.02, 0.02)
    (g_ref,) = torch.autograd.grad(aggregate_loss(ref, mask, per_token, denom), lp)
    assert torch.allclose(g_ours, g_ref, atol=1e-6)


def test_reinforce_loss_is_minus_a_log_p():
    lp = torch.tensor([[-2.0, -0.5]])
    loss, m = POLICY_LOSSES["reinforce"](lp, lp - 1.0, torch.tensor([[1.0, -2.0]]), torch.ones(1, 2), AlgoConfig())
    assert torch.equal(loss, torch.tensor([[2.0, -1.0]]))
    assert torch.equal(m["ppo_kl"], -torch.ones(1, 2))


def test_value_loss_hand_values():
    values, old, returns = torch.tensor([[1.0, 2.1]]), torch.tensor([[0.5, 2.0]]), torch.tensor([[2.0, 2.0]])
    loss, clipfrac = compute_value_loss(values, old, returns, 0.2)
    # V=1, V_old=.5 -> clipped .7: max(1, 1.69); V=2.1 within clip: max(.01, .01)
    assert torch.allclose(loss, torch.tensor([[1.69, 0.01]]), atol=1e-6)
    assert clipfrac.tolist() == [[1.0, 0.0]]


def test_policy_loss_name_follows_slime():
    assert policy_loss_name(AlgoConfig(advantage_estimator="gspo")) == "gspo"
    assert policy_loss_name(AlgoConfig(advantage_estimator="cispo")) == "cispo"
    for est in ("grpo", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo", "dcpo"):
        assert policy_loss_name(AlgoConfig(advantage_estimator=est)) == "ppo", est
    assert policy_loss_name(AlgoConfig(pg_loss_type="reinforce")) == "reinforce"


def test_every_policy_loss_has_the_uniform_signature():
    torch.manual_seed(4)
    b, t = 4, 7
    mask = (torch.rand(b, t) > 0.2).float()
    mask[2] = 0
    cfg = AlgoConfig(eps_clip_high=0.28, eps_clip_c=3.0)
    for name in POLICY_LOSSES:
        lp = (-torch.rand(b, t)).requires_grad_()
        loss, metrics = POLICY_LOSSES[name](lp, lp.detach() + 0.1 * torch.randn(b, t), torch.randn(b, t), mask, cfg)
        assert loss.shape == (b, t) and torch.isfinite(loss).all(), name
        assert {"pg_clipfrac", "ppo_kl"} <= set(metrics), name
        assert all(v.shape == (b, t) for v in metrics.values()), name
        (g,) = torch.autograd.grad(aggregate_loss(loss, mask, False, b), lp)
        assert torch.isfinite(g).all(), name
    with pytest.raises(KeyError, match="valid: cispo, gspo, ppo, reinforce"):
        POLICY_LOSSES["dapo"]
