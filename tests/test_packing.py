"""Packing is exact: packed log-probs, entropies and gradients equal each sample run alone."""

import random

import pytest
import torch

from rlvr.models.tiny import build_tiny_model
from rlvr.train.packing import response_log_probs
from rlvr.train.trainer import load_policy
from rlvr.types import Sample
from tests.conftest import SMALL


def _samples(n=6, seed=0):
    rng = random.Random(seed)
    return [Sample("", [rng.randrange(256) for _ in range(rng.randint(1, 9))],
                   response_ids=[rng.randrange(256) for _ in range(rng.randint(1, 12))]) for _ in range(n)]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request, tmp_path_factory):
    return load_policy(str(build_tiny_model(tmp_path_factory.mktemp(request.param), arch=request.param, **SMALL)),
                       bf16=False)


def test_packed_equals_each_sample_alone_and_padded(model):
    samples = _samples()
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
    samples = _samples(3, seed=1)
    width = max(s.response_length for s in samples)
    changed = [Sample("", [7] * 5, response_ids=[9] * 4)] + samples[1:]
    with torch.no_grad():
        a = response_log_probs(model, samples, 1.0, width, False)[0]
        b = response_log_probs(model, changed, 1.0, width, False)[0]
    assert torch.equal(a[1:], b[1:])  # bit-identical: the first sample cannot be seen


def test_packed_and_chunked_gradients_equal_padded(model):
    samples = _samples(5, seed=2)
    width = max(s.response_length for s in samples)

    def grad(packed, chunk):
        model.zero_grad(set_to_none=True)
        lp, ent = response_log_probs(model, samples, 0.9, width, True, chunk_size=chunk, packed=packed)
        (lp.sum() + 0.1 * ent.sum()).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    reference = grad(False, 1 << 30)
    for packed, chunk in ((True, 1 << 30), (True, 3)):
        g = grad(packed, chunk)
        assert (g - reference).abs().max() / reference.norm() <= 1e-6
