"""CUDA checks (``pytest -m gpu``; skipped without CUDA, run by ``scripts/gpu_check.py``). They
have not yet run on a GPU (README). Tolerances are stated per dtype:

* float32: packed vs each sample alone <= 1e-4 absolute in log-prob (CUDA SDPA kernels differ
  per slice shape at float32 rounding); gradient of one packed micro-batch vs padded <= 1e-5
  relative to its norm.
* bfloat16: packed vs alone mean |diff| <= 0.02 and max <= 0.25 nats (bf16 keeps 8 mantissa bits;
  per-token log-probs of a random tiny model move by ~1e-2 between kernels).
"""

from __future__ import annotations

import json

import pytest
import torch

from rlvr.models.tiny import build_tiny_model
from rlvr.train.logprobs import response_log_probs
from rlvr.train.trainer import load_policy
from rlvr.core.types import Sample
from tests.conftest import SMALL
from tests.support import packing_samples

pytestmark = pytest.mark.gpu

FP32_ABS, BF16_MEAN, BF16_MAX, GRAD_REL = 1e-4, 0.02, 0.25, 1e-5


def _samples(n=8, seed=0, group=4) -> list[Sample]:
    return packing_samples(n, seed, group, min_prompt=2)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("gpu_qwen2"), arch="qwen2", **SMALL))


@pytest.mark.parametrize("bf16", [False, True])
def test_packed_equals_each_sample_alone_on_cuda(ckpt, bf16):
    model = load_policy(ckpt, bf16=bf16, device="cuda")
    samples = _samples()
    width = max(s.response_length for s in samples)
    with torch.no_grad():
        packed = response_log_probs(model, samples, 0.8, width, False)[0]
        alone = torch.cat([response_log_probs(model, [s], 0.8, width, False)[0] for s in samples])
    assert packed.is_cuda and packed.abs().sum() > 0
    diff = (packed - alone).abs()
    if bf16:
        mask = torch.zeros_like(diff, dtype=torch.bool)
        for i, s in enumerate(samples):
            mask[i, : s.response_length] = True
        assert diff[mask].mean() <= BF16_MEAN and diff.max() <= BF16_MAX, (diff[mask].mean(), diff.max())
    else:
        assert diff.max() <= FP32_ABS, diff.max()


def test_packed_gradient_equals_padded_on_cuda(ckpt):
    model = load_policy(ckpt, bf16=False, device="cuda")
    samples = _samples(seed=2)
    width = max(s.response_length for s in samples)

    def grad(packed: bool) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        lp, ent = response_log_probs(model, samples, 0.9, width, True, chunk_size=5, packed=packed)
        (lp.sum() + 0.1 * ent.sum()).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    reference = grad(False)
    assert ((grad(True) - reference).abs().max() / reference.norm()) <= GRAD_REL


def test_trainer_and_engine_on_cuda_agree_in_float32(ckpt):
    """The engine's sampled log-probs and the trainer's recomputation of them, both on CUDA."""
    from transformers import AutoTokenizer

    from rlvr.algo import AlgoConfig
    from rlvr.config import TrainConfig
    from rlvr.engine.base import GenerateRequest, SamplingParams
    from rlvr.engine.local.embedded import EmbeddedEngine
    from rlvr.train.trainer import Trainer

    tok = AutoTokenizer.from_pretrained(ckpt)
    tr = Trainer(TrainConfig(hf_checkpoint=ckpt), AlgoConfig(), n_samples_per_prompt=4, device="cuda")
    engine = EmbeddedEngine(tr.model, pad_token_id=tok.pad_token_id, seed=0)
    assert engine.device.type == "cuda" and next(engine.model.parameters()).is_cuda
    try:
        prompt = tok("12+34=")["input_ids"]
        out = engine.generate_sync([GenerateRequest(prompt, SamplingParams(temperature=1.0, max_new_tokens=16,
                                                                           stop_token_ids=()), rid=str(i))
                                    for i in range(4)])
    finally:
        engine.close()
    samples = [Sample("", prompt, response_ids=r.token_ids, rollout_log_probs=r.log_probs) for r in out]
    width = max(s.response_length for s in samples)
    with torch.no_grad():
        lp = response_log_probs(tr.model, samples, 1.0, width, False)[0].cpu()
    for i, s in enumerate(samples):
        assert torch.allclose(lp[i, : s.response_length], torch.tensor(s.rollout_log_probs), atol=1e-3)


def test_local_loop_on_cuda_colocated(ckpt, arith_files, tmp_path):
    from rlvr.entrypoints.cli import main

    out = tmp_path / "run"
    argv = ["train", "--hf-checkpoint", ckpt, "--prompt-data", str(arith_files[0]), "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8", "--num-rollout", "2", "--lr", "1e-3",
            "--device", "cuda", "--bf16", "--colocate", "--offload-train", "--sglang-mem-fraction-static", "0.3",
            "--output-dir", str(out)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/step" in r]
    assert [r["rollout/step"] for r in steps] == [0, 1]
    assert all(r["perf/rollout_peak_memory_gb"] > 0 and r["perf/peak_memory_gb"] > 0 for r in steps)
