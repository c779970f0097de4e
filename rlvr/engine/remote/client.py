"""A client ``Engine`` over SGLang's HTTP protocol (``rlvr serve`` or a real SGLang server).

``HttpEngine(["host:port", ...])`` sends each request to ``/generate`` on the address with the
fewest requests outstanding among those the failure policy allows, the turns of one session to
one server (``rlvr.engine.remote.balance``). A server fails a request when the connection is refused or
dropped, it answers HTTP 5xx, or it does not answer within ``timeout`` seconds; what follows is
``rlvr.engine.remote.failures.FailurePolicy``'s, the same policy the engine supervisor follows: the
request is retried on another address, the failing one is avoided for ``cooldown`` seconds, and
after ``retries`` retries (or with no address left to try) the request comes back with finish
reason ``error`` (the rollout marks the sample FAILED and counts it). Every request gets exactly
one result, in order.

Control calls go to every address: ``abort`` -> ``/abort_request``, ``health`` -> ``/health``
(true while at least one server answers), ``sleep``/``wake`` -> ``/release_memory_occupation``
/ ``/resume_memory_occupation``. ``update_weights`` writes the tensors as one safetensors file
under ``weights_dir`` and asks every server to ``/update_weights_from_disk`` it — so the servers
must see that directory (same machine or shared filesystem), as with SGLang's disk path. Once
every server has loaded a version, the older ones this client wrote are deleted (one model's
weights on disk, not one a rollout), and ``close`` deletes the last; a ``weights_dir`` the client
made itself goes with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterable, Mapping

import aiohttp
import torch
from safetensors.torch import save_file

from rlvr.engine.remote.balance import Affinity
from rlvr.engine.base import Engine, GenerateRequest, GenerateResult
from rlvr.engine.remote.failures import FailurePolicy, error_results
from rlvr.engine.remote.sglang_http import health, parse_addr, post, post_generate

log = logging.getLogger(__name__)


class HttpEngine(Engine):
    def __init__(self, addrs: list[str], timeout: float = 600.0, retries: int = 2, cooldown: float = 5.0,
                 weights_dir: str | None = None, routed_experts_top_k: int = 0):
        if not addrs:
            raise ValueError("HttpEngine needs at least one host:port")
        self.urls = [parse_addr(a) for a in addrs]
        self.timeout = timeout
        self.policy = FailurePolicy(attempts=retries + 1, avoid_for=cooldown)
        self.outstanding = {u: 0 for u in self.urls}
        self.served = {u: 0 for u in self.urls}  # answers per server (observability, tests)
        self.failures = 0  # attempts that failed and were retried or given up
        self._weights_dir = Path(weights_dir) if weights_dir else None  # made at the first push when None
        self._own_weights_dir = weights_dir is None
        self._written: list[Path] = []  # version folders written here and not yet deleted
        self.affinity = Affinity()  # session -> url: the turns of one multi-turn sample go to one server
        self._version = 0
        self.routed_experts_top_k = routed_experts_top_k  # R3: ask for routed experts (top-k per position)

    @property
    def weights_dir(self) -> Path:
        """Where pushed weights are written: the given directory, or a temporary one made on first use."""
        if self._weights_dir is None:
            self._weights_dir = Path(tempfile.mkdtemp(prefix="rlvr-weights-"))
        return self._weights_dir

    # ---- generate -----------------------------------------------------------------------
    async def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        if not requests:
            return []
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            return list(await asyncio.gather(*(self._one(session, r) for r in requests)))

    def _pick(self, tried: set[str], session: str = "") -> str | None:
        """The address for the next attempt (the policy's choices; None: give up)."""
        return self.affinity.pick(session, self.policy.choices(self.urls, tried), self.outstanding.__getitem__)

    async def _one(self, session: aiohttp.ClientSession, req: GenerateRequest) -> GenerateResult:
        tried: set[str] = set()
        errors: list[str] = []
        rid = req.rid or uuid.uuid4().hex  # the same on every attempt (each on another server)
        for _attempt in range(self.policy.attempts):
            url = self._pick(tried, req.session)
            if url is None:
                break
            self.outstanding[url] += 1
            try:
                result = await post_generate(session, url, req, rid, self.routed_experts_top_k)
                if result.finish_reason == "error":  # HTTP 400: our request is bad, retrying elsewhere will not help
                    return dataclasses.replace(result, weight_version=self._version)
                self.served[url] += 1
                self.policy.answered(url)
                return result
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
                self.failures += 1
                tried.add(url)
                self.policy.failed(url)
                errors.append(f"{url}: {e!r}")
                log.warning("engine %s failed request %s (%r); retrying elsewhere", url, req.rid, e)
                if isinstance(e, asyncio.TimeoutError):
                    self._post_quietly(url, "/abort_request", {"rid": rid})
            finally:
                self.outstanding[url] -= 1
        log.error("request %s failed on every engine: %s", req.rid, errors)
        return error_results([req], errors, self._version)[0]

    # ---- control ------------------------------------------------------------------------
    def _post(self, url: str, route: str, payload: dict, timeout: float = 60.0) -> dict:
        return post(url, route, payload, timeout)

    def _post_quietly(self, url: str, route: str, payload: dict) -> None:
        try:
            post(url, route, payload, timeout=5.0)
        except OSError as e:  # URLError is an OSError
            log.warning("%s%s failed: %r", url, route, e)

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in items}
        path = self.weights_dir / f"v{version}"
        path.mkdir(parents=True, exist_ok=True)
        self._written = [p for p in self._written if p != path] + [path]
        save_file(tensors, str(path / "model.safetensors"))
        for url in self.urls:
            out = self._post(url, "/update_weights_from_disk", {"model_path": str(path), "weight_version": version},
                             timeout=self.timeout)
            if not out.get("success"):
                raise RuntimeError(f"{url}/update_weights_from_disk: {out.get('message')}")
        self._version = version
        for old in self._written[:-1]:  # every server has loaded ``path``
            shutil.rmtree(old, ignore_errors=True)
        self._written = [path]

    def close(self) -> None:
        """Delete the weights this client wrote (and ``weights_dir`` when it made it)."""
        for path in self._written:
            shutil.rmtree(path, ignore_errors=True)
        self._written = []
        if self._own_weights_dir and self._weights_dir is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)

    def abort(self, rid: str | None = None) -> None:
        for url in self.urls:
            self._post_quietly(url, "/abort_request", {"abort_all": True} if rid is None else {"rid": rid})

    def health(self) -> bool:
        return bool(self.healthy())

    def healthy(self) -> list[str]:
        return [url for url in self.urls if health(url, 5.0)]

    def sleep(self) -> None:
        for url in self.urls:
            self._post(url, "/release_memory_occupation", {})

    def wake(self) -> None:
        for url in self.urls:
            self._post(url, "/resume_memory_occupation", {})
