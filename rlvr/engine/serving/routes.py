"""``rlvr serve``: the embedded engine behind SGLang's HTTP routes and OpenAI-compatible ones.

SGLang routes (payloads as SGLang's, for what rlvr uses):
- ``POST /generate`` ``{"input_ids": [..] | [[..], ..], "text": str | [str], "sampling_params":
  {temperature, top_p, top_k, max_new_tokens, stop, stop_token_ids, sampling_seed, ignore_eos, n},
  "return_logprob": bool, "rid": str | [str]}`` -> ``{"text", "output_ids", "meta_info": {"id",
  "finish_reason": {"type": "stop"|"length"|"abort", ...}, "prompt_tokens", "completion_tokens",
  "output_token_logprobs": [[logprob, token_id, null], ...], "weight_version"}}`` (a list for a
  batch). rlvr adds ``meta_info.output_token_weight_versions`` (one version per token).
  With ``"sampling_params": {"max_new_tokens": 0}`` and ``"return_logprob": true`` nothing is
  generated: ``meta_info.input_token_logprobs`` scores the given tokens from ``logprob_start_len``
  on (``[[logprob | null, token_id, null], ...]``, null for the first token; ``rlvr.engine.local.scoring``),
  what an on-policy-distillation teacher answers (``--use-opd --opd-type sglang``).
- ``POST /update_weights_from_disk`` ``{"model_path", "weight_version"?}``: loads the directory's
  ``*.safetensors`` into the running engine between two decode steps.
- ``POST /abort_request`` ``{"rid"}`` or ``{"abort_all": true}``; ``GET /health`` (200 / 503);
  ``POST /flush_cache`` (the engine keeps no prefix cache across requests: nothing to flush);
  ``POST /release_memory_occupation`` / ``/resume_memory_occupation`` (engine sleep / wake).
OpenAI-compatible: ``POST /v1/completions``, ``POST /v1/chat/completions`` (the tokenizer's chat
template with a generation prompt, ``tools`` passed to it; Hermes ``<tool_call>`` blocks in the
output come back as ``message.tool_calls``); ``stream: true`` on both answers server-sent chunks
token by token, as the engine samples them (``Server._stream``), ``GET /v1/models``.

As in SGLang, generation stops at the tokenizer's EOS unless ``ignore_eos``; the text of a
response ends before a matched stop string. A malformed payload gets HTTP 400 naming the field.
The server binds 127.0.0.1 unless told otherwise; the command's flags and start-up are
``rlvr.entrypoints.serve``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Callable

import torch
from aiohttp import web
from safetensors.torch import load_file

from rlvr.engine.base import GenerateRequest, GenerateResult, SamplingParams
from rlvr.engine.chat import openai_tool_call, split_tool_calls, template_message
from rlvr.engine.remote.sglang_http import encode_routed_experts
from rlvr.engine.local.embedded import EmbeddedEngine

log = logging.getLogger(__name__)


class BadRequest(ValueError):
    pass


def _field(payload: dict, name: str, kind, default=None):
    value = payload.get(name, default)
    if value is None:
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"field {name!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _as_tuple(value, name: str, item) -> tuple:
    if value is None:
        return ()
    if isinstance(value, item):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, item) for v in value):
        raise BadRequest(f"field {name!r} must be a {item.__name__} or a list of them")
    return tuple(value)


def sampling_params(sp: dict, eos_token_id: int | None, max_tokens_key: str = "max_new_tokens",
                    seed_key: str = "sampling_seed", default_max: int = 128) -> SamplingParams:
    """SGLang (or OpenAI, with other key names) sampling parameters -> ``SamplingParams``."""
    if not isinstance(sp, dict):
        raise BadRequest("field 'sampling_params' must be an object")
    stop_ids = _as_tuple(sp.get("stop_token_ids"), "stop_token_ids", int)
    if eos_token_id is not None and not _field(sp, "ignore_eos", bool, False):
        stop_ids = tuple(dict.fromkeys(stop_ids + (eos_token_id,)))
    params = SamplingParams(
        temperature=_field(sp, "temperature", float, 1.0),
        top_p=_field(sp, "top_p", float, 1.0),
        top_k=_field(sp, "top_k", int, -1),
        max_new_tokens=_field(sp, max_tokens_key, int, default_max),
        stop_token_ids=stop_ids,
        stop=_as_tuple(sp.get("stop"), "stop", str),
        seed=_field(sp, seed_key, int, None),
    )
    try:
        params.check()
    except ValueError as e:
        raise BadRequest(str(e)) from None
    return params


def _cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    cuts = [text.index(s) for s in stops if s in text]
    return text[: min(cuts)] if cuts else text


class Server:
    """Route handlers over one engine and its tokenizer."""

    def __init__(self, engine: EmbeddedEngine, tokenizer, model_name: str):
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[_errors])
        app.add_routes([
            web.post("/generate", self.generate),
            web.post("/update_weights_from_disk", self.update_weights_from_disk),
            web.post("/abort_request", self.abort_request),
            web.get("/health", self.health),
            web.get("/get_load", self.get_load),
            web.get("/health_generate", self.health),
            web.post("/flush_cache", self.flush_cache),
            web.get("/flush_cache", self.flush_cache),
            web.post("/release_memory_occupation", self.release_memory),
            web.post("/resume_memory_occupation", self.resume_memory),
            web.get("/get_model_info", self.model_info),
            web.get("/v1/models", self.models),
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
        ])
        return app

    def _text(self, result: GenerateResult, params: SamplingParams) -> str:
        return _cut_at_stop(self.tokenizer.decode(result.token_ids, skip_special_tokens=True), params.stop)

    # ---- SGLang ---------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.Response:
        body = await _json(request)
        if "input_ids" in body:
            ids = body["input_ids"]
            batch = bool(ids) and isinstance(ids[0], list)
            prompts = ids if batch else [ids]
            if not all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompts):
                raise BadRequest("field 'input_ids' must be a non-empty list of token ids (or a list of them)")
        elif "text" in body:
            texts = body["text"]
            batch = isinstance(texts, list)
            prompts = [self._encode(t, "text") for t in (texts if batch else [texts])]
        else:
            raise BadRequest("give 'input_ids' or 'text'")
        sps = body.get("sampling_params") or {}
        sps = sps if isinstance(sps, list) else [sps] * len(prompts)
        if len(sps) != len(prompts):
            raise BadRequest(f"'sampling_params' has {len(sps)} entries for {len(prompts)} prompts")
        if all(isinstance(sp, dict) and sp.get("max_new_tokens") == 0 for sp in sps):
            out = await self._score(prompts, sps, body)
            return web.json_response(out if batch else out[0])
        eos = self.tokenizer.eos_token_id
        params = [sampling_params(sp, eos) for sp in sps]
        top = _field(body, "top_logprobs_num", int, 0)  # SGLang's: the head of q with every token
        if top:
            params = [dataclasses.replace(p, top_logprobs_num=top) for p in params]
        n = _field(sps[0], "n", int, 1) if sps else 1
        rids = body.get("rid")
        rids = rids if isinstance(rids, list) else [rids] * len(prompts)
        if body.get("return_routed_experts") and self.engine.routing is None:
            raise BadRequest("'return_routed_experts' needs a server started with --enable-return-routed-experts")
        reqs = [
            GenerateRequest(p, sp, rid=(f"{rid}" if n == 1 else f"{rid}-{k}") if rid else uuid.uuid4().hex)
            for p, sp, rid in zip(prompts, params, rids, strict=True) for k in range(n)
        ]
        results = await self.engine.generate(reqs)
        want_logprob = bool(body.get("return_logprob", False))
        out = [self._sglang_output(req, res, want_logprob) for req, res in zip(reqs, results, strict=True)]
        if body.get("return_routed_experts"):  # R3, as SGLang: base64 int32 [prompt + output - 1, layers, k]
            for o, res in zip(out, results, strict=True):
                if res.routed_experts is not None:
                    o["meta_info"]["routed_experts"] = encode_routed_experts(res.routed_experts)
        return web.json_response(out if batch or n > 1 else out[0])

    def _sglang_output(self, req: GenerateRequest, res: GenerateResult, want_logprob: bool) -> dict:
        finish: dict = {"type": res.finish_reason}
        if res.finish_reason == "length":
            finish["length"] = len(res.token_ids)
        elif res.finish_reason == "stop" and res.token_ids and res.token_ids[-1] in req.params.stop_token_ids:
            finish["matched"] = res.token_ids[-1]
        elif res.finish_reason == "abort":
            finish["message"] = "aborted"
        meta = {
            "id": res.rid,
            "finish_reason": finish,
            "prompt_tokens": len(req.prompt_ids),
            "completion_tokens": len(res.token_ids),
            "weight_version": str(res.weight_version),
            "output_token_weight_versions": res.weight_versions,
        }
        if want_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(res.log_probs, res.token_ids)]
            if res.top_token_ids:  # as SGLang: per token, [[logprob, token_id, null], ...]
                meta["output_top_logprobs"] = [[[lp, t, None] for lp, t in zip(lps, ids)]
                                               for ids, lps in zip(res.top_token_ids, res.top_log_probs)]
        return {"text": self._text(res, req.params), "output_ids": res.token_ids, "meta_info": meta}

    async def _score(self, prompts: list[list[int]], sps: list[dict], body: dict) -> list[dict]:
        """Zero new tokens: the input log-probs of each prompt (SGLang's prefill-only scoring)."""
        if not body.get("return_logprob", False):
            raise BadRequest("max_new_tokens 0 generates nothing: add \"return_logprob\": true to score the input")
        start = _field(body, "logprob_start_len", int, 0)
        temps = [_field(sp, "temperature", float, 1.0) for sp in sps]
        scored = [await asyncio.to_thread(self.engine.score, [p], t) for p, t in zip(prompts, temps)]
        out = []
        for ids, (lps,) in zip(prompts, scored):
            first = max(start, 0)
            meta = {"id": uuid.uuid4().hex, "finish_reason": {"type": "length", "length": 0},
                    "prompt_tokens": len(ids), "completion_tokens": 0, "weight_version": str(self.engine.weight_version),
                    "input_token_logprobs": [[lp, t, None] for lp, t in zip(lps[first:], ids[first:])],
                    "output_token_logprobs": []}
            out.append({"text": "", "output_ids": [], "meta_info": meta})
        return out

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await _json(request)
        path = _field(body, "model_path", str)
        if not path or not sorted(Path(path).glob("*.safetensors")):
            return web.json_response(
                {"success": False, "message": f"model_path {path!r} has no *.safetensors files"}, status=400)
        version = body.get("weight_version")
        version = int(version) if version is not None else self.engine.weight_version + 1

        def load() -> None:
            tensors: dict[str, torch.Tensor] = {}
            for f in sorted(Path(path).glob("*.safetensors")):
                tensors.update(load_file(f))
            self.engine.update_weights(tensors, version)

        try:
            await asyncio.to_thread(load)
        except (KeyError, RuntimeError, OSError) as e:
            return web.json_response({"success": False, "message": f"update_weights_from_disk: {e}"}, status=400)
        return web.json_response({"success": True, "message": f"loaded {path}", "weight_version": str(version)})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await _json(request)
        if body.get("abort_all"):
            self.engine.abort()
        elif body.get("rid"):
            self.engine.abort(str(body["rid"]))
        else:
            raise BadRequest("give 'rid' or 'abort_all': true")
        return web.json_response({})

    async def health(self, request: web.Request) -> web.Response:
        ok = self.engine.health()
        return web.Response(status=200 if ok else 503, text="ok" if ok else "unhealthy")

    async def get_load(self, request: web.Request) -> web.Response:
        """SGLang's load report (one data-parallel rank): requests running and waiting."""
        return web.json_response([{"dp_rank": 0, **self.engine.load()}])

    async def flush_cache(self, request: web.Request) -> web.Response:
        return web.Response(text="the engine keeps no prefix cache across requests; nothing to flush")

    async def release_memory(self, request: web.Request) -> web.Response:
        await asyncio.to_thread(self.engine.sleep)
        return web.json_response({"success": True})

    async def resume_memory(self, request: web.Request) -> web.Response:
        await asyncio.to_thread(self.engine.wake)
        return web.json_response({"success": True, "message": "push weights with /update_weights_from_disk"})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.model_name, "is_generation": True,
                                  "weight_version": str(self.engine.weight_version)})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                              "owned_by": "rlvr"}]})

    # ---- OpenAI ---------------------------------------------------------------------------
    def _encode(self, text, name: str) -> list[int]:
        if not isinstance(text, str) or not text:
            raise BadRequest(f"field {name!r} must be a non-empty string")
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _openai_params(self, body: dict) -> tuple[SamplingParams, int]:
        key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        params = sampling_params(body, self.tokenizer.eos_token_id, max_tokens_key=key, seed_key="seed", default_max=16)
        return params, _field(body, "n", int, 1)

    async def _complete(self, prompts: list[list[int]], params: SamplingParams, n: int) -> list[GenerateResult]:
        reqs = [GenerateRequest(p, params, rid=uuid.uuid4().hex) for p in prompts for _ in range(n)]
        return await self.engine.generate(reqs)

    @staticmethod
    def _usage(prompts: list[list[int]], n: int, results: list[GenerateResult]) -> dict:
        prompt = sum(len(p) for p in prompts) * n
        completion = sum(len(r.token_ids) for r in results)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def completions(self, request: web.Request) -> web.Response:
        body = await _json(request)
        raw = body.get("prompt")
        if isinstance(raw, str):
            prompts = [self._encode(raw, "prompt")]
        elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
            prompts = [raw]
        elif isinstance(raw, list) and raw and all(isinstance(x, (str, list)) for x in raw):
            prompts = [self._encode(x, "prompt") if isinstance(x, str) else x for x in raw]
        else:
            raise BadRequest("field 'prompt' must be a string, a list of strings or token ids")

        def choice(i: int, r: GenerateResult, params: SamplingParams) -> dict:
            logprobs = None
            if body.get("logprobs") is not None:
                logprobs = {"tokens": [self.tokenizer.decode([t]) for t in r.token_ids], "token_logprobs": r.log_probs}
            return {"index": i, "text": self._text(r, params), "finish_reason": r.finish_reason, "logprobs": logprobs}

        return await self._answer(request, body, prompts, None, ("cmpl-", "text_completion", "text_completion"), choice)

    async def chat_completions(self, request: web.Request) -> web.Response:
        body = await _json(request)
        messages = body.get("messages")
        if not (isinstance(messages, list) and messages
                and all(isinstance(m, dict) and "role" in m and ("content" in m or "tool_calls" in m) for m in messages)):
            raise BadRequest("field 'messages' must be a non-empty list of {role, content} objects")
        if not getattr(self.tokenizer, "chat_template", None):
            raise BadRequest("this model's tokenizer has no chat template; use /v1/completions")
        tools = body.get("tools")
        text = self.tokenizer.apply_chat_template([template_message(m) for m in messages], tools=tools,
                                                  tokenize=False, add_generation_prompt=True)
        prompts = [self._encode(text, "messages")]

        def choice(i: int, r: GenerateResult, params: SamplingParams) -> dict:
            content = self._text(r, params)
            plain, calls = split_tool_calls(content) if tools else (content, [])
            message = {"role": "assistant", "content": plain}
            if calls:  # Hermes <tool_call> blocks as OpenAI tool calls
                message["tool_calls"] = [openai_tool_call(c) for c in calls]
            finish = "tool_calls" if calls and r.finish_reason == "stop" else r.finish_reason
            out = {"index": i, "message": message, "finish_reason": finish}
            if body.get("logprobs"):
                out["logprobs"] = {"content": [{"token": self.tokenizer.decode([t]), "logprob": lp}
                                               for t, lp in zip(r.token_ids, r.log_probs)]}
            return out

        return await self._answer(request, body, prompts, tools, ("chatcmpl-", "chat.completion", "chat.completion.chunk"),
                                  choice)

    async def _answer(self, request: web.Request, body: dict, prompts: list[list[int]], tools, kind: tuple[str, str, str],
                      choice: Callable[[int, GenerateResult, SamplingParams], dict]) -> web.StreamResponse:
        """One OpenAI answer of either route: streamed (``_stream``), or whole with ``choice(i, result,
        params)`` for each of its choices. ``kind``: the id's prefix, the answer's object, a chunk's object."""
        params, n = self._openai_params(body)
        prefix, whole, chunk = kind
        if body.get("stream"):
            return await self._stream(request, prompts, params, n, chunk, tools)
        results = await self._complete(prompts, params, n)
        return web.json_response({"id": prefix + uuid.uuid4().hex, "object": whole, "created": int(time.time()),
                                  "model": self.model_name, "choices": [choice(i, r, params) for i, r in enumerate(results)],
                                  "usage": self._usage(prompts, n, results)})

    async def _stream(self, request: web.Request, prompts: list[list[int]], params: SamplingParams, n: int,
                      kind: str, tools) -> web.StreamResponse:
        """``stream: true`` on either route: server-sent chunks of every choice as the engine samples
        its tokens (choices interleaved, each with its ``index``), then ``[DONE]``. ``kind`` is the
        chunk object: ``text_completion`` (``choices[].text``) or ``chat.completion.chunk``
        (``choices[].delta``: role, content -- text inside a ``<tool_call>`` block is held back and
        sent as ``tool_calls`` at the end -- and the finish reason). The last chunk carries ``usage``."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        events = _Events(resp, kind, self.model_name)
        results: list[GenerateResult | None] = [None] * (len(prompts) * n)
        usage = lambda: self._usage(prompts, n, results)  # noqa: E731 - read once every choice is in
        choices = enumerate(p for p in prompts for _ in range(n))
        await asyncio.gather(*(self._stream_choice(events, i, p, params, tools, results, usage) for i, p in choices))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _stream_choice(self, events: _Events, i: int, prompt: list[int], params: SamplingParams, tools,
                             results: list[GenerateResult | None], usage: Callable[[], dict]) -> None:
        """Choice ``i`` of a streamed answer: its text deltas as the engine samples, the held-back tool
        calls, then its finish reason (with ``usage()`` on the answer's last chunk)."""
        from rlvr.engine.streaming import TextStream

        chat = events.chat
        holds = params.stop + (("<tool_call>",) if chat and tools else ())
        text, tokens, reason = TextStream(self.tokenizer, holds), [], "length"
        if chat:
            await events.send(i, {"role": "assistant", "content": ""})
        async for piece in self.engine.stream(GenerateRequest(prompt, params, rid=uuid.uuid4().hex)):
            tokens += piece.token_ids
            reason = piece.finish_reason or reason
            if piece.token_ids and (delta := text.push(piece.token_ids)):
                await events.send(i, {"content": delta})
        result = GenerateResult("", tokens, [], reason, 0)
        content = self._text(result, params)
        plain, calls = split_tool_calls(content) if chat and tools else (content, [])
        if rest := text.rest(plain):
            await events.send(i, {"content": rest})
        for k, c in enumerate(calls):
            await events.send(i, {"tool_calls": [openai_tool_call(c, k)]})
        finish = "tool_calls" if calls and reason == "stop" else reason
        results[i] = result
        if sum(r is not None for r in results) < len(results):
            await events.send(i, {}, finish)
        else:
            await events.send(i, {}, finish, usage=usage())


class _Events:
    """The server-sent chunks of one streamed answer; ``send`` writes one choice's delta as a chunk of
    ``kind`` (``text_completion``: the delta's content as ``text``; else ``chat.completion.chunk``)."""

    def __init__(self, resp: web.StreamResponse, kind: str, model: str):
        self.resp, self.kind, self.model = resp, kind, model
        self.chat = kind != "text_completion"
        self.id, self.created = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex, int(time.time())
        self.lock = asyncio.Lock()

    async def send(self, i: int, delta: dict, reason=None, **extra) -> None:
        body = {"delta": delta} if self.chat else {"text": delta.get("content", ""), "logprobs": None}
        choice = {"index": i, "finish_reason": reason, **body}
        chunk = {"id": self.id, "object": self.kind, "created": self.created, "model": self.model, "choices": [choice],
                 **extra}
        async with self.lock:
            await self.resp.write(f"data: {json.dumps(chunk)}\n\n".encode())


async def _json(request: web.Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


@web.middleware
async def _errors(request: web.Request, handler):
    """A bad payload is the client's to fix: 400 with the message; anything else is logged and 500."""
    try:
        return await handler(request)
    except BadRequest as e:
        return web.json_response({"error": {"message": str(e), "type": "invalid_request_error"}}, status=400)
    except ValueError as e:  # the engine refused a request (e.g. stop strings without a tokenizer)
        return web.json_response({"error": {"message": str(e), "type": "invalid_request_error"}}, status=400)
    except web.HTTPException:
        raise
    except Exception as e:
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response({"error": {"message": repr(e), "type": "server_error"}}, status=500)
