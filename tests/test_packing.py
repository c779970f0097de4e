"""Packing is exact: packed log-probs, entropies and gradients equal each sample run alone."""


import pytest
import torch

from rlvr.models.tiny import build_tiny_model
from rlvr.train import attention
from rlvr.train.logprobs import response_log_probs
from rlvr.train.trainer import load_policy
from rlvr.core.types import Sample
from tests.conftest import SMALL
from tests.support import packing_samples


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request, tmp_path_factory):
    return load_policy(str(build_tiny_model(tmp_path_factory.mktemp(request.param), arch=request.param, **SMALL)),
                       bf16=False)


@pytest.mark.parametrize("small_group", [512, 0])  # 0: every group takes the long-group path
@pytest.mark.parametrize("group", [1, 3])
def test_packed_equals_each_sample_alone_and_padded(model, group, small_group, monkeypatch):
    monkeypatch.setattr(attention, "SMALL_GROUP", small_group)
    samples = packing_samples(group=group)
    width = max(s.response_length for s in samples)
    with torch.no_grad():
        packed, ent_packed = response_log_probs(model, samples, 0.7, width, True, packed=True)
        padded, ent_padded = response_log_probs(model, samples, 0.7, width, True, packed=False)
        alone = torch.cat([response_log_probs(model, [s], 0.7, width, True)[0] for s in samples])
    assert packed.abs().sum() > 0
    assert (packed - alone).abs().max() <= 1e-5
    assert (packed - padded).abs().max() <= 1e-5
    assert (ent_packed - ent_padded).abs().max() <= 1e-5
    for i, s in enumerate(samples):  # nothing written past each response
        assert (packed[i, s.response_length:] == 0).all()


def test_attention_never_crosses_samples(model):
    """Replacing sample 0 leaves samples 1-2's log-probs as they were. Not bit for bit: the packed
    row is shorter with the new sample 0, which changes how the matmuls over the row are blocked,
    so the last bits of the other samples' values may move (measured: up to ~1e-7). Attention
    reaching across samples would move them by far more than the 1e-6 allowed: sample 0's own
    values, which do see the change, move by > 1e-2."""
    samples = packing_samples(3, seed=1)
    width = max(s.response_length for s in samples)
    changed = [Sample("", [7] * 5, response_ids=[9] * 4)] + samples[1:]
    with torch.no_grad():
        a = response_log_probs(model, samples, 1.0, width, False)[0]
        b = response_log_probs(model, changed, 1.0, width, False)[0]
    assert (a[0] - b[0]).abs().max() > 1e-2
    assert (a[1:] - b[1:]).abs().max() <= 1e-6


@pytest.mark.parametrize("small_group", [512, 0])
def test_responses_sharing_a_prompt_never_see_each_other(model, small_group, monkeypatch):
    monkeypatch.setattr(attention, "SMALL_GROUP", small_group)
    samples = packing_samples(4, seed=3, group=4)
    width = max(s.response_length for s in samples)
    first = samples[0]
    changed = [Sample("", first.prompt_ids, response_ids=[(t + 1) % 256 for t in first.response_ids])] + samples[1:]
    with torch.no_grad():
        a = response_log_probs(model, samples, 1.0, width, False)[0]
        b = response_log_probs(model, changed, 1.0, width, False)[0]
    assert (a[0] - b[0]).abs().max() > 1e-3  # the change is visible where it should be
    assert (a[1:] - b[1:]).abs().max() <= 1e-6  # and nowhere else


@pytest.mark.parametrize("small_group", [512, 0])
def test_packed_shared_prompt_and_chunked_gradients_equal_padded(model, small_group, monkeypatch):
    monkeypatch.setattr(attention, "SMALL_GROUP", small_group)
    samples = packing_samples(8, seed=2, group=4)
    width = max(s.response_length for s in samples)

    def grad(packed, chunk, share=True):
        model.zero_grad(set_to_none=True)
        lp, ent = response_log_probs(model, samples, 0.9, width, True, chunk_size=chunk, packed=packed,
                                     share_prompts=share)
        (lp.sum() + 0.1 * ent.sum()).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    reference = grad(False, 1 << 30)
    for packed, chunk, share in ((True, 1 << 30, True), (True, 3, True), (True, 1 << 30, False)):
        g = grad(packed, chunk, share)
        assert (g - reference).abs().max() / reference.norm() <= 1e-6


def test_log_probs_refuse_a_model_without_the_packed_attention(tiny_qwen2):
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tiny_qwen2, attn_implementation="sdpa").eval()
    s = Sample("p", [1, 2, 3], response_ids=[4, 5], loss_mask=[1, 1])
    with pytest.raises(ValueError, match="attn_implementation='rlvr_varlen'"):
        response_log_probs(plain, [s], 1.0, 2, False)
