"""SGLang's HTTP protocol, the one client of it: the ``/generate`` wire format (request payload,
answer parsing, routed experts as base64), the control POSTs and ``/health``. ``HttpEngine``
(external servers, ``rlvr.engine.remote.client``) and ``ServeProcesses`` (local ``rlvr serve``
processes under the supervisor, ``rlvr.engine.remote.processes``) both speak it through here; ``rlvr
serve`` (``rlvr.engine.serving.routes``) is its server side.
"""

from __future__ import annotations

import base64
import json
import urllib.request

import aiohttp
import numpy as np
import torch

from rlvr.engine.base import GenerateRequest, GenerateResult
from rlvr.models.moe import index_dtype


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


async def post_generate(session: aiohttp.ClientSession, url: str, req: GenerateRequest, rid: str,
                        routed_experts_top_k: int = 0) -> GenerateResult:
    """One ``/generate`` call. HTTP 400 (the request is bad: no retry helps) is an ``error``
    result; a 5xx raises ``aiohttp.ClientResponseError``, a transport failure its own error."""
    async with session.post(url + "/generate", json=sglang_payload(req, rid, bool(routed_experts_top_k))) as resp:
        if resp.status == 400:
            return GenerateResult(req.rid, [], [], "error", 0, {"error": f"{url}: HTTP 400: {await resp.text()}"})
        if resp.status >= 500:
            raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status, message=await resp.text())
        return parse_output(req, await resp.json(), routed_experts_top_k)


def post(url: str, route: str, payload: dict, timeout: float) -> dict:
    """A control POST (``/update_weights_from_disk``, ``/abort_request``, ...): its JSON answer,
    ``{}`` for a plain-text one; raises ``OSError`` (``URLError``) when the server does not answer."""
    request = urllib.request.Request(url + route, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        text = resp.read().decode()
    return json.loads(text) if text.startswith("{") else {}


def health(url: str, timeout: float) -> bool:
    """Whether ``/health`` answers 200 within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as resp:
            return resp.status == 200
    except OSError:  # URLError, refused, reset, timed out
        return False
