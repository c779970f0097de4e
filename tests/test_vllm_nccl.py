"""The CUDA weight route to vLLM servers (``rlvr.engine.vllm_nccl``) up to the NCCL transfer: the
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

from rlvr.core.errors import ConfigError
from rlvr.engine.vllm_nccl import NcclWeightTransfer, choose_weight_transfer, update_info, with_tied_head

pytest.importorskip("vllm", reason="vLLM is not installed in this environment; `make vllm` builds .venv-vllm and "
                                   "`make test` runs tests/test_vllm*.py there")


class Recorder:
    """A real aiohttp server on 127.0.0.1 that answers every POST and keeps (path with query, JSON body)."""

    def __init__(self):
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
