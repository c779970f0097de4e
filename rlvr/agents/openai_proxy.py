"""An OpenAI-compatible endpoint for rollouts that records every call, token for token.

Agent code written against the chat-completions API (the official ``openai`` client, with tools)
becomes a trainable multi-turn sample without re-tokenization, as slime's agent adapters and
AReaL's proxy do. Inside a generate function::

    ctx = rlvr.agents.context()
    client = openai.AsyncOpenAI(base_url=ctx.openai_base_url, api_key="rlvr")
    ... run the agent (chat.completions.create with tools=..., stream=True or not) ...
    return ctx.session_sample(sample)      # (also done automatically when the sample is left empty)

``POST {base_url}/chat/completions`` (base ``/sessions/<session>/v1``; the session is the sample's
uid) answers the OpenAI shape: ``message.content``, ``message.tool_calls`` (parsed from the Hermes
``<tool_call>{json}</tool_call>`` blocks the model wrote; ``finish_reason: "tool_calls"``),
``usage``, and with ``stream: true`` ``chat.completion.chunk`` server-sent events ending in
``[DONE]``: content deltas as the engine samples the tokens (token by token on the embedded
engine; an engine without a token stream -- HTTP, Ray actors -- sends its answer as one delta),
then the tool calls. ``GET {base_url}/models`` lists the model.

Recording, token-in/token-out: the first call renders its messages (and tools) with the chat
template. A later call whose messages extend the previous call's messages and the assistant
message it returned (the usual agent loop) continues from the *exact token ids* of that call --
prompt + the engine's output ids -- plus only the new messages' delta tokens (``ChatTurns``). The
session's sample is then prompt, model segment, environment segment, model segment, ... with the
engine's log-probs and weight versions. A call that does not extend the conversation (the agent
rewrote its history) starts the session over: the sample keeps the last linear conversation,
and ``metadata["openai_restarts"]`` counts the dropped ones.

The server runs in a daemon thread with its own event loop (rollouts open and close theirs) and
sends each call to the rollout's engine through the session's ``EngineHandle`` (session affinity,
abort handling: an aborted call answers ``finish_reason: "length"`` and the sample is regenerated).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field, replace

from aiohttp import web

from rlvr.engine.chat import openai_tool_call, parse_tool_calls, split_tool_calls, template_message
from rlvr.engine.base import GenerateResult, SamplingParams
from rlvr.engine.streaming import TextStream
from rlvr.core.types import Sample


@dataclass
class Session:
    handle: object  # EngineHandle
    messages: list[dict] = field(default_factory=list)  # the conversation so far, as the client sent + got it
    prompt_ids: list[int] = field(default_factory=list)
    # (ids, trainable, log_probs, versions, text) segments of the response
    segments: list[tuple[list[int], bool, list[float] | None, list[int] | None, str]] = field(default_factory=list)
    restarts: int = 0
    calls: int = 0
    budget: int = 1 << 30  # response tokens of the whole session (--rollout-max-response-len)
    tools: list[dict] | None = None  # the last call's tools
    tool_calls: int = 0  # tool calls the model wrote (rollout/tool_calls/*, as the --tools loop counts them)
    tool_errors: int = 0  # of those, malformed or naming a tool the call did not offer
    tool_counts: dict[str, int] = field(default_factory=dict)

    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + [t for seg in self.segments for t in seg[0]]


def _normalise(m: dict) -> dict:
    """A message as compared for prefix matching: role, content, tool calls (name + arguments)."""
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])
              if isinstance(c["function"]["arguments"], str) else c["function"]["arguments"])
             for c in (m.get("tool_calls") or [])]
    return {"role": m.get("role"), "content": (m.get("content") or "").strip(), "tool_calls": calls}


class OpenAIProxy:
    """The recording chat-completions server over a rollout's engine (module docstring)."""

    def __init__(self, engine, tokenizer, turns_factory, model_name: str = "rlvr-policy"):
        self.engine, self.tokenizer, self.turns_factory, self.model_name = engine, tokenizer, turns_factory, model_name
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port = 0
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), name="rlvr-openai-proxy", daemon=True)
        self._thread.start()
        started.wait(30)
        if not self.port:
            raise RuntimeError("the OpenAI-compatible rollout endpoint did not start")

    # ---- what the agent machinery calls ------------------------------------------------------------
    def open(self, handle, budget: int = 1 << 30) -> str:
        """Register a session for ``handle`` with a token ``budget`` for its whole response (every
        call's completion and every new message counts); returns its base URL."""
        key = uuid.uuid4().hex  # a sample uid ("3/1") is no URL path segment
        with self._lock:
            self.sessions[handle.session] = self.sessions[key] = Session(handle, budget=budget)
        return f"http://127.0.0.1:{self.port}/sessions/{key}/v1"

    def close(self, session: str) -> Session | None:
        with self._lock:
            s = self.sessions.pop(session, None)
            for key in [k for k, v in self.sessions.items() if v is s]:
                del self.sessions[key]
            return s

    def fill(self, session: str, sample: Sample) -> Sample:
        """Write the session's recorded conversation into ``sample`` (prompt and segments)."""
        with self._lock:
            s = self.sessions.get(session)
        if s is None or not s.calls:
            return sample
        sample.prompt_ids = list(s.prompt_ids)
        sample.prompt = self.tokenizer.decode(s.prompt_ids)
        sample.response, sample.response_ids, sample.rollout_log_probs, sample.loss_mask = "", [], [], []
        sample.weight_versions = []
        for ids, trainable, lps, versions, text in s.segments:
            sample.append_segment(ids, trainable=trainable, log_probs=lps, weight_versions=versions, text=text)
        sample.metadata["turns"] = sum(1 for seg in s.segments if seg[1])
        sample.metadata["openai_calls"] = s.calls
        sample.metadata.update(tool_calls=s.tool_calls, tool_errors=s.tool_errors, tool_counts=dict(s.tool_counts))
        if s.restarts:
            sample.metadata["openai_restarts"] = s.restarts
        return sample

    # ---- the server ---------------------------------------------------------------------------------
    def _serve(self, started: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 2**20)
        app.add_routes([web.post("/sessions/{session}/v1/chat/completions", self.chat_completions),
                        web.get("/sessions/{session}/v1/models", self.models)])
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        started.set()
        self._loop.run_forever()

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    def _context(self, s: Session, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The prompt ids of this call: token-in/token-out continuation when the messages extend
        the recorded conversation, else a fresh render (the session restarts)."""
        turns = self.turns_factory(tools)
        n = len(s.messages)
        if s.calls and len(messages) > n and [_normalise(m) for m in messages[:n]] == [_normalise(m) for m in s.messages]:
            new = [template_message(m) for m in messages[n:]]
            last_model = next((seg[0] for seg in reversed(s.segments) if seg[1]), [])
            text, ids = turns.observation_ids(new, last_model)
            s.segments.append((ids, False, None, None, text))
            return s.context_ids
        if s.calls:
            s.restarts += 1
        s.segments = []
        _, s.prompt_ids = turns.prompt_ids([template_message(m) for m in messages])
        return list(s.prompt_ids)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        session = request.match_info["session"]
        with self._lock:
            s = self.sessions.get(session)
        if s is None:
            return web.json_response({"error": {"message": f"unknown session {session!r}"}}, status=404)
        try:
            body = await request.json()
            messages, tools = body["messages"], body.get("tools")
            if not isinstance(messages, list) or not messages:
                raise ValueError("field 'messages' must be a non-empty list")
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 256
            stop = body.get("stop") or ()
            params = SamplingParams(temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                                    max_new_tokens=int(max_tokens), stop=tuple([stop] if isinstance(stop, str) else stop),
                                    stop_token_ids=(self.tokenizer.eos_token_id,),
                                    seed=None if body.get("seed") is None else int(body["seed"]))
            params.check()
        except (ValueError, KeyError, TypeError) as e:
            return web.json_response({"error": {"message": f"bad request: {e}"}}, status=400)
        turns = self.turns_factory(tools)
        if (rendered := _rendered_already(messages, turns.markers)) is not None:
            return web.json_response({"error": {"message": rendered}}, status=400)
        s.tools = tools
        ids = self._context(s, messages, tools)
        left = s.budget - (len(ids) - len(s.prompt_ids))
        params = replace(params, max_new_tokens=min(params.max_new_tokens, max(left, 1)))
        cid, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())
        if not body.get("stream"):
            result = await self._generate(s, ids, params, left)
            message, finish, usage = self._record(s, messages, ids, result)
            return web.json_response({"id": cid, "object": "chat.completion", "created": created,
                                      "model": self.model_name, "usage": usage,
                                      "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
        return await self._stream(request, s, messages, ids, params, left, cid, created)

    async def _generate(self, s: Session, ids: list[int], params: SamplingParams, left: int) -> GenerateResult:
        if left <= 0:  # the response budget is spent: no call (the rollout truncates the sample)
            return GenerateResult("", [], [], "length", s.handle.weight_version)
        return await s.handle.generate(ids, params)

    def _record(self, s: Session, messages: list[dict], ids: list[int], result: GenerateResult,
                content: str | None = None) -> tuple[dict, str, dict]:
        """Record one call's tokens in the session; (assistant message, finish reason, usage).
        ``content``: the message's content as streamed (else the text without its tool calls)."""
        text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        if result.token_ids:
            s.segments.append((list(result.token_ids), True, list(result.log_probs), list(result.weight_versions), text))
        s.calls += 1
        self._count_tool_calls(s, text)
        plain, calls = split_tool_calls(text)
        if content is None:
            content = plain
        tool_calls = [openai_tool_call(c) for c in calls]
        finish = {"stop": "tool_calls" if calls else "stop", "length": "length"}.get(result.finish_reason, "length")
        message = {"role": "assistant", "content": content or None, **({"tool_calls": tool_calls} if tool_calls else {})}
        s.messages = list(messages) + [message]
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(result.token_ids),
                 "total_tokens": len(ids) + len(result.token_ids)}
        return message, finish, usage

    @staticmethod
    def _count_tool_calls(s: Session, text: str) -> None:
        offered = {t.get("function", {}).get("name") for t in s.tools or []}
        for call in parse_tool_calls(text):
            s.tool_calls += 1
            if call.error is not None or call.name not in offered:
                s.tool_errors += 1
            else:
                s.tool_counts[call.name] = s.tool_counts.get(call.name, 0) + 1

    async def _stream(self, request, s: Session, messages, ids, params, left, cid, created) -> web.StreamResponse:
        """``stream: true``: content deltas as the engine samples the tokens (``TextStream``: text
        inside a ``<tool_call>`` block is held back), then the tool calls, the finish reason with
        usage, ``[DONE]``. The tokens are recorded exactly as without streaming."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(delta: dict, reason=None, **extra):
            chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": self.model_name,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": reason}], **extra}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        await send({"role": "assistant", "content": ""})
        text = TextStream(self.tokenizer, ("<tool_call>",))
        tokens, log_probs, versions, reason = [], [], [], "length"
        pieces = s.handle.stream(ids, params) if left > 0 else None
        async for piece in pieces or _nothing():
            tokens += piece.token_ids
            log_probs += piece.log_probs
            versions += piece.weight_versions
            reason = piece.finish_reason or reason
            if piece.token_ids and (delta := text.push(piece.token_ids)):
                await send({"content": delta})
        result = GenerateResult("", tokens, log_probs, reason, versions[-1] if versions else s.handle.weight_version,
                                {}, versions)
        whole = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if rest := text.rest(split_tool_calls(whole)[0]):
            await send({"content": rest})
        message, finish, usage = self._record(s, messages, ids, result, content=text.sent)
        for k, c in enumerate(message.get("tool_calls", [])):
            await send({"tool_calls": [{"index": k, "id": c["id"], "type": "function",
                                        "function": {"name": c["function"]["name"], "arguments": ""}}]})
            await send({"tool_calls": [{"index": k, "function": {"arguments": c["function"]["arguments"]}}]})
        await send({}, finish, usage=usage)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _rendered_already(messages: list[dict], markers: tuple[str, ...]) -> str | None:
    """The error text when a message holds the chat template's own turn markers: the agent sent a
    prompt the template had rendered (``sample.prompt`` under --apply-chat-template), which would
    be rendered twice."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user"):
            continue  # a model turn may hold such text as plain tokens (a random model does)
        content = m.get("content")
        hit = next((k for k in markers if isinstance(content, str) and k in content), None)
        if hit is not None:
            return (f"messages[{i}] ({m.get('role')}) holds the chat template's {hit!r}: it is a prompt already "
                    "rendered by the template (sample.prompt under --apply-chat-template) and would be rendered "
                    "twice; send context().messages(sample), the data's chat messages, instead")
    return None


async def _nothing():
    return
    yield
