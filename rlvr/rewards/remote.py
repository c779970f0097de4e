"""Rewards from services: ``remote_rm`` (a reward model behind HTTP) and ``judge`` (LLM-as-judge).

Both fail soft. Each HTTP attempt has its own timeout (``--rm-deadline`` split over the
``--rm-retries`` + 1 attempts); a connection error, a timeout, an HTTP 5xx/429 or a reply that is
not the expected JSON is retried with exponential backoff until the attempts or the deadline run
out, and then raises, which the grader turns into ``--reward-failure-value`` with the reason.

``remote_rm`` protocol (batched: samples arriving within a few milliseconds share one request,
at most ``--rm-batch-size``)::

    POST --rm-url   {"samples": [{"prompt": str, "response": str, "label": any, "metadata": {}}, ...]}
    reply           {"rewards": [r, ...]}   (or a bare JSON list), one per sample, in order,
                    each r a number or {"score": number, ...extra fields to log}

``judge`` sends one OpenAI chat-completion request per sample to ``--judge-url`` (any
OpenAI-compatible server: vLLM, SGLang, ``rlvr serve``, a hosted API) with the prompt template
filled in, and parses the score from the reply (``Score: 7``, ``[[7]]``, or a reply that is just
a number); the reward is score / ``--judge-max-score``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any


from rlvr.config.reward import RewardConfig
from rlvr.core.http import RemoteError, post_json  # noqa: F401  (RemoteError: re-exported, callers catch it)
from rlvr.rewards.registry import REWARDS
from rlvr.core.types import Sample

log = logging.getLogger(__name__)


# ---- remote_rm ------------------------------------------------------------------------------
def _rewards_of(reply: Any, n: int) -> list:
    rewards = reply["rewards"] if isinstance(reply, dict) else reply
    if not isinstance(rewards, list) or len(rewards) != n:
        got = len(rewards) if isinstance(rewards, list) else type(rewards).__name__
        raise ValueError(f"expected a list of {n} rewards, got {got}")
    return rewards


@REWARDS.register("remote_rm")
class RemoteRM:
    """``--rm-type remote_rm``: rewards from ``--rm-url``, requests batched across samples."""

    def __init__(self, cfg: RewardConfig):
        self.cfg = cfg  # RewardConfig.validate requires --rm-url for remote_rm
        self._pending: list[tuple[Sample, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, sample: Sample) -> Any:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # each rollout may run its own event loop: start clean
            self._loop, self._pending, self._timer = loop, [], None
        fut = loop.create_future()
        self._pending.append((sample, fut))
        if len(self._pending) >= self.cfg.rm_batch_size:
            self._flush()
        elif self._timer is None:  # wait a moment for the rest of the group to arrive
            self._timer = asyncio.get_running_loop().call_later(0.005, self._flush)
        return await fut

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending[: self.cfg.rm_batch_size], self._pending[self.cfg.rm_batch_size :]
        if batch:
            asyncio.get_running_loop().create_task(self._send(batch))
        if self._pending:
            self._timer = asyncio.get_running_loop().call_later(0.005, self._flush)

    async def _send(self, batch: list[tuple[Sample, asyncio.Future]]) -> None:
        payload = {"samples": [{"prompt": s.prompt, "response": s.response, "label": s.label,
                                "metadata": _jsonable(s.metadata)} for s, _ in batch]}
        try:
            rewards = await post_json(self.cfg.rm_url, payload, self.cfg.rm_retries, self.cfg.rm_deadline,
                                      parse=lambda reply: _rewards_of(reply, len(batch)))
        except Exception as e:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, fut), r in zip(batch, rewards):
            if not fut.done():
                fut.set_result(r)


def _jsonable(d: dict) -> dict:
    return {k: v for k, v in d.items() if _is_json(v)}


def _is_json(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


# ---- judge ----------------------------------------------------------------------------------
DEFAULT_JUDGE_PROMPT = """You are grading a response to a question against a reference answer.

Question:
{prompt}

Reference answer:
{label}

Response:
{response}

Judge whether the response's final answer is correct and complete. Give a score from 0 (wrong)
to 10 (fully correct). End your reply with a line of the form "Score: N"."""

_SCORE_PATTERNS = (
    re.compile(r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE),
    re.compile(r"\[\[\s*(-?\d+(?:\.\d+)?)\s*\]\]"),
)


def parse_judge_score(reply: str, max_score: float) -> float:
    """The judge's score in a reply, scaled to [0, 1]; ``ValueError`` when there is none.

    >>> parse_judge_score("The response is right.\\nScore: 8", 10)
    0.8
    >>> parse_judge_score("[[10]]", 10)
    1.0
    >>> parse_judge_score(" 3 ", 10)
    0.3
    >>> parse_judge_score("looks fine", 10)
    Traceback (most recent call last):
    ...
    ValueError: judge reply has no score: 'looks fine'
    """
    for pattern in _SCORE_PATTERNS:
        found = pattern.findall(reply)
        if found:
            value = float(found[-1])
            break
    else:
        try:
            value = float(reply.strip())
        except ValueError:
            raise ValueError(f"judge reply has no score: {reply[-200:]!r}") from None
    if not 0 <= value <= max_score:
        raise ValueError(f"judge score {value:g} outside [0, {max_score:g}] (--judge-max-score)")
    return value / max_score


def chat_completions_url(base: str) -> str:
    """
    >>> chat_completions_url("http://127.0.0.1:8000")
    'http://127.0.0.1:8000/v1/chat/completions'
    >>> chat_completions_url("https://api.example.com/v1/")
    'https://api.example.com/v1/chat/completions'
    """
    base = base.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")


def load_judge_template(path: str | None) -> str:
    """The prompt template; it must name {response} and format with prompt/response/label only."""
    from rlvr.core.errors import ConfigError

    template = Path(path).read_text() if path else DEFAULT_JUDGE_PROMPT
    try:
        template.format(prompt="", response="", label="")
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError("--judge-prompt-path", f"{path}: bad template ({e!r}); use {{prompt}} {{response}} "
                                                 "{label}, and double literal braces") from None
    if "{response}" not in template:
        raise ConfigError("--judge-prompt-path", f"{path}: the template never shows the judge the {{response}}")
    return template


@REWARDS.register("judge")
class Judge:
    """``--rm-type judge``: an LLM grades each response through an OpenAI-compatible endpoint."""

    def __init__(self, cfg: RewardConfig):
        self.cfg = cfg  # RewardConfig.validate requires --judge-url for judge
        self.url = chat_completions_url(cfg.judge_url)
        self.template = load_judge_template(cfg.judge_prompt_path)

    async def __call__(self, sample: Sample) -> dict:
        prompt = sample.prompt if isinstance(sample.prompt, str) else json.dumps(sample.prompt)
        content = self.template.format(prompt=prompt, response=sample.response,
                                       label="" if sample.label is None else sample.label)
        payload = {"model": self.cfg.judge_model, "messages": [{"role": "user", "content": content}],
                   "temperature": 0.0, "max_tokens": 512}
        text = await post_json(self.url, payload, self.cfg.rm_retries, self.cfg.rm_deadline,
                               parse=lambda reply: reply["choices"][0]["message"]["content"])
        if not isinstance(text, str):
            raise ValueError(f"judge reply content is not text: {text!r}")
        return {"score": parse_judge_score(text, self.cfg.judge_max_score)}
