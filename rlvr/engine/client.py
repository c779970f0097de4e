"""A client ``Engine`` over SGLang's HTTP protocol (``rlvr serve`` or a real SGLang server).

``HttpEngine(["host:port", ...])`` sends each request to ``/generate`` on the address with the
fewest requests outstanding among those not cooling down, the turns of one session to one server
(``rlvr.engine.balance``). A request
whose server fails (connection refused or dropped, HTTP 5xx, or no answer within ``timeout``
seconds) is retried on another address; the failing address is avoided for ``cooldown``
seconds. After ``retries`` retries the request comes back with finish reason ``error`` (the
rollout marks the sample FAILED and counts it). Every request gets exactly one result, in order.

Control calls go to every address: ``abort`` -> ``/abort_request``, ``health`` -> ``/health``
(true while at least one server answers), ``sleep``/``wake`` -> ``/release_memory_occupation``
/ ``/resume_memory_occupation``. ``update_weights`` writes the tensors as one safetensors file
under ``weights_dir`` and asks every server to ``/update_weights_from_disk`` it — so the servers
must see that directory (same machine or shared filesystem), as with SGLang's disk path.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Iterable, Mapping

import aiohttp
import numpy as np
import torch
from safetensors.torch import save_file

from rlvr.engine.balance import Affinity
from rlvr.engine.base import GenerateRequest, GenerateResult
from rlvr.models.moe import index_dtype

log = logging.getLogger(__name__)


def parse_addr(addr: str) -> str:
    """``host:port`` -> ``http://host:port``; anything else raises ValueError."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"engine address {addr!r} is not host:port")
    return f"http://{host}:{port}"


def sglang_payload(req: GenerateRequest, rid: str, routed_experts: bool = False) -> dict:
    p = req.params
    sp = {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "max_new_tokens": p.max_new_tokens,
          "stop_token_ids": list(p.stop_token_ids), "stop": list(p.stop),
          # SGLang stops at the model's EOS unless ignore_eos, and ignore_eos also silences
          # stop_token_ids there: so only a request without stop ids asks to ignore EOS.
          "ignore_eos": not p.stop_token_ids}
    if p.seed is not None:
        sp["sampling_seed"] = p.seed
    payload = {"input_ids": req.prompt_ids, "sampling_params": sp, "return_logprob": True, "rid": rid}
    if p.top_logprobs_num:  # score centering's head of q
        payload["top_logprobs_num"] = p.top_logprobs_num
    if routed_experts:  # R3; the server must run with --enable-return-routed-experts
        payload["return_routed_experts"] = True
    return payload


def encode_routed_experts(routes: torch.Tensor) -> str:
    """``[positions, layers, k]`` expert ids as SGLang sends them: base64 of little-endian int32."""
    return base64.b64encode(routes.to(torch.int32).numpy().astype("<i4").tobytes()).decode()


def decode_routed_experts(text: str, positions: int, top_k: int) -> torch.Tensor:
    """``encode_routed_experts``'s inverse: ``[positions, layers, top_k]`` (the layer count follows)."""
    flat = torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype="<i4").copy())
    if positions <= 0 or flat.numel() % (positions * top_k):
        raise ValueError(f"routed_experts: {flat.numel()} ids do not split into {positions} positions x top-k {top_k}")
    return flat.view(positions, -1, top_k).to(index_dtype(int(flat.max()) + 1 if flat.numel() else 0))


def parse_output(req: GenerateRequest, out: dict, routed_experts_top_k: int = 0) -> GenerateResult:
    """An SGLang ``/generate`` answer -> ``GenerateResult`` (with ``routed_experts`` when
    ``routed_experts_top_k`` is given and the server sent them)."""
    meta = out["meta_info"]
    pairs = meta.get("output_token_logprobs") or []
    tokens = [int(t) for _, t, *_ in pairs] if pairs else list(out.get("output_ids", []))
    log_probs = [float(lp) for lp, *_ in pairs]
    reason = (meta.get("finish_reason") or {}).get("type", "length")
    version = int(meta.get("weight_version") or 0)
    versions = meta.get("output_token_weight_versions") or [version] * len(tokens)
    routes = None
    if routed_experts_top_k and meta.get("routed_experts"):
        routes = decode_routed_experts(meta["routed_experts"], len(req.prompt_ids) + len(tokens) - 1, routed_experts_top_k)
    top = meta.get("output_top_logprobs") or []
    return GenerateResult(req.rid, tokens, log_probs, reason, version, {"server_id": meta.get("id")}, list(versions),
                          routed_experts=routes, top_token_ids=[[int(t) for _, t, *_ in row] for row in top],
                          top_log_probs=[[float(lp) for lp, *_ in row] for row in top])


class HttpEngine:
    def __init__(self, addrs: list[str], timeout: float = 600.0, retries: int = 2, cooldown: float = 5.0,
                 weights_dir: str | None = None, routed_experts_top_k: int = 0):
        if not addrs:
            raise ValueError("HttpEngine needs at least one host:port")
        self.urls = [parse_addr(a) for a in addrs]
        self.timeout, self.retries, self.cooldown = timeout, retries, cooldown
        self.outstanding = {u: 0 for u in self.urls}
        self.down_until = {u: 0.0 for u in self.urls}
        self.served = {u: 0 for u in self.urls}  # answers per server (observability, tests)
        self.failures = 0  # attempts that failed and were retried or given up
        self.weights_dir = Path(weights_dir or tempfile.mkdtemp(prefix="rlvr-weights-"))
        self.affinity = Affinity()  # session -> url: the turns of one multi-turn sample go to one server
        self._version = 0
        self.routed_experts_top_k = routed_experts_top_k  # R3: ask for routed experts (top-k per position)

    @property
    def weight_version(self) -> int:
        return self._version

    # ---- generate -----------------------------------------------------------------------
    async def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        if not requests:
            return []
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            return list(await asyncio.gather(*(self._one(session, r) for r in requests)))

    def _pick(self, tried: set[str], session: str = "") -> str | None:
        now = time.monotonic()
        fresh = [u for u in self.urls if u not in tried]
        up = [u for u in fresh if self.down_until[u] <= now]
        return self.affinity.pick(session, up or fresh, self.outstanding.__getitem__)

    async def _one(self, session: aiohttp.ClientSession, req: GenerateRequest) -> GenerateResult:
        tried: set[str] = set()
        errors: list[str] = []
        rid = req.rid or uuid.uuid4().hex  # the same on every attempt (each on another server)
        for _attempt in range(self.retries + 1):
            url = self._pick(tried, req.session)
            if url is None:
                break
            self.outstanding[url] += 1
            try:
                async with session.post(url + "/generate", json=sglang_payload(req, rid, bool(self.routed_experts_top_k))) as resp:
                    if resp.status == 400:  # our request is bad: retrying elsewhere will not help
                        body = await resp.text()
                        return GenerateResult(req.rid, [], [], "error", self._version, {"error": f"HTTP 400: {body}"})
                    if resp.status >= 500:
                        raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status,
                                                          message=await resp.text())
                    out = await resp.json()
                self.served[url] += 1
                return parse_output(req, out, self.routed_experts_top_k)
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
                self.failures += 1
                tried.add(url)
                self.down_until[url] = time.monotonic() + self.cooldown
                errors.append(f"{url}: {e!r}")
                log.warning("engine %s failed request %s (%r); retrying elsewhere", url, req.rid, e)
                if isinstance(e, asyncio.TimeoutError):
                    self._post_quietly(url, "/abort_request", {"rid": rid})
            finally:
                self.outstanding[url] -= 1
        log.error("request %s failed on every engine: %s", req.rid, errors)
        return GenerateResult(req.rid, [], [], "error", self._version, {"error": "; ".join(errors)})

    # ---- control ------------------------------------------------------------------------
    def _post(self, url: str, route: str, payload: dict, timeout: float = 60.0) -> dict:
        data = json.dumps(payload).encode()
        request = urllib.request.Request(url + route, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            text = resp.read().decode()
        return json.loads(text) if text.startswith("{") else {}

    def _post_quietly(self, url: str, route: str, payload: dict) -> None:
        try:
            self._post(url, route, payload, timeout=5.0)
        except (OSError, urllib.error.URLError) as e:
            log.warning("%s%s failed: %r", url, route, e)

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in items}
        path = self.weights_dir / f"v{version}"
        path.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path / "model.safetensors"))
        for url in self.urls:
            out = self._post(url, "/update_weights_from_disk", {"model_path": str(path), "weight_version": version},
                             timeout=self.timeout)
            if not out.get("success"):
                raise RuntimeError(f"{url}/update_weights_from_disk: {out.get('message')}")
        self._version = version

    def abort(self, rid: str | None = None) -> None:
        for url in self.urls:
            self._post_quietly(url, "/abort_request", {"abort_all": True} if rid is None else {"rid": rid})

    def health(self) -> bool:
        return bool(self.healthy())

    def healthy(self) -> list[str]:
        ok = []
        for url in self.urls:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5.0) as resp:
                    if resp.status == 200:
                        ok.append(url)
            except (OSError, urllib.error.URLError):
                pass
        return ok

    def sleep(self) -> None:
        for url in self.urls:
            self._post(url, "/release_memory_occupation", {})

    def wake(self) -> None:
        for url in self.urls:
            self._post(url, "/resume_memory_occupation", {})
