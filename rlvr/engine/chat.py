"""The OpenAI chat format over a chat-template model, shared by ``rlvr serve`` and the agents'
recording proxy: messages as the template renders them, and Hermes ``<tool_call>`` blocks in a
model turn parsed into OpenAI tool calls.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOL_CALL_END = "</tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: dict
    error: str | None = None  # malformed: the observation is this error


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>{json}</tool_call>`` of a model turn, in order; a malformed one is a
    ``ToolCall`` with ``error`` set (the model is told, the rollout goes on).

    >>> [c.name for c in parse_tool_calls('x <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')]
    ['add']
    >>> parse_tool_calls('<tool_call>{"name": add}</tool_call>')[0].error[:19]
    'malformed tool call'
    """
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            obj = json.loads(body.strip())
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise ValueError('expected {"name": ..., "arguments": {...}}')
            args = obj.get("arguments", {})
            if isinstance(args, str):  # some models write the arguments as a JSON string
                args = json.loads(args)
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
            calls.append(ToolCall(obj["name"], args))
        except (ValueError, json.JSONDecodeError) as e:
            calls.append(ToolCall("", {}, f"malformed tool call: {type(e).__name__}: {e}"))
    return calls


def template_message(m: dict) -> dict:
    """The message as the chat template renders it (tool calls as Hermes blocks, in Qwen's style)."""
    out = {"role": m["role"], "content": m.get("content") or ""}
    if m.get("name"):
        out["name"] = m["name"]
    if m.get("tool_calls"):
        out["tool_calls"] = [{"type": "function", "function": {
            "name": c["function"]["name"],
            "arguments": json.loads(c["function"]["arguments"]) if isinstance(c["function"]["arguments"], str)
            else c["function"]["arguments"]}} for c in m["tool_calls"]]
    return out


def split_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(the turn's text without its tool-call blocks, its well-formed calls); the text is
    returned whole when it has no well-formed call.

    >>> split_tool_calls('ok <tool_call>{"name": "f", "arguments": {}}</tool_call>')[0]
    'ok'
    """
    calls = [c for c in parse_tool_calls(text) if c.error is None]
    return (TOOL_CALL.sub("", text).strip() if calls else text), calls


def openai_tool_call(call: ToolCall, index: int | None = None) -> dict:
    """One call as an OpenAI ``tool_calls`` entry (with ``index`` in a streamed delta)."""
    out = {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
           "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
    return out if index is None else {"index": index, **out}
