"""TIS / ICE-POP / OPSM / custom TIS loader / score centering: hand-derived values."""

import sys
import types

import pytest
import torch

from rlvr.algo import AlgoConfig, apply_corrections, load_custom_tis_function, opsm_mask, tis_weights
from rlvr.algo import score_centering_loss
from rlvr.core.errors import ConfigError

P0 = torch.log(torch.tensor([[4.0, 1.0, 0.25, 0.5]]))  # rho = p0 / q with q = 1
Q = torch.zeros(1, 4)


def test_tis_clamps_and_icepop_zeroes():
    w, c = tis_weights(P0, Q, 0.0, 2.0, "tis")
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 0.25, 0.5]])) and c.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    w, c = tis_weights(P0, Q, 0.5, 2.0, "icepop")
    assert torch.allclose(w, torch.tensor([[0.0, 1.0, 0.0, 0.5]])) and c.tolist() == [[1.0, 0.0, 1.0, 0.0]]
    with pytest.raises(KeyError, match="icepop, tis"):
        tis_weights(P0, Q, 0.0, 2.0, "rs")


def test_opsm_drops_only_stale_negative_advantage_sequences():
    lp = torch.full((3, 2), -1.0)
    old = torch.tensor([[-0.9, -0.9], [-0.9, -0.9], [-1.0, -1.0]])  # seq kl .1, .1, 0
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]])
    keep, clipfrac = opsm_mask(lp, old, adv, torch.ones(3, 2), delta=1e-4)
    assert keep.tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
    assert torch.equal(clipfrac, 1 - keep)
    keep, _ = opsm_mask(lp, old, adv, torch.ones(3, 2), delta=0.5)  # .1 < .5: nothing dropped
    assert keep.sum() == 6


def test_apply_corrections_opsm_then_tis():
    pg = torch.ones(1, 4)
    cfg = AlgoConfig(use_tis=True)
    out, m = apply_corrections(pg, P0, P0, Q, torch.ones(1, 4), torch.ones(1, 4), cfg)
    assert torch.allclose(out, torch.tensor([[2.0, 1.0, 0.25, 0.5]]))
    assert set(m) == {"tis", "tis_abs", "tis_clipfrac"}
    assert torch.allclose(m["tis_abs"], torch.tensor([[3.0, 0.0, 0.75, 0.5]]))
    cfg = AlgoConfig(use_tis=True, use_opsm=True)
    old = P0 + 0.1  # seq kl .1 > 1e-4, advantages negative -> whole row dropped
    out, m = apply_corrections(pg, P0, old, Q, -torch.ones(1, 4), torch.ones(1, 4), cfg)
    assert out.sum() == 0 and m["opsm_clipfrac"].sum() == 4
    with pytest.raises(ValueError, match="rollout log-probs"):
        apply_corrections(pg, P0, P0, None, torch.ones(1, 4), torch.ones(1, 4), AlgoConfig(use_tis=True))


def test_custom_tis_function_is_loaded_and_applied(monkeypatch):
    mod = types.ModuleType("rlvr_test_tis_mod")

    def reject_first(pg_loss, train_log_probs, rollout_log_probs, loss_mask, cfg):
        mask = loss_mask.clone()
        mask[:, 0] = 0
        return pg_loss * 3.0, mask, {"rejected": 1 - mask}

    mod.reject_first = reject_first
    monkeypatch.setitem(sys.modules, "rlvr_test_tis_mod", mod)
    assert load_custom_tis_function("rlvr_test_tis_mod:reject_first") is reject_first
    assert load_custom_tis_function("rlvr_test_tis_mod.reject_first") is reject_first
    cfg = AlgoConfig(use_tis=True, custom_tis_function_path="rlvr_test_tis_mod:reject_first")
    out, m = apply_corrections(torch.ones(1, 3), Q[:, :3], Q[:, :3], Q[:, :3], torch.ones(1, 3), torch.ones(1, 3), cfg)
    assert out.tolist() == [[0.0, 3.0, 3.0]] and "rejected" in m


def test_custom_tis_loader_errors_name_the_flag():
    for path, match in [("nosuchmod_xyz:f", "cannot import"), ("math:nope", "has no 'nope'"), ("justaname", "not 'pkg")]:
        with pytest.raises(ConfigError, match=f"--custom-tis-function-path: .*{match}"):
            load_custom_tis_function(path)


def _sc_logit_grad(k, weight_fn):
    """d loss / d logits for a two-token example: p = (.6, .4), q = (.5, .5), token 0 sampled, A = 1."""
    z = torch.log(torch.tensor([0.6, 0.4])).requires_grad_()
    logp = torch.log_softmax(z, 0)
    logq = torch.log(torch.tensor([0.5, 0.5]))
    loss = score_centering_loss(
        logp[0].view(1, 1), logq[0].view(1, 1), logp[:k].view(1, 1, k), logq[:k].view(1, 1, k),
        torch.ones(1, 1), weight_fn,
    )
    (g,) = torch.autograd.grad(loss.sum(), z)
    return g


def test_score_centering_matches_the_seed_example():
    # s_0 = e_0 - p = (.4, -.4); mu = q - p = (-.1, .1); centred score (.5, -.5); loss grad = -(.5, -.5)
    expected = torch.tensor([-0.5, 0.5])
    assert torch.allclose(_sc_logit_grad(2, torch.ones_like), expected, atol=1e-5)  # full vocabulary
    # top-1 head: alpha = (1 - .5) / (1 - .6) = 1.25, c_0 = .5 - 1.25 * .6 = -.25 -> same mu (V = 2 is exact)
    assert torch.allclose(_sc_logit_grad(1, torch.ones_like), expected, atol=1e-5)
    # w = p / q (no clipping), full support: mu_w = sum p s = 0 -> grad = -w_0 s_0 = -1.2 (.4, -.4)
    assert torch.allclose(_sc_logit_grad(2, lambda r: r), torch.tensor([-0.48, 0.48]), atol=1e-5)
    # uncentred REINFORCE would give -(.4, -.4): the test distinguishes the two
    assert not torch.allclose(_sc_logit_grad(2, torch.ones_like), torch.tensor([-0.4, 0.4]), atol=1e-3)
