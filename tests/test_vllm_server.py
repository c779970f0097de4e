"""``VllmHttpEngine`` against a real vLLM server (the CPU build's OpenAI API server on 127.0.0.1,
dev mode, LoRA enabled) on SmolLM2: token ids and log-probs out, a weight push through
``/collective_rpc`` ``reload_weights`` from shared memory, a LoRA adapter through
``/v1/load_lora_adapter``, abort.

``make test`` runs this file in .venv-vllm (``make vllm``); elsewhere it skips where vLLM is not
installed. Cost: one server start (~50 s multi-process) and a few requests.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from rlvr.engine.base import GenerateRequest, SamplingParams
from tests.support import chat_prompt_ids, hf_log_probs, lora_policy, randomize_adapters, vllm_server

pytest.importorskip("vllm", reason="vLLM is not installed in this environment; `make vllm` builds .venv-vllm and "
                                   "`make test` runs tests/test_vllm*.py there")
SMOLLM2 = Path(__file__).resolve().parents[1] / "models" / "smollm2-135m-instruct"
pytestmark = [pytest.mark.real, pytest.mark.slow,
              pytest.mark.skipif(not (SMOLLM2 / "config.json").exists(), reason="needs SmolLM2 (make smollm2)")]
EOS = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with vllm_server(SMOLLM2, tmp_path_factory.mktemp("vllm") / "server.log") as addr:
        yield addr


@pytest.fixture(scope="module")
def engine(server):
    from rlvr.engine.remote.vllm_http import VllmHttpEngine

    eng = VllmHttpEngine([server], timeout=300)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompt():
    return chat_prompt_ids(SMOLLM2)


def test_server_samples_match_transformers_before_and_after_a_weight_push(engine, prompt):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32).eval()
    params = SamplingParams(temperature=0.8, max_new_tokens=20, stop_token_ids=(EOS,))
    results = asyncio.run(engine.generate([GenerateRequest(list(prompt), params, rid=f"a{i}") for i in range(3)]))
    for r in results:
        assert r.finish_reason in ("stop", "length") and r.token_ids and len(r.log_probs) == len(r.token_ids)
        assert (torch.tensor(r.log_probs) - hf_log_probs(model, prompt, r.token_ids, 0.8)).abs().mean() < 1e-4
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-3 * p.abs().mean())
    engine.update_weights(model.named_parameters(), version=1)
    assert sorted(p.name for p in engine.weights_dir.iterdir()) == ["v1"]  # in shared memory, the newest only
    (r,) = asyncio.run(engine.generate([GenerateRequest(list(prompt), SamplingParams(temperature=1.0, max_new_tokens=20))]))
    assert r.weight_version == 1 and r.weight_versions == [1] * len(r.token_ids)
    assert (torch.tensor(r.log_probs) - hf_log_probs(model, prompt, r.token_ids, 1.0)).abs().mean() < 1e-4


def running(url: str) -> float:
    """Requests the server is decoding now (its Prometheus gauge)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:num_requests_running"))


def test_abort_ends_the_request_with_reason_abort(engine, prompt):
    box = []
    req = GenerateRequest(list(prompt), SamplingParams(temperature=1.0, max_new_tokens=3000), rid="long")
    worker = threading.Thread(target=lambda: box.append(asyncio.run(engine.generate([req]))))
    worker.start()
    deadline = time.monotonic() + 60  # until the server runs it (an abort of an id it has not seen is a no-op)
    while running(engine.urls[0]) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    engine.abort("long")
    worker.join(timeout=120)
    (r,) = box[0]
    assert r.finish_reason == "abort" and len(r.token_ids) < 3000, (r.finish_reason, len(r.token_ids), r.meta)


def test_lora_adapter_push_is_served_through_the_lora_route(server, prompt):
    """A client with ``lora_rank`` sends full weights through the reload route and the trainer's
    adapter tensors through vLLM's LoRA route; the server's log-probs follow the PEFT model's."""
    from rlvr.engine.remote.vllm_http import VllmHttpEngine
    from rlvr.engine.vllm_lora import LORA_NAME
    from rlvr.train import lora

    model = lora_policy(SMOLLM2, rank=8)
    eng = VllmHttpEngine([server], timeout=300, lora_rank=8)
    try:
        eng.update_weights(lora.merged_weights(model), version=10)  # the checkpoint's base again (B = 0)
        randomize_adapters(model, torch.Generator().manual_seed(1))
        eng.update_weights(lora.adapter_weights(model), version=11)
        assert set(eng.models.values()) == {LORA_NAME} and [p.name for p in eng.weights_dir.iterdir()] == ["v11"]
        (r,) = asyncio.run(eng.generate([GenerateRequest(list(prompt), SamplingParams(temperature=1.0, max_new_tokens=20))]))
        assert r.finish_reason in ("stop", "length") and r.weight_versions == [11] * len(r.token_ids)
        gap = (torch.tensor(r.log_probs) - hf_log_probs(model, prompt, r.token_ids, 1.0)).abs()
        assert gap.mean() < 1e-4 and gap.max() < 1e-3, (gap.mean(), gap.max())
    finally:
        eng.close()
