"""Tools for multi-turn rollouts: schemas from type hints, Hermes tool calls, the built-in loop.

A tool is a plain Python callable (sync or async) with type hints and a docstring::

    def multiply(a: int, b: int) -> int:
        \"\"\"Multiply two integers.

        Args:
            a: the first factor
            b: the second factor
        \"\"\"
        return a * b

``tool_schema`` turns it into the OpenAI / Hermes function schema the chat template renders
(``tokenizer.apply_chat_template(..., tools=[...])``: Qwen's template lists them in the system
prompt). The model calls a tool by writing ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
(Hermes / Qwen format); ``parse_tool_calls`` finds every such call in a model turn.

``generate_with_tools`` is the built-in per-sample loop (``--tools``): generate until the end of
a tool call (stop string ``</tool_call>``) or of the turn; run the calls; append their results as
one environment segment (``role: tool`` messages, token-in/token-out through ``ChatTurns``);
repeat up to ``--max-turns`` model turns within ``--rollout-max-response-len`` tokens for the whole
response. Bad model output is data, not a crash: malformed JSON, an unknown tool, wrong
arguments, a tool that raises or runs past ``--tool-timeout`` each give the model an error
observation (``{"error": ...}``) and count in ``metadata["tool_errors"]`` (``rollout/tool_errors``).
A sync tool runs where the rollout never waits for it past the timeout (``rlvr.agents.tool_runner``:
a thread it abandons, or with ``--tool-executor process`` a worker process it kills).

``python`` is a code-interpreter tool that runs its code in the ``code`` reward's sandbox
(``rlvr.sandbox.runner.run_program``) with the ``--code-*`` limits: the same guarantees (process,
memory, time, file and output limits, no network, dropped privileges when root).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rlvr.agents.tool_runner import ProcessTools, ToolRaised, ToolWorkerFailed, in_thread
from rlvr.core.errors import ConfigError
from rlvr.core.registry import load_object
from rlvr.engine.chat import TOOL_CALL, TOOL_CALL_END, ToolCall, parse_tool_calls  # noqa: F401 (re-exported)
from rlvr.core.types import Sample, Status

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


# ---- schemas ---------------------------------------------------------------------------------
def _json_type(tp: Any) -> dict:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _json_type(args[0]) if len(args) == 1 else {"anyOf": [_json_type(a) for a in args]}
    if origin is typing.Literal:
        values = list(typing.get_args(tp))
        return {"type": _JSON_TYPES.get(type(values[0]), "string"), "enum": values}
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return {"type": "array", **({"items": _json_type(args[0])} if args else {})}
    if origin is dict:
        return {"type": "object"}
    if tp in _JSON_TYPES:
        return {"type": _JSON_TYPES[tp]}
    return {"type": "string"}


def _doc_params(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) from a Google-style (``Args:``) or Sphinx-style
    (``:param x:``) docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    desc, params, in_args, current = [], {}, False, None
    for line in lines:
        stripped = line.strip()
        m = re.match(r":param\s+(\w+):\s*(.*)", stripped)
        if m:
            params[m.group(1)], current = m.group(2), m.group(1)
            continue
        if stripped.lower() in ("args:", "arguments:", "parameters:"):
            in_args = True
            continue
        if in_args:
            m = re.match(r"(\w+)(?:\s*\([^)]*\))?:\s*(.*)", stripped)
            if m and line.startswith((" ", "\t")):
                params[m.group(1)], current = m.group(2), m.group(1)
            elif stripped and current and line.startswith((" ", "\t")):
                params[current] += " " + stripped
            elif stripped.endswith(":") or not stripped:
                in_args = stripped.endswith(":") and False
            continue
        if not params:
            desc.append(line)
    text = "\n".join(desc).strip().split("\n\n")[0].replace("\n", " ")
    return text, params


def tool_schema(fn: Callable) -> dict:
    """The OpenAI function-tool schema of ``fn`` (name, description, JSON-schema parameters).

    >>> def add(a: int, b: int = 0) -> int:
    ...     '''Add two integers.
    ...
    ...     Args:
    ...         a: the first term
    ...         b: the second term
    ...     '''
    >>> s = tool_schema(add)["function"]
    >>> s["name"], s["description"], s["parameters"]["required"], s["parameters"]["properties"]["a"]
    ('add', 'Add two integers.', ['a'], {'type': 'integer', 'description': 'the first term'})
    """
    name = getattr(fn, "__name__", type(fn).__name__)
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "__call__", fn)
    hints = typing.get_type_hints(target)
    description, docs = _doc_params(inspect.getdoc(target) or "")
    props, required = {}, []
    for pname, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        prop = _json_type(hints.get(pname, str))
        if pname in docs:
            prop["description"] = docs[pname]
        props[pname] = prop
        if p.default is inspect.Parameter.empty:
            required.append(pname)
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": props, "required": required}}}


def tool_schemas(tools: dict[str, Callable]) -> list[dict]:
    return [tool_schema(fn) for fn in tools.values()]


TOOLS_EXAMPLE = "my_tools:TOOLS (TOOLS = [multiply, search] in my_tools.py)"


def load_tools(spec: str) -> dict[str, Callable]:
    """``pkg.module:name`` (a list of callables, or one) or a YAML file listing ``pkg.module:fn``
    (a list, or ``{tools: [...]}``), as {name: callable}; names must be unique. Every mistake is a
    ``ConfigError("--tools", ...)`` saying what to give instead."""
    if spec.endswith((".yaml", ".yml")):
        import yaml

        if not Path(spec).is_file():
            raise ConfigError("--tools", f"file not found: {spec}")
        raw = yaml.safe_load(Path(spec).read_text())
        paths = raw.get("tools", []) if isinstance(raw, dict) else raw
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise ConfigError("--tools", f"{spec} must list pkg.module:fn entries (a list, or tools: [...])")
        fns = [load_object(p, "--tools", TOOLS_EXAMPLE) for p in paths]
    else:
        obj = load_object(spec, "--tools", TOOLS_EXAMPLE)
        if isinstance(obj, (dict, set, str, bytes)) or not (callable(obj) or isinstance(obj, (list, tuple))):
            raise ConfigError("--tools", f"{spec!r} is a {type(obj).__name__}: it must be a list of functions "
                                         f"(or one function), e.g. {TOOLS_EXAMPLE}")
        fns = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    tools: dict[str, Callable] = {}
    for fn in fns:
        if not callable(fn):
            raise ConfigError("--tools", f"{spec!r} holds {fn!r}, a {type(fn).__name__}: every entry must be a "
                                         "function (a callable with type hints and a docstring)")
        name = getattr(fn, "__name__", type(fn).__name__)
        if name in tools:
            raise ConfigError("--tools", f"two tools are named {name!r}")
        try:
            tool_schema(fn)
        except Exception as e:  # noqa: BLE001 - a bad annotation: say which tool
            raise ConfigError("--tools", f"cannot build the schema of tool {name!r}: {e}") from None
        tools[name] = fn
    if not tools:
        raise ConfigError("--tools", f"{spec!r} lists no tool")
    return tools


def is_async_tool(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def check_process_tools(tools: dict[str, Callable]) -> None:
    """``--tool-executor process`` sends each sync tool to its worker by reference: it must pickle."""
    import pickle

    for name, fn in tools.items():
        if is_async_tool(fn):
            continue
        try:
            pickle.dumps(fn)
        except Exception as e:  # noqa: BLE001 - a closure, a lambda, a bound method of local state
            raise ConfigError("--tool-executor", f"process: tool {name!r} cannot be sent to a worker process "
                                                 f"({type(e).__name__}: {e}); make it a module-level function, "
                                                 "or use --tool-executor thread") from None


# ---- calls -------------------------------------------------------------------------------------
async def run_tool(tools: dict[str, Callable], call: ToolCall, timeout: float,
                   processes: ProcessTools | None = None) -> tuple[str, bool]:
    """(observation, ok) of one call: the tool's result as text, or an error observation. A sync
    tool runs on a thread that is abandoned at ``timeout``, or in one of ``processes``' workers,
    killed at ``timeout`` (``rlvr.agents.tool_runner``): the rollout never waits past it."""
    if call.error is not None:
        return json.dumps({"error": call.error}), False
    fn = tools.get(call.name)
    if fn is None:
        return json.dumps({"error": f"unknown tool {call.name!r}; available: {sorted(tools)}"}), False
    try:
        inspect.signature(fn).bind(**call.arguments)
    except TypeError as e:
        return json.dumps({"error": f"wrong arguments for {call.name}: {e}"}), False
    try:
        if is_async_tool(fn):
            result = await asyncio.wait_for(fn(**call.arguments), timeout)
        elif processes is not None:
            result = await processes.call(fn, call.arguments, timeout)
        else:
            result = await in_thread(fn, call.arguments, timeout, call.name)
    except asyncio.TimeoutError:
        return json.dumps({"error": f"{call.name} timed out after {timeout} s"}), False
    except ToolRaised as e:  # raised in its worker process
        return json.dumps({"error": f"{call.name} raised {e}"}), False
    except ToolWorkerFailed as e:
        return json.dumps({"error": f"{call.name} could not run: {e}"}), False
    except Exception as e:  # noqa: BLE001 - a tool that raises is an observation
        return json.dumps({"error": f"{call.name} raised {type(e).__name__}: {e}"}), False
    if isinstance(result, ToolResult):
        return result.text, result.ok
    return result if isinstance(result, str) else json.dumps(result), True


@dataclass
class ToolResult:
    """What a tool may return to say it failed without raising (counted as a tool error)."""

    text: str
    ok: bool = True


class PythonTool:
    """``python(code)``: run Python code in the ``code`` reward's sandbox; stdout comes back."""

    __name__ = "python"

    def __init__(self, limits=None, max_chars: int = 2000):
        from rlvr.sandbox.runner import SandboxLimits

        self.limits, self.max_chars = limits or SandboxLimits(), max_chars

    def configure(self, limits) -> None:
        """Run under ``limits`` (a ``SandboxLimits``: the builder passes the ``code`` reward's
        ``--code-*`` ones)."""
        self.limits = limits

    async def __call__(self, code: str) -> ToolResult:
        """Run a Python program and return what it prints.

        Args:
            code: the program's source; print the values you need
        """
        from rlvr.sandbox.runner import run_program

        r = await run_program(code, limits=self.limits)
        out = r.stdout[-self.max_chars:]
        if r.ok:
            return ToolResult(out)
        return ToolResult(json.dumps({"error": r.reason, "stdout": out, "stderr": r.stderr[-self.max_chars:]}), False)


python_tool = PythonTool()
PYTHON = [python_tool]  # --tools rlvr.agents.tools:PYTHON


# ---- the built-in loop ---------------------------------------------------------------------------
async def generate_with_tools(args, sample: Sample, sampling_params: dict) -> Sample:
    """``--tools``: model turn, tool calls, observations, ... (module docstring). Its settings are
    the agent's group (``--max-turns``, ``--tool-timeout``); ``args`` is unused."""
    from rlvr.agents.agent_context import context

    ctx = context()
    tools, turns, a = ctx.agent.tools, ctx.turns, ctx.agent.config
    budget = sampling_params["max_new_tokens"]
    stops = list(sampling_params.get("stop") or []) + [TOOL_CALL_END]
    n_calls = n_errors = 0
    counts: dict[str, int] = {}
    status = Status.COMPLETED
    for turn in range(a.turns_limit):
        left = budget - sample.response_length
        if left <= 0:
            status = Status.TRUNCATED
            break
        out = await ctx.engine.generate(sample.prompt_ids + sample.response_ids,
                                        dict(sampling_params, max_new_tokens=left, stop=stops))
        text = ctx.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        sample.append_segment(out.token_ids, trainable=True, log_probs=out.log_probs,
                              weight_versions=out.weight_versions, text=text)
        if out.finish_reason in ("abort", "error"):
            status = Status.ABORTED if out.finish_reason == "abort" else Status.FAILED
            if out.finish_reason == "error":
                sample.metadata["engine_error"] = out.meta.get("error", "")
            break
        calls = parse_tool_calls(text)
        if not calls:  # a final answer (or the length ran out mid-answer)
            status = Status.TRUNCATED if out.finish_reason == "length" else Status.COMPLETED
            break
        if turn == a.turns_limit - 1:
            status = Status.TRUNCATED  # --max-turns reached with a call pending
            break
        messages = []
        for call in calls:
            obs, ok = await run_tool(tools, call, a.timeout, ctx.agent.tool_processes)
            n_calls += 1
            n_errors += not ok
            if call.name in tools:  # per-tool counts only for tools that exist (the rest are errors)
                counts[call.name] = counts.get(call.name, 0) + 1
            messages.append({"role": "tool", "name": call.name, "content": obs})
        obs_text, obs_ids = turns.observation_ids(messages, out.token_ids)
        if len(obs_ids) >= budget - sample.response_length:  # no room for the observation and a reply
            status = Status.TRUNCATED
            break
        sample.append_segment(obs_ids, trainable=False, text=obs_text)
    sample.status = status
    sample.metadata.update(tool_calls=n_calls, tool_errors=n_errors, tool_counts=counts)
    return sample
