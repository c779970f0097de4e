"""Weights to vLLM servers on CUDA over vLLM's RL weight-transfer routes (NCCL broadcast).

NOT RUN ON A GPU YET: this follows vLLM 0.32's routes and its trainer-side helpers as read from its
source (``vllm/entrypoints/rl/online/api_router.py``, ``vllm/distributed/weight_transfer/``), and
the CPU tests check every request it sends, but the broadcast itself has never run here (it needs
CUDA and NCCL on both sides).

The servers are started with ``--weight-transfer-config '{"backend": "nccl"}'``. The trainer is
rank 0 of one NCCL group; the workers of server ``i`` take ranks ``1 + i * workers_per_server``
onwards (``rank_offset``; a worker adds its own rank within its server).

- ``connect``: ``/init_weight_transfer_engine`` on every server (``init_info`` as vLLM's
  ``NCCLWeightTransferInitInfo``, unpacked broadcasts), in threads, because each server blocks in
  the rendezvous while the trainer joins it with vLLM's ``trainer_init`` (a ``StatelessProcessGroup``
  on ``master_address:master_port``, whose TCP store the trainer hosts).
- ``update_weights``: per server ``/pause?mode=keep`` and ``/start_weight_update``; then
  ``/update_weights`` with ``{"update_info": {"names", "dtype_names", "shapes"}}`` on every server
  in threads while the trainer broadcasts the tensors in that order from rank 0; then per server
  ``/finish_weight_update`` (``weight_version``), ``/reset_prefix_cache`` and ``/resume``.
- A tied head (``model.embed_tokens.weight`` sent without ``lm_head.weight``) gets an
  ``lm_head.weight`` entry, the one rule of every vLLM route (``rlvr.engine.weights``); on CUDA
  vLLM's ``AutoWeightsLoader`` skips a tied model's second name for the shared parameter, so there
  it is a broadcast that is not loaded.
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

import torch

from rlvr.core.errors import ConfigError
from rlvr.core.net import free_port
from rlvr.engine.weights import with_tied_head

ROUTES = ("reload", "nccl")


def choose_weight_transfer(requested: str, cuda: bool) -> str:
    """``--vllm-weight-transfer``: ``auto`` is ``nccl`` with CUDA and ``reload`` without."""
    if requested == "auto":
        return "nccl" if cuda else "reload"
    if requested == "nccl" and not cuda:
        raise ConfigError("--vllm-weight-transfer", "nccl: vLLM's NCCL weight-transfer route needs CUDA on the trainer "
                          "(torch.cuda.is_available() is False here); use reload (or auto)")
    if requested not in ROUTES:
        raise ConfigError("--vllm-weight-transfer", f"{requested!r}: choose auto, reload or nccl")
    return requested


def update_info(tensors: Mapping[str, torch.Tensor]) -> dict:
    """The ``/update_weights`` body: names, dtype names (``float32``) and shapes, in broadcast order."""
    return {"update_info": {"names": list(tensors),
                            "dtype_names": [str(t.dtype).removeprefix("torch.") for t in tensors.values()],
                            "shapes": [list(t.shape) for t in tensors.values()]}}


class NcclWeightTransfer:
    """The trainer side of vLLM's NCCL weight transfer to the servers at ``urls`` (``http://host:port``)."""

    def __init__(self, urls: list[str], master: str = "127.0.0.1:0", workers_per_server: int = 1,
                 timeout: float = 600.0, tied_head: bool = True):
        host, _, port = master.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError("--vllm-weight-transfer-master", f"{master!r}: expected host:port (port 0 picks a free one)")
        self.urls = list(urls)
        self.master_address, self.master_port = host, int(port) or free_port(host)
        self.workers_per_server = workers_per_server
        self.world_size = 1 + len(self.urls) * workers_per_server
        self.timeout = timeout
        self.tied_head = tied_head  # the checkpoint ties its head (rlvr.engine.weights)
        self.group = None  # vLLM's PyNcclCommunicator, after connect()

    def init_bodies(self) -> list[dict]:
        """The ``/init_weight_transfer_engine`` body of each server, built with vLLM's own init info."""
        from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload

        return [{"init_info": worker_init_payload(NCCLWeightTransferInitInfo(
                    master_address=self.master_address, master_port=self.master_port,
                    rank_offset=1 + i * self.workers_per_server, world_size=self.world_size, packed=False))}
                for i in range(len(self.urls))]

    def connect(self) -> None:
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        if not torch.cuda.is_available():
            choose_weight_transfer("nccl", cuda=False)  # raises the message naming the flag
        bodies = self.init_bodies()
        pool = ThreadPoolExecutor(max_workers=len(self.urls))
        try:  # each server blocks in its init route until the trainer has joined the rendezvous
            futures = [pool.submit(self.post, u, "/init_weight_transfer_engine", b) for u, b in zip(self.urls, bodies)]
            self.group = trainer_init({"master_address": self.master_address, "master_port": self.master_port,
                                       "world_size": self.world_size}, rank=0)
            for f in futures:
                f.result()
        finally:  # a failed join leaves the servers waiting: joining their threads would hang
            pool.shutdown(wait=False)

    def begin(self) -> None:
        for url in self.urls:
            self.post(url, "/pause?mode=keep", {})
            self.post(url, "/start_weight_update", {})

    def finish(self, version: int) -> None:
        for url in self.urls:
            try:
                self.post(url, "/finish_weight_update", {"weight_version": str(version)})
                self.post(url, "/reset_prefix_cache?reset_running_requests=true", {})
            finally:
                self.post(url, "/resume", {})

    def update_weights(self, named_tensors, version: int) -> None:
        if self.group is None:
            self.connect()
        tensors = with_tied_head(named_tensors, self.tied_head)
        body = update_info(tensors)
        self.begin()
        pool = ThreadPoolExecutor(max_workers=len(self.urls))
        try:  # the servers receive inside /update_weights while rank 0 broadcasts: both at once
            futures = [pool.submit(self.post, u, "/update_weights", body) for u in self.urls]
            stream = torch.cuda.current_stream()
            for t in tensors.values():
                self.group.broadcast(t.detach().to("cuda").contiguous(), src=0, stream=stream)
            stream.synchronize()
            for f in futures:
                f.result()
        finally:  # a failed broadcast leaves the servers blocked in NCCL: joining would hang
            pool.shutdown(wait=False)
        self.finish(version)

    def close(self) -> None:
        if self.group is not None:
            for url in self.urls:
                self.post(url, "/shutdown_weight_transfer_engine", {})
            self.group.destroy()
            self.group = None

    def post(self, url: str, route: str, payload: dict) -> dict:
        request = urllib.request.Request(url + route, data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            text = resp.read().decode()
        return json.loads(text) if text.startswith("{") else {}
