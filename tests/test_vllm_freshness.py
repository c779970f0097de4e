"""The policy-freshness guard (rlvr.runtime.freshness) on vLLM's engines, syncs broken on purpose:
in process, a LoRA adapter that is never loaded; against a real vLLM server, a reload route that
skips the tensors (a proxy on 127.0.0.1 that answers ``/collective_rpc`` without passing it on).
Both runs stop at the first push, naming the engine and its route; the healthy runs of
tests/test_vllm_grpo.py and tests/test_vllm_server.py carry the guard too (on by default).

``make test`` runs this file in .venv-vllm (``make vllm``); elsewhere it skips where vLLM is not
installed. Cost: one server start (~50 s) and two short runs on SmolLM2.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this environment; `make vllm` builds .venv-vllm and "
                                   "`make test` runs tests/test_vllm*.py there")
from rlvr.runtime.configure import parse_config  # noqa: E402
from rlvr.runtime.freshness import PolicyStale  # noqa: E402
from rlvr.runtime.loop import run  # noqa: E402
from tests.support import free_port, vllm_server  # noqa: E402

SMOLLM2 = Path(__file__).resolve().parents[1] / "models" / "smollm2-135m-instruct"
pytestmark = [pytest.mark.real, pytest.mark.slow,
              pytest.mark.skipif(not (SMOLLM2 / "config.json").exists(), reason="needs SmolLM2 (make smollm2)")]


def _args(tmp_path: Path, *extra) -> list[str]:
    from rlvr.data.arith import write_jsonl

    rows = [{"prompt": f"What is {a} + {b}?", "label": str(a + b)} for a in range(2, 9) for b in range(1, 5)]
    return ["--hf-checkpoint", str(SMOLLM2), "--prompt-data", str(write_jsonl(rows, tmp_path / "train.jsonl")),
            "--apply-chat-template", "--rm-type", "math", "--rollout-engine", "vllm", "--vllm-kv-cache-gb", "0.5",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8",
            "--num-rollout", "2", "--lr", "1e-4", "--entropy-coef", "0.01", "--output-dir", str(tmp_path / "run"),
            *extra]


def test_an_adapter_that_is_not_loaded_stops_the_run(tmp_path, monkeypatch):
    """vLLM in process with --lora-rank: the adapter push advances the version and loads nothing."""
    from rlvr.engine.local.vllm import VllmEngine

    def not_loaded(self, version, folder):
        self._version = version

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setattr(VllmEngine, "_load_adapter", not_loaded)
    with pytest.raises(PolicyStale) as e:
        run(parse_config(_args(tmp_path, "--lora-rank", "8", "--lora-alpha", "16")), console=False)
    assert str(e.value).startswith("weight push 1 to the vllm engine (vLLM's LLMEngine in this process; weights by "
                                   "reload, LoRA adapters by adapter): ")
    assert "the push changed nothing" in str(e.value)


def _swallowing_proxy(upstream: str, port: int, ready: threading.Event, stop: list):
    """An HTTP proxy to ``upstream`` that answers POST /collective_rpc (vLLM's reload route) with 200
    and passes on nothing: weights pushed through it never reach the server."""
    from aiohttp import ClientSession, web

    async def handle(request: web.Request) -> web.Response:
        if request.path == "/collective_rpc":
            return web.json_response({"results": [None]})
        async with ClientSession() as s, s.request(request.method, f"http://{upstream}{request.path_qs}",
                                                   data=await request.read(), headers={"Content-Type": "application/json"}) as r:
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

    async def serve():
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        done = asyncio.Event()
        stop.append((asyncio.get_running_loop(), done))
        ready.set()
        await done.wait()
        await runner.cleanup()

    asyncio.run(serve())


def test_a_reload_route_that_skips_the_tensors_stops_the_run(tmp_path):
    with vllm_server(SMOLLM2, tmp_path / "server.log") as upstream:
        port, ready, stop = free_port(), threading.Event(), []
        proxy = threading.Thread(target=_swallowing_proxy, args=(upstream, port, ready, stop), daemon=True)
        proxy.start()
        assert ready.wait(30)
        try:
            with pytest.raises(PolicyStale) as e:
                run(parse_config(_args(tmp_path, "--rollout-external-engine-addrs", f"127.0.0.1:{port}")), console=False)
        finally:
            loop, done = stop[0]
            loop.call_soon_threadsafe(done.set)
            proxy.join(30)
    assert str(e.value).startswith("weight push 1 to the vllm_servers engine (vLLM's OpenAI servers; weights by "
                                   "transfer): ")
    # a full-weight step moves the policy far enough for the gap check, else the change check names it
    assert "the push changed nothing" in str(e.value) or "differ from the trainer's by" in str(e.value)
