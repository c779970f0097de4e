"""KL estimators: hand-derived values, slime's clamp order, unknown names."""

import math

import pytest
import torch

from rlvr.algo import KL, compute_approx_kl

LP = torch.tensor([[0.0, -1.0]])
REF = torch.tensor([[-1.0, 0.0]])


def test_k1_k2_k3_values():
    # log p - log p_ref = [1, -1]
    assert torch.allclose(compute_approx_kl(LP, REF, "k1"), torch.tensor([[1.0, -1.0]]))
    assert torch.allclose(compute_approx_kl(LP, REF, "k2"), torch.tensor([[0.5, 0.5]]))
    # k3 with r = p_ref / p = [e^-1, e^1]: r - 1 - log r = [e^-1, e - 2]
    expected = torch.tensor([[0.36787944, 0.71828183]])
    assert torch.allclose(compute_approx_kl(LP, REF, "k3"), expected, atol=1e-6)
    assert torch.allclose(compute_approx_kl(LP, REF, "low_var_kl"), expected, atol=1e-6)


def test_only_low_var_kl_is_clamped():
    lp, ref = torch.tensor([[0.0]]), torch.tensor([[20.0]])  # k3 = e^20 - 21 ~ 4.85e8
    assert compute_approx_kl(lp, ref, "k3").item() > 4.8e8
    assert compute_approx_kl(lp, ref, "low_var_kl").item() == 10.0


def test_importance_ratio_multiplies_before_the_clamp():
    assert torch.allclose(
        compute_approx_kl(LP, REF, "k1", importance_ratio=torch.tensor([[2.0, 0.5]])),
        torch.tensor([[2.0, -0.5]]),
    )
    # (e^20 - 21) * 1e-9 = 0.48516517: the ratio is applied first, so nothing is clamped.
    kl = compute_approx_kl(torch.tensor([[0.0]]), torch.tensor([[20.0]]), "low_var_kl", torch.tensor([[1e-9]]))
    assert math.isclose(kl.item(), 0.48516517, rel_tol=1e-4)


def test_unknown_kl_type_lists_valid_names():
    with pytest.raises(KeyError, match="k1, k2, k3, low_var_kl"):
        compute_approx_kl(LP, REF, "k4")
    assert KL.names() == ["k1", "k2", "k3", "low_var_kl"]


def test_every_kl_entry_is_finite_and_zero_at_equal_policies():
    lp = torch.randn(3, 5)
    for name in KL:
        out = compute_approx_kl(lp, lp.clone(), name)
        assert out.shape == (3, 5) and torch.all(out == 0), name
        assert torch.isfinite(compute_approx_kl(lp, torch.randn(3, 5), name)).all(), name
