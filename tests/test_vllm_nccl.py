"""The CUDA weight route to vLLM servers (``rlvr.engine.remote.vllm_nccl``) up to the NCCL transfer: the
route choice, the bodies of vLLM's RL weight-transfer routes checked by vLLM's own dataclasses, the
order of the calls (against a real HTTP server on 127.0.0.1 that records them), the tied-head rule,
and the refusal without CUDA. The broadcast itself is the ``gpu`` test at the end: not yet run.

Runs in .venv-vllm (``make test``); skips where vLLM is not installed. Cost: about a second.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch
from aiohttp import web

from rlvr.config.engine import EngineConfig
from rlvr.core.errors import ConfigError
from rlvr.engine.remote.vllm_nccl import NcclWeightTransfer, choose_weight_transfer, update_info, with_tied_head

pytest.importorskip("vllm", reason="vLLM is not installed in this environment; `make vllm` builds .venv-vllm and "
                                   "`make test` runs tests/test_vllm*.py there")


class Recorder:
    """A real aiohttp server on 127.0.0.1 that answers every POST and keeps (path with query, JSON body)."""

    def __init__(self, missing: tuple[str, ...] = ()):
        self.missing = missing  # routes answered 404, as a server that does not serve them
        self.calls: list[tuple[str, dict]] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        assert self.ready.wait(10), "recording server did not start"

    def _serve(self):
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self.ready.set()
        self.loop.run_forever()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.calls.append((request.path_qs, json.loads(body) if body else {}))
        if request.path in self.missing:
            return web.Response(status=404, text='{"detail":"Not Found"}')
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "smollm2"}]})
        return web.json_response({"message": "ok"})

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def servers():
    pair = [Recorder(), Recorder()]
    yield pair
    for s in pair:
        s.close()


def tiny_tied_model() -> dict[str, torch.Tensor]:
    return {"model.embed_tokens.weight": torch.randn(8, 4), "model.layers.0.mlp.up_proj.weight": torch.randn(6, 4),
            "model.norm.weight": torch.ones(4, dtype=torch.bfloat16)}


def test_nccl_is_chosen_only_with_cuda_and_refused_without_it():
    assert choose_weight_transfer("auto", cuda=False) == "reload"
    assert choose_weight_transfer("auto", cuda=True) == "nccl"
    assert choose_weight_transfer("reload", cuda=True) == "reload"
    assert choose_weight_transfer("nccl", cuda=True) == "nccl"
    with pytest.raises(ConfigError, match=r"--vllm-weight-transfer: nccl: .*needs CUDA.*use reload"):
        choose_weight_transfer("nccl", cuda=False)
    with pytest.raises(ConfigError, match="choose auto, reload or nccl"):
        choose_weight_transfer("gloo", cuda=True)
    with pytest.raises(ConfigError, match="--vllm-weight-transfer: nccl pushes weights to vLLM servers"):
        EngineConfig(rollout_engine="vllm", vllm_weight_transfer="nccl").validate()
    EngineConfig(rollout_engine="vllm", vllm_weight_transfer="nccl", rollout_external_engine_addrs=["h:1"]).validate()
    with pytest.raises(ConfigError, match="--vllm-weight-transfer-master"):
        NcclWeightTransfer(["http://127.0.0.1:1"], master="localhost")


def test_init_bodies_are_what_vllms_nccl_worker_accepts():
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo

    t = NcclWeightTransfer(["http://a:1", "http://b:2"], master="10.0.0.5:29555", workers_per_server=2)
    bodies = t.init_bodies()
    assert [b["init_info"]["rank_offset"] for b in bodies] == [1, 3]  # trainer rank 0, then 2 workers per server
    for b in bodies:
        assert set(b) == {"init_info"} and "nccl_unique_id_b64" not in b["init_info"]  # TCP store rendezvous
        info = NCCLWeightTransferInitInfo(**b["init_info"])  # what the worker builds from the route's body
        assert (info.master_address, info.master_port, info.world_size, info.packed) == ("10.0.0.5", 29555, 5, False)
    assert 0 < NcclWeightTransfer(["http://a:1"]).master_port < 65536  # port 0: a free one


def test_update_body_names_dtypes_shapes_in_order_with_the_tied_head():
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    model = tiny_tied_model()
    tensors = with_tied_head(model)
    assert list(tensors) == [*model, "lm_head.weight"] and tensors["lm_head.weight"] is model["model.embed_tokens.weight"]
    body = update_info(tensors)
    assert body == {"update_info": {
        "names": ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight", "lm_head.weight"],
        "dtype_names": ["float32", "float32", "bfloat16", "float32"], "shapes": [[8, 4], [6, 4], [4], [8, 4]]}}
    info = NCCLWeightTransferUpdateInfo(**json.loads(json.dumps(body))["update_info"])  # over JSON, as the route gets it
    assert [getattr(torch, d) for d in info.dtype_names] == [t.dtype for t in tensors.values()]  # the worker's parse
    untied = {**model, "lm_head.weight": torch.zeros(8, 4)}
    assert with_tied_head(list(untied.items()))["lm_head.weight"] is untied["lm_head.weight"]  # sent as is


def test_the_routes_of_one_update_in_order_on_every_server(servers):
    t = NcclWeightTransfer([s.url for s in servers])
    t.begin()
    body = update_info(with_tied_head(tiny_tied_model()))
    for s in servers:  # the call update_weights makes beside the broadcast
        t.post(s.url, "/update_weights", body)
    t.finish(7)
    for s in servers:
        assert [path for path, _ in s.calls] == ["/pause?mode=keep", "/start_weight_update", "/update_weights",
                                                 "/finish_weight_update", "/reset_prefix_cache?reset_running_requests=true",
                                                 "/resume"]
        assert s.calls[2][1] == body and s.calls[3][1] == {"weight_version": "7"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_an_nccl_update_without_cuda_fails_before_any_request(servers):
    t = NcclWeightTransfer([s.url for s in servers])
    with pytest.raises(ConfigError, match="needs CUDA"):
        t.update_weights(tiny_tied_model(), version=1)
    assert all(s.calls == [] for s in servers)


def test_the_server_client_takes_the_chosen_route(servers, tmp_path):
    from rlvr.engine.remote.vllm_http import VllmHttpEngine

    addrs = [s.url.removeprefix("http://") for s in servers]
    reload = VllmHttpEngine(addrs, weights_dir=str(tmp_path), transfer=choose_weight_transfer("auto", cuda=False))
    assert reload.nccl is None
    reload.update_weights(tiny_tied_model(), version=1)
    assert ("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "v1")}}) in servers[0].calls
    nccl = VllmHttpEngine(addrs, weights_dir=str(tmp_path), transfer="nccl")
    assert nccl.nccl.urls == [s.url for s in servers] and nccl.nccl.world_size == 3
    if not torch.cuda.is_available():
        before = [len(s.calls) for s in servers]
        with pytest.raises(ConfigError, match="needs CUDA"):
            nccl.update_weights(tiny_tied_model(), version=2)
        assert [len(s.calls) for s in servers] == before and nccl.weight_version == 0


@pytest.mark.gpu
@pytest.mark.slow
def test_weights_reach_a_cuda_vllm_server_over_nccl(tmp_path):
    """Never run yet (no GPU here): a vLLM server on SmolLM2 with the NCCL backend takes perturbed
    weights from this process and then samples with their log-probs. NCCL takes one rank per GPU:
    the server on GPU 1, this process on GPU 0."""
    import os
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.engine.base import GenerateRequest, SamplingParams
    from rlvr.engine.remote.sglang_http import health
    from rlvr.engine.remote.vllm_http import VllmHttpEngine

    smollm2 = Path(__file__).resolve().parents[1] / "models" / "smollm2-135m-instruct"
    if not (smollm2 / "config.json").exists():
        pytest.skip("needs SmolLM2 (make smollm2)")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: NCCL does not put the trainer and the server's worker on one device")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--enforce-eager", "--logprobs-mode", "processed_logprobs",
           "--gpu-memory-utilization", "0.3", "--weight-transfer-config", '{"backend": "nccl"}']
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_SERVER_DEV_MODE": "1",
                                                                                "CUDA_VISIBLE_DEVICES": "1"})
    try:
        deadline = time.monotonic() + 600
        while not health(f"http://127.0.0.1:{port}", 2.0):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.5)
        engine = VllmHttpEngine([f"127.0.0.1:{port}"], transfer="nccl")
        torch.cuda.set_device(0)
        model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).cuda().eval()
        g = torch.Generator(device="cuda").manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g, device="cuda") * 1e-2 * p.abs().mean())
        engine.update_weights(model.named_parameters(), version=1)
        prompt = AutoTokenizer.from_pretrained(smollm2)("What is 12 + 30? Answer briefly.")["input_ids"]
        (r,) = asyncio.run(engine.generate([GenerateRequest(prompt, SamplingParams(temperature=1.0, max_new_tokens=16))]))
        assert r.weight_version == 1 and r.token_ids
        with torch.no_grad():
            logits = model(torch.tensor([prompt + r.token_ids], device="cuda")).logits[0, len(prompt) - 1:-1].float()
        ours = logits.log_softmax(-1).gather(-1, torch.tensor(r.token_ids, device="cuda")[:, None])[:, 0].cpu()
        assert (torch.tensor(r.log_probs) - ours).abs().mean() < 1e-3
        engine.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_an_adapter_push_to_servers_without_runtime_lora_says_how_to_start_them(tmp_path):
    """vLLM registers /v1/load_lora_adapter only with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1: without it the
    first adapter push (at version 0, at start-up) fails naming the flags the servers need."""
    from rlvr.engine.remote.vllm_http import VllmHttpEngine

    server = Recorder(missing=("/v1/load_lora_adapter",))
    try:
        eng = VllmHttpEngine([server.url.removeprefix("http://")], weights_dir=str(tmp_path), lora_rank=4)
        adapter = {"model.layers.0.self_attn.q_proj.lora_A.default.weight": torch.zeros(4, 8),
                   "model.layers.0.self_attn.q_proj.lora_B.default.weight": torch.zeros(8, 4)}
        with pytest.raises(RuntimeError, match="--enable-lora --max-lora-rank R .*VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"):
            eng.update_weights(adapter, version=0)
        assert [p for p, _ in server.calls][-1] == "/resume"  # the server is not left paused
        assert eng.models[server.url] == "smollm2"  # requests still name the base model
    finally:
        server.close()
