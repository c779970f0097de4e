"""Advantage estimators: hand-derived tensors, edge cases, loop-vs-vectorised GAE, registry."""

import pytest
import torch

from rlvr.algo import ADVANTAGES, AdvantageInputs, AlgoConfig, discounted_returns, gae, group_normalize
from rlvr.algo.advantages import leave_one_out

INV_SQRT2 = 0.70710678  # 0.5 / std([1, 0]) with std = sqrt(0.5)


def _inp(rewards, mask, n, **kw):
    return AdvantageInputs(rewards=torch.tensor(rewards), loss_mask=torch.tensor(mask), n_samples_per_prompt=n, **kw)


def test_group_normalize_hand_values():
    out = group_normalize(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2)
    assert torch.allclose(out, torch.tensor([INV_SQRT2, -INV_SQRT2, 0.0, 0.0]), atol=1e-5)
    # mean 2.5, unbiased std sqrt(5/3) = 1.2909944
    out4 = group_normalize(torch.tensor([1.0, 2.0, 3.0, 4.0]), 4)
    assert torch.allclose(out4, torch.tensor([-1.1618950, -0.3872983, 0.3872983, 1.1618950]), atol=1e-5)
    assert torch.allclose(
        group_normalize(torch.tensor([1.0, 2.0, 3.0, 4.0]), 4, std_normalize=False),
        torch.tensor([-1.5, -0.5, 0.5, 1.5]),
    )


def test_group_normalize_degenerate_groups_are_zero_not_nan():
    assert torch.equal(group_normalize(torch.tensor([3.0, 3.0, 3.0]), 3), torch.zeros(3))
    assert torch.equal(group_normalize(torch.tensor([3.0, 1.0]), 1), torch.zeros(2))  # groups of one
    with pytest.raises(ValueError, match="n-samples-per-prompt"):
        group_normalize(torch.tensor([1.0, 2.0, 3.0]), 2)


def test_discounted_returns_and_gae_hand_values():
    assert torch.allclose(discounted_returns(torch.tensor([[1.0, 2.0, 3.0]]), 0.5), torch.tensor([[2.75, 3.5, 3.0]]))
    r, v = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = gae(r, v, 1.0, 1.0)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.4, 0.3]])) and torch.allclose(ret, torch.ones(1, 3))
    # gamma .9, lambda .5: deltas [0.04, 0.03, 0.3]; A2=.3, A1=.03+.45*.3, A0=.04+.45*.165
    adv, ret = gae(r, v, 0.9, 0.5)
    assert torch.allclose(adv, torch.tensor([[0.11425, 0.165, 0.3]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.61425, 0.765, 1.0]]), atol=1e-6)


def test_gae_matches_a_naive_double_loop():
    torch.manual_seed(1)
    r, v = torch.randn(4, 9), torch.randn(4, 9)
    gamma, lambd = 0.95, 0.8
    expected = torch.zeros(4, 9)
    for b in range(4):
        for t in range(9):
            for k in range(t, 9):
                nxt = v[b, k + 1] if k + 1 < 9 else 0.0
                delta = r[b, k] + gamma * nxt - v[b, k]
                expected[b, t] += (gamma * lambd) ** (k - t) * delta
    adv, ret = gae(r, v, gamma, lambd)
    assert torch.allclose(adv, expected, atol=1e-5)
    assert torch.allclose(ret, expected + v, atol=1e-5)


def test_grpo_broadcasts_over_the_mask():
    inp = _inp([1.0, 0.0], [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], 2)
    adv, ret = ADVANTAGES["grpo"](inp, AlgoConfig())
    assert torch.allclose(adv, torch.tensor([[INV_SQRT2, INV_SQRT2, 0.0], [-INV_SQRT2, 0.0, 0.0]]), atol=1e-5)
    assert torch.equal(adv, ret)
    raw, _ = ADVANTAGES["grpo"](inp, AlgoConfig(disable_rewards_normalization=True))
    assert torch.equal(raw, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    drgrpo, _ = ADVANTAGES["gspo"](inp, AlgoConfig(disable_grpo_std_normalization=True))
    assert torch.equal(drgrpo, torch.tensor([[0.5, 0.5, 0.0], [-0.5, 0.0, 0.0]]))


def test_rloo_leave_one_out():
    assert torch.allclose(leave_one_out(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4), torch.tensor([2, -2, -2, 2]) / 3.0)
    with pytest.raises(ValueError, match=">= 2"):
        leave_one_out(torch.tensor([1.0]), 1)


def test_reinforce_plus_plus_returns_and_whitening():
    inp = _inp([1.0, 0.0], [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], 1)
    adv, ret = ADVANTAGES["reinforce_plus_plus"](inp, AlgoConfig())
    assert torch.equal(ret, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    # masked returns [1, 1, 0, 0, 0]: mean .4, unbiased std sqrt(.3)
    a, b = 0.6 / 0.30 ** 0.5, -0.4 / 0.30 ** 0.5
    assert torch.allclose(adv, torch.tensor([[a, a, 0.0], [b, b, b]]), atol=1e-5)
    # KL in reward, k1 = [1, 0, 0] on row 0; last masked token is index 1 -> rewards [-.1, 1, 0]
    inp.log_probs, inp.ref_log_probs = torch.zeros(2, 3), torch.tensor([[-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    _, ret = ADVANTAGES["reinforce_plus_plus"](inp, AlgoConfig(kl_coef=0.1))
    assert torch.allclose(ret[0], torch.tensor([0.9, 1.0, 0.0]))


def test_reinforce_plus_plus_baseline():
    inp = _inp([1.0, 0.0, 0.0, 0.0], [[1.0]] * 4, 2)
    adv, raw = ADVANTAGES["reinforce_plus_plus_baseline"](inp, AlgoConfig())
    assert torch.equal(raw[:, 0], torch.tensor([0.5, -0.5, 0.0, 0.0]))
    # mean 0, unbiased var (0.25 + 0.25) / 3
    assert torch.allclose(adv[:, 0], torch.tensor([1.2247449, -1.2247449, 0.0, 0.0]), atol=1e-5)


def test_ppo_gae_with_kl_free_rewards_ends_at_last_masked_token():
    inp = _inp([1.0], [[1.0, 1.0, 0.0]], 1, values=torch.tensor([[0.5, 0.6, 9.0]]))
    adv, ret = ADVANTAGES["ppo"](inp, AlgoConfig())
    assert torch.allclose(adv, torch.tensor([[0.5, 0.4, 0.0]]))  # the 9.0 of padding is ignored
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 0.0]]))
    with pytest.raises(ValueError, match="values"):
        ADVANTAGES["ppo"](_inp([1.0], [[1.0]], 1), AlgoConfig())


def test_dcpo_decoupled_spans():
    meta = {
        "dcpo_confidence": torch.tensor([0.9, 0.8]),
        "dcpo_confidence_mask": torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]]),
    }
    inp = _inp([1.0, 0.0], [[1.0] * 4] * 2, 2, train_metadata=meta)
    # hybrid = [.75, .25]; cal = .5 * [(.75-.9)^2, (.25-.8)^2] = [.01125, .15125]
    # centred: acc [.5, -.5], cal [-.07, .07]; confidence tokens get -cal
    adv, _ = ADVANTAGES["dcpo"](inp, AlgoConfig(disable_grpo_std_normalization=True))
    expected = torch.tensor([[0.5, 0.5, 0.07, 0.07], [-0.5, -0.5, -0.5, -0.07]])
    assert torch.allclose(adv, expected, atol=1e-6)
    with pytest.raises(ValueError, match="dcpo_confidence"):
        ADVANTAGES["dcpo"](_inp([1.0, 0.0], [[1.0]] * 2, 2), AlgoConfig())


def test_every_estimator_has_the_uniform_signature():
    torch.manual_seed(2)
    b, t = 8, 6
    mask = torch.ones(b, t)
    mask[1, 3:] = 0
    mask[5, 1:] = 0
    inp = AdvantageInputs(
        rewards=torch.randint(0, 2, (b,)).float(),
        loss_mask=mask,
        n_samples_per_prompt=4,
        log_probs=-torch.rand(b, t),
        ref_log_probs=-torch.rand(b, t),
        values=torch.randn(b, t),
        train_metadata={"dcpo_confidence": torch.rand(b), "dcpo_confidence_mask": (torch.rand(b, t) > 0.7).float()},
    )
    assert ADVANTAGES.names() == [
        "cispo", "dcpo", "grpo", "gspo", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo",
    ]
    for name in ADVANTAGES:
        adv, ret = ADVANTAGES[name](inp, AlgoConfig(advantage_estimator=name, kl_coef=0.05))
        assert adv.shape == (b, t) and ret.shape == (b, t), name
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), name


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(KeyError, match="--advantage-estimator.*grpo"):
        ADVANTAGES["grpo2"]
