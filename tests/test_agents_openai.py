"""Agents written with the official ``openai`` client: the recording OpenAI-compatible
rollout endpoint turns their calls (tool calls, a streamed call) into an exact multi-turn sample."""

from __future__ import annotations

import asyncio
import json

import pytest

openai = pytest.importorskip("openai")

from rlvr.agents import context  # noqa: E402
from rlvr.core.testing import RUN_SILENT_ENV  # noqa: E402
from rlvr.core.types import Status  # noqa: E402

TOOL_SCHEMAS = [{"type": "function", "function": {
    "name": "multiply", "description": "Multiply two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


async def openai_agent(args, sample, sampling_params):
    """An ordinary chat-completions agent: ask, run any tool calls, ask again (streamed)."""
    ctx = context()
    client = openai.AsyncOpenAI(base_url=ctx.openai_base_url, api_key="rlvr", max_retries=0)
    messages = ctx.messages(sample)  # the data's messages: sample.prompt is already templated
    first = await client.chat.completions.create(model="policy", messages=messages, tools=TOOL_SCHEMAS,
                                                 max_tokens=sampling_params["max_new_tokens"] // 4,
                                                 temperature=sampling_params["temperature"])
    msg = first.choices[0].message
    messages.append(msg.model_dump(exclude_none=True))
    if msg.tool_calls:
        for call in msg.tool_calls:
            a = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(a["a"] * a["b"])})
    else:
        messages.append({"role": "user", "content": "Check it."})
    stream = await client.chat.completions.create(model="policy", messages=messages, tools=TOOL_SCHEMAS, stream=True,
                                                  max_tokens=sampling_params["max_new_tokens"] // 4,
                                                  temperature=sampling_params["temperature"])
    text, finish = "", None
    async for chunk in stream:
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    sample.metadata["streamed"] = text
    sample.status = Status.TRUNCATED if finish == "length" else Status.COMPLETED
    return sample  # left empty: the endpoint's recording fills it


def test_openai_client_tool_calls_and_streaming_become_an_exact_sample(tiny_qwen2):
    """Against a scripted engine: the first call returns a tool call (parsed into
    ``message.tool_calls``), the second is streamed; the sample continues token-in/token-out."""
    from tests.support import agent_rollout

    call = '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>'
    rollout, engine, tok = agent_rollout(tiny_qwen2, [call, "It is 408."], tools=None,
                                  custom_generate_function_path="tests.test_agents_openai:openai_agent")
    group = rollout.next_groups(1)[0]
    asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))
    for s in group:
        s.check()
        segs = s.segments()
        assert [t for _, _, t in segs] == [True, False, True] and s.metadata["turns"] == 2
        assert s.metadata["streamed"] == "It is 408." and s.metadata["openai_calls"] == 2
        assert s.response_ids[: segs[0][1]] == tok(call, add_special_tokens=False)["input_ids"]  # the engine's ids
        assert "<|im_start|>tool\n408<|im_end|>" in s.response  # the tool result, as the template renders it
        assert engine.prompts[-1] == s.prompt_ids + s.response_ids[: segs[2][0]]  # turn 2 = exact ids of turn 1 + delta
        assert s.rollout_log_probs[segs[0][0]:segs[0][1]] == [-0.5] * segs[0][1] and s.status == Status.COMPLETED
        # counted as the --tools loop counts its calls (rollout/tool_calls/*)
        assert (s.metadata["tool_calls"], s.metadata["tool_errors"], s.metadata["tool_counts"]) == (1, 0, {"multiply": 1})


def test_a_prompt_templated_twice_is_refused_with_what_to_send(tiny_qwen2):
    """``sample.prompt`` under --apply-chat-template is already rendered: sent as a user message it
    would be rendered twice, silently. The endpoint answers 400 saying what to send; the sample
    fails (contained, with that message), the rollout goes on."""
    from tests.support import agent_rollout

    rollout, engine, _ = agent_rollout(tiny_qwen2, ["It is 408."], tools=None,
                                custom_generate_function_path="tests.test_agents_openai:templated_twice")
    group = rollout.next_groups(1)[0]
    asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))
    assert engine.prompts == [] and all(s.status == Status.FAILED for s in group)
    error = group[0].metadata["agent_error"]
    assert "holds the chat template's '<|im_start|>user'" in error and "context().messages(sample)" in error


async def templated_twice(args, sample, sampling_params):
    client = openai.AsyncOpenAI(base_url=context().openai_base_url, api_key="rlvr", max_retries=0)
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": sample.prompt}])
    return sample


def test_streaming_is_token_by_token_and_recorded_exactly(tiny_qwen2):
    """Against the real embedded engine: a streamed call's content arrives in many chunks while
    the engine is still decoding (its step counter moves between chunks), and the recorded tokens
    equal a non-streamed call's (greedy)."""
    from rlvr.agents.session import EngineHandle
    from rlvr.runtime.build import load_tokenizer, make_agent
    from rlvr.config import Config
    from rlvr.engine.local.embedded import EmbeddedEngine

    tok = load_tokenizer(str(tiny_qwen2))
    engine = EmbeddedEngine(str(tiny_qwen2), pad_token_id=tok.pad_token_id, tokenizer=tok)
    cfg = Config()
    cfg.data.apply_chat_template = True
    agent = make_agent(cfg, engine, tok)
    messages = [{"role": "user", "content": "What is 2*3?"}, {"role": "assistant", "content": "",
                "tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "multiply", "arguments": '{"a": 2, "b": 3}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "6"}]

    async def call(stream: bool, session: str):
        handle = EngineHandle(engine, tok, session)
        client = openai.AsyncOpenAI(base_url=agent.openai_session(handle), api_key="rlvr", max_retries=0)
        kw = dict(model="policy", messages=messages, tools=TOOL_SCHEMAS, max_tokens=40, temperature=0.0)
        if not stream:
            out = await client.chat.completions.create(**kw)
            return out.choices[0].message.content, [], handle.session
        chunks, steps = [], []
        async for chunk in await client.chat.completions.create(stream=True, **kw):
            if chunk.choices and chunk.choices[0].delta.content:
                chunks.append(chunk.choices[0].delta.content)
                steps.append(engine.steps)
        return "".join(chunks), steps, handle.session

    async def both():
        return await call(True, "streamed"), await call(False, "whole")

    (text, steps, s1), (whole_text, _, s2) = asyncio.run(both())
    streamed, whole = agent.proxy.sessions[s1], agent.proxy.sessions[s2]
    print(f"streamed {len(steps)} content chunks at engine steps {steps}: {text!r}")
    assert len(steps) >= 4 and steps[0] < steps[-1]  # sent as decoded, not all at the end
    assert text == whole_text and streamed.segments == whole.segments  # same ids, log-probs, versions
    assert streamed.segments[0][2] and len(streamed.segments[0][2]) == len(streamed.segments[0][0])


@pytest.mark.slow
def test_openai_agent_trains_two_rollouts_with_exact_log_probs(tiny_qwen2, arith_files, tmp_path, monkeypatch):
    """2 turns, the second streamed token by token, through the CLI: 2 rollouts, exact log-probs."""
    # the tiny model's rollouts may have no reward variance at all: run every sample's forward, whose numbers this checks
    monkeypatch.setenv(RUN_SILENT_ENV, "1")
    from tests.support import train_openai_agent

    train_rows, samples = train_openai_agent(tiny_qwen2, arith_files[0], tmp_path / "run")
    diffs = [r["train/train_rollout_logprob_abs_diff"] for r in train_rows]
    print("openai agent: mean |trainer - engine| log-prob per rollout:", diffs)
    assert all(d < 1e-5 for d in diffs)  # on-policy, one step per rollout: p0 == q on the model tokens
    for s in samples:
        assert s.metadata["streamed"] in s.response  # the streamed text is the recorded turn's
