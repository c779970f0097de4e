"""A client ``Engine`` over running vLLM servers (``--rollout-engine vllm --rollout-external-engine-addrs``).

The servers are vLLM's OpenAI-compatible API server started on the same checkpoint as the trainer,
with the settings this client relies on::

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model DIR \\
        --logprobs-mode processed_logprobs --dtype float32 --enforce-eager --block-size 32 --port 8000

(``vllm serve`` on the official package; the CPU build's console script is broken, its module works.)

- ``generate``: one ``/v1/completions`` call per request with the prompt as token ids,
  ``logprobs=0`` (the sampled token's log-prob; under ``processed_logprobs`` that is
  log softmax(logits / T), as ``rlvr.engine.local.vllm`` measured) and vLLM's extensions
  ``return_token_ids`` (the response's ids), ``top_k``, ``stop_token_ids``, ``ignore_eos`` and
  ``request_id``. Each request goes to the server with the fewest outstanding, a session's turns to one.
- ``update_weights``: the tensors as one safetensors file in a folder under ``/dev/shm`` (shared
  memory: no disk write), then on every server ``/pause?mode=keep`` (requests in flight freeze),
  ``/collective_rpc`` ``reload_weights(weights_path=folder)`` (dev mode), ``/reset_prefix_cache``
  with ``reset_running_requests`` (no KV of the old weights is reused) and ``/resume``. The servers
  must see this machine's ``/dev/shm``. With ``transfer="nccl"`` (CUDA; ``--vllm-weight-transfer``)
  vLLM's RL weight-transfer routes carry them instead (``rlvr.engine.remote.vllm_nccl``, not yet run on a GPU).
- LoRA (``lora_rank``): the servers are started with ``--enable-lora --max-lora-rank R`` (``R`` from
  ``rlvr.engine.vllm_lora.max_lora_rank``) and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``; a push of adapter
  tensors writes a PEFT folder to the same shared memory and, between ``/pause`` and ``/resume``, loads
  it with ``/v1/load_lora_adapter`` (``load_inplace``, one fixed name), then resets the prefix cache;
  from then on every request names that adapter as its model.
- ``abort``: ``/abort_requests`` with vLLM's id of the request (``cmpl-<rid>-0``), or all.
- Weight versions: the completions route does not say which step sampled which token, so each
  token carries the version at the request's start; a request that straddled an update says so
  in ``meta["weight_version_end"]``.
- Seeds are not sent (see ``rlvr.engine.local.vllm``), nor top-p/top-k below their off values
  (the config refuses them with vLLM).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Iterable, Mapping

import aiohttp
import torch
from safetensors.torch import save_file

from rlvr.engine.remote.balance import Affinity
from rlvr.engine.base import FINISH_REASONS, Engine, GenerateRequest, GenerateResult
from rlvr.engine.remote.sglang_http import health, parse_addr
from rlvr.engine.vllm_lora import LORA_NAME, is_adapter, write_adapter
from rlvr.engine.remote.vllm_nccl import NcclWeightTransfer
from rlvr.engine.weights import named_items, with_tied_head

log = logging.getLogger(__name__)


def completion_payload(model: str, req: GenerateRequest, rid: str) -> dict:
    """The ``/v1/completions`` body of one request.

    >>> from rlvr.engine.base import SamplingParams
    >>> p = completion_payload("m", GenerateRequest([1, 2], SamplingParams(max_new_tokens=4)), "r1")
    >>> p["prompt"], p["max_tokens"], p["ignore_eos"], p["logprobs"], p["request_id"]
    ([1, 2], 4, True, 0, 'r1')
    """
    p = req.params
    return {"model": model, "prompt": list(req.prompt_ids), "max_tokens": p.max_new_tokens, "temperature": p.temperature,
            "top_p": p.top_p, "top_k": p.top_k, "stop_token_ids": list(p.stop_token_ids), "stop": list(p.stop) or None,
            "ignore_eos": not p.stop_token_ids, "logprobs": max(p.top_logprobs_num, 0), "return_token_ids": True,
            "return_tokens_as_token_ids": True, "skip_special_tokens": False, "request_id": rid}


def parse_completion(req: GenerateRequest, body: dict, version: int, version_end: int) -> GenerateResult:
    """A ``/v1/completions`` answer -> ``GenerateResult`` (module docstring)."""
    choice = body["choices"][0]
    tokens = [int(t) for t in choice.get("token_ids") or []]
    logprobs = choice.get("logprobs") or {}
    log_probs = [float(x) for x in logprobs.get("token_logprobs") or []]
    if len(log_probs) != len(tokens):
        raise ValueError(f"vLLM answered {len(tokens)} tokens but {len(log_probs)} log-probs")
    top_ids, top_lps = [], []
    if req.params.top_logprobs_num:
        for row in logprobs.get("top_logprobs") or []:
            head = sorted(row.items(), key=lambda kv: -kv[1])[: req.params.top_logprobs_num]
            top_ids.append([int(t.split(":", 1)[1]) for t, _ in head])
            top_lps.append([float(lp) for _, lp in head])
    reason = choice.get("finish_reason") or "length"
    meta = {"engine": "vllm-server", "weight_version_end": version_end}
    return GenerateResult(req.rid, tokens, log_probs, reason if reason in FINISH_REASONS else "error", version_end,
                          meta, [version] * len(tokens), top_token_ids=top_ids, top_log_probs=top_lps)


class VllmHttpEngine(Engine):
    def __init__(self, addrs: list[str], timeout: float = 600.0, weights_dir: str | None = None,
                 transfer: str = "reload", transfer_master: str = "127.0.0.1:0", lora_rank: int = 0,
                 lora_alpha: float | None = None, tied_head: bool = True):
        if not addrs:
            raise ValueError("VllmHttpEngine needs at least one host:port")
        self.urls = [parse_addr(a) for a in addrs]
        self.timeout = timeout
        self.outstanding = {u: 0 for u in self.urls}
        self.affinity = Affinity()
        shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
        self.weights_dir = Path(weights_dir or tempfile.mkdtemp(prefix="rlvr-vllm-weights-", dir=shm))
        self.models = {u: self._get(u, "/v1/models")["data"][0]["id"] for u in self.urls}
        self._version = 0
        self._abort_epoch = 0  # abort() of everything so far
        self._abort_rids: set[str] = set()
        self.tied_head = tied_head  # the checkpoint ties its head (rlvr.engine.weights)
        self.nccl = (NcclWeightTransfer(self.urls, transfer_master, timeout=timeout, tied_head=tied_head)
                     if transfer == "nccl" else None)
        self.lora_alpha = (lora_alpha or 2 * lora_rank) if lora_rank else None

    async def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        if not requests:
            return []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout),
                                         connector=aiohttp.TCPConnector(limit=0)) as session:
            epoch = self._abort_epoch
            return list(await asyncio.gather(*(self._one(session, r, epoch) for r in requests)))

    async def _one(self, session: aiohttp.ClientSession, req: GenerateRequest, epoch: int) -> GenerateResult:
        url = self.affinity.pick(req.session, self.urls, self.outstanding.__getitem__)
        rid, version = req.rid or uuid.uuid4().hex, self._version
        if rid in self._abort_rids or epoch != self._abort_epoch:
            self._abort_rids.discard(rid)
            return GenerateResult(req.rid, [], [], "abort", version, {"engine": "vllm-server"})
        self.outstanding[url] += 1
        try:
            async with session.post(url + "/v1/completions", json=completion_payload(self.models[url], req, rid)) as resp:
                if resp.status != 200:
                    return GenerateResult(req.rid, [], [], "error", version,
                                          {"error": f"{url}/v1/completions: HTTP {resp.status}: {await resp.text()}"})
                return parse_completion(req, await resp.json(), version, self._version)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            return GenerateResult(req.rid, [], [], "error", version, {"error": f"{url}: {e!r}"})
        finally:
            self.outstanding[url] -= 1
            self._abort_rids.discard(rid)

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        if self.nccl is not None:
            self.nccl.update_weights(named_tensors, version)
            self._version = version
            return
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in named_items(named_tensors)}
        if self.lora_alpha is not None and is_adapter(tensors):
            self._push_adapter(tensors, version)
            return
        tensors = with_tied_head(tensors, self.tied_head, copy=True)  # vLLM keeps a head of its own
        folder = self.weights_dir / f"v{version}"
        folder.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(folder / "model.safetensors"))
        self._apply(folder, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
                    version)

    def _push_adapter(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """The adapter into every server in place (module docstring); requests name it from now on."""
        folder = write_adapter(self.weights_dir / f"v{version}", tensors, self.lora_alpha)
        try:
            self._apply(folder, "/v1/load_lora_adapter", {"lora_name": LORA_NAME, "lora_path": str(folder),
                                                          "load_inplace": True}, version)
        except urllib.error.HTTPError as e:
            raise RuntimeError(
                f"{e.url}: HTTP {e.code} {e.read().decode(errors='replace')[:300]}; with --lora-rank the vLLM servers "
                "must run with --enable-lora --max-lora-rank R (R >= the adapter's rank) and "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 in their environment") from e
        self.models = {url: LORA_NAME for url in self.urls}

    def _apply(self, folder: Path, route: str, body: dict, version: int) -> None:
        """On every server: pause (requests in flight freeze), ``route`` with ``body``, no KV of the
        old weights kept, resume. Then ``folder`` is the only one kept in shared memory (it is RAM)."""
        for url in self.urls:
            self._post(url, "/pause?mode=keep", {})
            try:
                self._post(url, route, body)
                self._post(url, "/reset_prefix_cache?reset_running_requests=true", {})
            finally:
                self._post(url, "/resume", {})
        self._version = version
        for old in self.weights_dir.glob("v*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)

    def abort(self, rid: str | None = None) -> None:
        # A server drops an abort of an id it has not seen yet: a request aborted before it was sent
        # is not sent (``_one`` checks the epoch of its call and the aborted ids).
        if rid is None:
            self._abort_epoch += 1
        else:
            self._abort_rids.add(rid)
        body = {} if rid is None else {"request_ids": [f"cmpl-{rid}-0"]}
        for url in self.urls:
            try:
                self._post(url, "/abort_requests", body, timeout=5.0)
            except OSError as e:
                log.warning("%s/abort_requests failed: %r", url, e)

    def health(self) -> bool:
        return any(health(u, 5.0) for u in self.urls)

    def sleep(self) -> None:
        raise RuntimeError("vLLM servers keep their own memory; --colocate is refused with --rollout-engine vllm")

    def wake(self) -> None:
        self.sleep()

    def close(self) -> None:
        if self.nccl is not None:
            self.nccl.close()
        shutil.rmtree(self.weights_dir, ignore_errors=True)

    def _get(self, url: str, route: str) -> dict:
        with urllib.request.urlopen(url + route, timeout=30) as resp:
            return json.loads(resp.read().decode())

    def _post(self, url: str, route: str, payload: dict, timeout: float | None = None) -> dict:
        request = urllib.request.Request(url + route, data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout or self.timeout) as resp:
            text = resp.read().decode()
        return json.loads(text) if text.startswith("{") else {}
