"""HTTP helpers shared by the roles that call services: ``post_json``, a JSON POST with a deadline,
retries and backoff (the reward services, ``rlvr.rewards.remote``; the on-policy-distillation
teacher behind ``rlvr serve`` / SGLang, ``rlvr.train.teacher``).

A connection error, a timeout, an HTTP 5xx/429 or a reply ``parse`` rejects is retried with
exponential backoff until the attempts or the deadline run out; an HTTP 4xx is not (the request is
wrong). Out of tries: ``RemoteError`` naming the URL, the attempts and the last failure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp

log = logging.getLogger(__name__)


class RemoteError(RuntimeError):
    """A service gave no usable answer within the retries and the deadline."""


class _Retry(Exception):
    pass


async def post_json(url: str, payload: Any, retries: int, deadline: float, parse=lambda x: x) -> Any:
    """POST ``payload``; ``parse`` the JSON reply (raising ``ValueError`` if malformed). Retries
    transient failures with backoff 0.1 s, 0.2 s, ...; raises ``RemoteError`` when out of tries."""
    start, attempts = time.monotonic(), retries + 1
    per_try = deadline / attempts
    last = "no attempt"
    async with aiohttp.ClientSession() as session:
        for attempt in range(attempts):
            remaining = deadline - (time.monotonic() - start)
            if remaining <= 0:
                break
            try:
                timeout = aiohttp.ClientTimeout(total=min(per_try, remaining))
                async with session.post(url, json=payload, timeout=timeout) as reply:
                    text = await reply.text()
                    if reply.status >= 500 or reply.status == 429:
                        raise _Retry(f"HTTP {reply.status}: {text[:200]!r}")
                    if reply.status >= 400:  # our request is wrong: retrying cannot help
                        raise RemoteError(f"{url}: HTTP {reply.status}: {text[:200]!r}")
                    try:
                        return parse(json.loads(text))
                    except (ValueError, KeyError, TypeError, IndexError) as e:
                        raise _Retry(f"malformed reply ({e}): {text[:200]!r}") from None
            except (_Retry, aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                last = str(e) or type(e).__name__
                log.debug("%s: attempt %d/%d failed: %s", url, attempt + 1, attempts, last)
                if attempt + 1 < attempts:
                    await asyncio.sleep(min(0.1 * 2**attempt, max(deadline - (time.monotonic() - start), 0)))
    raise RemoteError(f"{url}: no usable reply after {attempts} attempts within {deadline:g} s; last: {last}")
