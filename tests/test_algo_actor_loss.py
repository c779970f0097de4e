"""actor_loss: policy loss + corrections + entropy bonus + KL loss, against numbers derived by hand.

One sample, two tokens. p_theta / p0 = r = (1.5, 0.5), advantages A = (1, -1), eps_clip 0.2:
token 0: max(-1.5 * 1, -1.2 * 1) = -1.2 (clipped); token 1: max(-0.5 * -1, -0.8 * -1) = 0.8
(clipped). Both tokens take the clipped branch, so the policy loss has no gradient there.
"""

import math

import pytest
import torch

from rlvr.algo import AlgoConfig, actor_loss

OLD = torch.tensor([[0.0, 0.0]])
ADV = torch.tensor([[1.0, -1.0]])
MASK = torch.ones(1, 2)
ENT = torch.tensor([[2.0, 1.0]])


def _lp():
    return torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)


def _ref():
    # log p_theta - log p_ref = (1, -0.5): k1 is exactly that.
    return torch.tensor([[math.log(1.5) - 1.0, math.log(0.5) + 0.5]])


def test_ppo_entropy_and_kl_loss_by_hand():
    lp = _lp()
    cfg = AlgoConfig(eps_clip=0.2, entropy_coef=0.1, use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k1")
    loss, m = actor_loss(lp, ENT, OLD, torch.full((1, 2), float("nan")), ADV, MASK, _ref(), cfg)
    # pg (-1.2, 0.8) - 0.1 * entropy (2, 1) + 0.5 * k1 (1, -0.5) = (-0.9, 0.45)
    torch.testing.assert_close(loss, torch.tensor([[-0.9, 0.45]]))
    torch.testing.assert_close(m["pg_loss"], torch.tensor([[-1.2, 0.8]]))
    torch.testing.assert_close(m["entropy_loss"], ENT)
    torch.testing.assert_close(m["pg_clipfrac"], torch.tensor([[1.0, 1.0]]))
    torch.testing.assert_close(m["ppo_kl"], torch.tensor([[-math.log(1.5), -math.log(0.5)]]))
    torch.testing.assert_close(m["kl_loss"], torch.tensor([[1.0, -0.5]]))
    assert "tis" not in m and "opsm_clipfrac" not in m  # no correction asked: q (NaN here) is never read
    loss.sum().backward()
    # Clipped tokens: no policy-loss gradient; the k1 term contributes kl_loss_coef * 1 per token.
    torch.testing.assert_close(lp.grad, torch.tensor([[0.5, 0.5]]))


def test_kl_is_reported_but_not_added_without_use_kl_loss():
    cfg = AlgoConfig(eps_clip=0.2, kl_loss_type="k2")
    loss, m = actor_loss(_lp(), ENT, OLD, OLD, ADV, MASK, _ref(), cfg)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 0.8]]))  # entropy_coef 0: no entropy term either
    torch.testing.assert_close(m["kl_loss"], torch.tensor([[0.5, 0.125]]))  # (1^2 / 2, 0.5^2 / 2)
    _, no_ref = actor_loss(_lp(), ENT, OLD, OLD, ADV, MASK, None, cfg)
    assert "kl_loss" not in no_ref


def test_unbiased_kl_weights_the_estimate_by_p_theta_over_p0():
    cfg = AlgoConfig(eps_clip=0.2, use_kl_loss=True, kl_loss_coef=1.0, use_unbiased_kl=True)
    loss, m = actor_loss(_lp(), ENT, OLD, OLD, ADV, MASK, _ref(), cfg)
    torch.testing.assert_close(m["kl_loss"], torch.tensor([[1.5 * 1.0, 0.5 * -0.5]]))
    torch.testing.assert_close(loss, torch.tensor([[-1.2 + 1.5, 0.8 - 0.25]]))


@pytest.mark.parametrize("mode, weights", [("tis", [2.0, 0.5]), ("icepop", [0.0, 0.5])])
def test_tis_weights_multiply_the_policy_loss(mode, weights):
    # rho = p0 / q = (4, 0.5); TIS clamps to [0, 2]; ICE-POP zeroes the token outside [0, 2].
    q = torch.tensor([[-math.log(4.0), math.log(2.0)]])
    cfg = AlgoConfig(eps_clip=0.2, use_tis=True, tis_clip=2.0, tis_clip_low=0.0, tis_mode=mode)
    loss, m = actor_loss(_lp(), ENT, OLD, q, ADV, MASK, None, cfg)
    torch.testing.assert_close(loss, torch.tensor([[-1.2 * weights[0], 0.8 * weights[1]]]))
    torch.testing.assert_close(m["pg_loss"], loss)
    torch.testing.assert_close(m["tis"], torch.tensor([[4.0, 0.5]]))
    torch.testing.assert_close(m["tis_abs"], torch.tensor([[3.0, 0.5]]))
    torch.testing.assert_close(m["tis_clipfrac"], torch.tensor([[1.0, 0.0]]))


def test_opsm_drops_the_negative_advantage_tokens_of_a_stale_sample():
    # Sample 0: mean(log p0 - log p_theta) = mean(-ln 1.5, -ln 0.5) = 0.144 > delta: its A < 0 token
    # is dropped. Sample 1 (p_theta = p0): seq KL 0, kept; r = 1, so its loss is -A.
    lp = torch.tensor([[math.log(1.5), math.log(0.5)], [0.0, 0.0]])
    adv = torch.tensor([[1.0, -1.0], [1.0, -1.0]])
    cfg = AlgoConfig(eps_clip=0.2, use_opsm=True, opsm_delta=0.1)
    loss, m = actor_loss(lp, ENT.expand(2, 2), torch.zeros(2, 2), torch.zeros(2, 2), adv, torch.ones(2, 2), None, cfg)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 0.0], [-1.0, 1.0]]))
    torch.testing.assert_close(m["opsm_clipfrac"], torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
