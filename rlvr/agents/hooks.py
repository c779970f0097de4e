"""slime's two customisation hooks, with slime's shapes.

``--custom-generate-function-path module:fn`` replaces the engine call of *one sample*::

    async def generate(args, sample, sampling_params) -> Sample      # slime's signature
        ctx = rlvr.agents.context()     # ctx.engine: EngineHandle (this sample's session), ctx.tokenizer, ctx.turns
        ...

It runs wherever ``Rollout.run_group`` runs: sync, eval, ``--async`` (the producer's thread) and
``--ray`` (the rollout manager actor). The rollout grades the samples whose ``reward`` the
function left ``None`` (an environment may set it), then shapes and trains them as any other.
``sampling_params`` is an SGLang-style dict; its ``max_new_tokens`` is the budget of the *whole*
response (all turns: ``--rollout-max-response-len``).

``--rollout-function-path module:fn`` replaces the whole rollout::

    def generate_rollout(args, rollout_id, data_source, evaluation=False)
        -> list[list[Sample]] | (list[list[Sample]], metrics dict)

(async allowed). In training it returns ``--rollout-batch-size`` groups of
``--n-samples-per-prompt`` samples; in eval (``evaluation=True``, ``rollout_id`` None) the
``data_source`` is an ``EvalData`` of the set's records and it returns the samples (groups or a
flat list). Samples left ungraded are graded with the configured reward. Under ``--async`` a
thread calls it for the next rollouts ahead, within ``--max-staleness``
(``rlvr.rollout.producer.RolloutFunctionProducer``); under ``--ray`` it runs on the rollout manager.

``args`` is what the builder hands the agent (``rlvr.runtime.plugins.slime_args``: the run's config
by group, ``args.rollout.rollout_batch_size``, and by slime's flat names,
``args.n_samples_per_prompt``); the agent passes it on and reads nothing from it. What the agent
itself reads comes through its constructor: the agent group and the few values of other groups
it needs.

Abort and partial rollout: a multi-turn sample that comes back ``ABORTED`` (the rollout stopped
its groups, or a weight push under ``--async``) is **regenerated from its prompt** the next
time its group runs (``metadata["agent_regenerated"]`` counts it), never continued: a turn cut
in the middle could leave a half tool call whose observation was never appended, and the
function's own state (tool results, environment) is gone. So no sample is trained with a
broken mask; ``--mask-offpolicy-in-partial-rollout`` is moot for these samples.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import threading
from dataclasses import dataclass
from typing import Callable

from rlvr.agents.agent_context import _CONTEXT, AgentContext, call_maybe_async, sampling_dict
from rlvr.agents.contract import FailureLog, check_failure_limit, check_signature, checked_sample, hook_name, reset
from rlvr.agents.session import EngineHandle
from rlvr.config.agent import AgentConfig
from rlvr.engine.base import SamplingParams
from rlvr.core.errors import ConfigError
from rlvr.engine.sampling import request_seed
from rlvr.core.registry import load_function
from rlvr.core.types import Sample, Status

log = logging.getLogger(__name__)


async def _awaited(x):
    return await x


class Agent:
    """The hooks of one rollout: which function generates a sample, or the whole rollout.

    Complete when built: ``tools`` are the loaded ``--tools`` (the builder loads them once, and
    renders the prompts with their schemas: ``rlvr.runtime.build.make_agent``; default: loaded
    here from the flag). The rollout that calls the agent passes itself with each call (what
    ``context().rollout`` is), so neither holds the other.

    ``config`` is the agent group; ``args`` what the user's functions get first (passed on, never
    read here); ``chat_template`` the chat template's options with ``--apply-chat-template``
    (``{}``: none) and None without it; ``max_response_len`` the OpenAI proxy's budget per sample
    (``--rollout-max-response-len``); ``failure_value`` the reward of a sample whose hook failed
    (``--reward-failure-value``); ``sandbox_limits`` the python tool's limits (the ``code``
    reward's ``--code-*``; None: its defaults)."""

    def __init__(self, config: AgentConfig, engine, tokenizer, args=None, *, tools: dict[str, Callable] | None = None,
                 eval_function_path: str | None = None, chat_template: dict | None = None,
                 max_response_len: int, failure_value: float = 0.0, sandbox_limits=None):
        a = config
        self.config, self.args, self.engine, self.tokenizer = config, args, engine, tokenizer
        self.chat_template, self.max_response_len = chat_template, max_response_len
        self.generate_fn: Callable | None = None
        self.rollout_fn = _hook(a.rollout_function_path, "--rollout-function-path")
        # slime's --eval-function-path: the rollout function of evaluation only (default the one above)
        self.eval_fn = _hook(eval_function_path, "--eval-function-path") or self.rollout_fn
        self.turns, self.tools, self.tool_processes = None, {}, None
        self.failures = FailureLog(hook_name(a), failure_value) if a.per_sample else None
        self._proxy_lock, self._open_sessions = threading.Lock(), {}
        if a.tools or a.environment_path or a.environment or chat_template is not None:
            from rlvr.agents.turns import ChatTurns

            schemas = None  # what the chat template renders; ``tools`` stays the callables given
            if a.tools:
                from rlvr.agents.tools import load_tools, tool_schemas

                self.tools = tools if tools is not None else load_tools(a.tools)
                if a.tool_executor == "process":  # sync tools in worker processes killed at --tool-timeout
                    from rlvr.agents.tool_runner import ProcessTools
                    from rlvr.agents.tools import check_process_tools

                    check_process_tools(self.tools)
                    self.tool_processes = ProcessTools()
                for tool in self.tools.values():
                    if hasattr(tool, "configure") and sandbox_limits is not None:  # the python tool
                        tool.configure(sandbox_limits)
                schemas = tool_schemas(self.tools)
            # Refuses at start-up a template that is not prefix-preserving for tool/user turns.
            self.turns = ChatTurns(tokenizer, schemas, chat_template)
        if a.custom_generate_function_path:
            self.generate_fn = _hook(a.custom_generate_function_path, "--custom-generate-function-path")
        elif a.tools:
            from rlvr.agents.tools import generate_with_tools

            self.generate_fn = generate_with_tools
        elif a.environment_path:
            from rlvr.agents.environment import generate_with_environment

            self.generate_fn = generate_with_environment
        elif a.environment:
            from rlvr.environments import generate_function

            self.generate_fn = generate_function(a.environment)

    def close(self) -> None:
        """Stop what the agent started: the ``--tool-executor process`` workers."""
        if self.tool_processes is not None:
            self.tool_processes.close()

    @property
    def proxy(self):
        if getattr(self, "_proxy", None) is None:
            from rlvr.agents.openai_proxy import OpenAIProxy
            from rlvr.agents.turns import ChatTurns

            cache: dict[str, ChatTurns] = {}

            def turns(tools):
                key = json.dumps(tools, sort_keys=True)
                if key not in cache:
                    cache[key] = ChatTurns(self.tokenizer, tools, self.chat_template)
                return cache[key]

            self._proxy = OpenAIProxy(self.engine, self.tokenizer, turns)
            # The openai client's httpx logs one INFO line per request: one per turn of every sample.
            if logging.getLogger("httpx").level == logging.NOTSET:
                logging.getLogger("httpx").setLevel(logging.WARNING)
        return self._proxy

    def openai_session(self, handle: EngineHandle) -> str:
        with self._proxy_lock:
            if handle.session not in self._open_sessions:
                self._open_sessions[handle.session] = self.proxy.open(handle, self.max_response_len)
            return self._open_sessions[handle.session]

    def _context(self, rollout, handle: EngineHandle | None) -> AgentContext:
        return AgentContext(self.args, handle, self.tokenizer, self.turns, rollout, self)

    # ---- per sample ---------------------------------------------------------------------------
    async def generate_group(self, rollout, group: list[Sample], params: SamplingParams) -> None:
        """Run the generate function on every sample of ``group`` that has no finished response
        (new, or aborted: regenerated from its prompt), concurrently, in place; ``rollout`` is the
        calling ``Rollout`` (``context().rollout``; None: no per-sample seed)."""
        todo = [i for i, s in enumerate(group) if not s.response_ids or s.status == Status.ABORTED]
        for i in todo:
            if group[i].response_ids:
                group[i].metadata["agent_regenerated"] = group[i].metadata.get("agent_regenerated", 0) + 1
            reset(group[i])  # also an aborted sample that had no token yet: status back to COMPLETED
        done = await asyncio.gather(*(self._one(rollout, group[i], params) for i in todo))
        for i, s in zip(todo, done):
            group[i] = s

    async def _one(self, rollout, s: Sample, params: SamplingParams) -> Sample:
        """One sample through the generate function. A failure of the function (it raised, or
        returned a bad sample: ``rlvr.agents.contract``) fails this sample only; a ConfigError
        (a setting every sample would trip over) stops the run."""
        handle = EngineHandle(self.engine, self.tokenizer, session=s.uid or f"i{s.index}")
        token = _CONTEXT.set(self._context(rollout, handle))
        try:
            if rollout is not None:  # the sample's own seed (its turns: EngineHandle), by identity
                params = dataclasses.replace(params, seed=request_seed(rollout.sample_seed(s),
                                                                       s.metadata.get("agent_regenerated", 0)))
            out = await call_maybe_async(self.generate_fn, self.args, s, sampling_dict(params))
            if handle.session in self._open_sessions and isinstance(out, Sample) and not out.response_ids:
                self.proxy.fill(handle.session, out)  # an OpenAI-client agent: its recorded calls are the sample
            if handle.aborted and isinstance(out, Sample):
                out.status = Status.ABORTED  # a turn was cut: the sample is regenerated, never trained
            out = checked_sample(out, s, self.failures.where, params.max_new_tokens, self.tokenizer)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - a user's hook: contained, counted and logged
            if handle.aborted:  # it tripped over a cut turn: regenerated like any aborted sample
                reset(s)
                s.status = Status.ABORTED
                return s
            return self.failures.fail(s, e)
        finally:
            _CONTEXT.reset(token)
            if self._open_sessions.pop(handle.session, None) is not None:
                self.proxy.close(handle.session)
        if handle.aborted:
            out.status = Status.ABORTED  # (a list of one sample, unpacked by the check)
        out.metadata.setdefault("turns", sum(1 for _, _, t in out.segments() if t))
        return out

    def check_failures(self, samples: list[Sample], what: str) -> None:
        """Stop the run when more than --agent-failure-limit of ``samples`` failed in the hook."""
        if self.failures is not None:
            check_failure_limit(samples, what, self.config.agent_failure_limit, self.failures.where)

    # ---- the whole rollout --------------------------------------------------------------------
    def run_rollout(self, rollout, rollout_id: int | None, data_source, evaluation: bool = False):
        """(groups, metrics) from ``--rollout-function-path``, its ungraded samples graded by
        ``rollout``'s grader (``rollout``: the calling ``Rollout``, ``context().rollout``)."""
        token = _CONTEXT.set(self._context(rollout, None))
        try:  # a plain function runs outside any event loop (slime's runs its own, as this one may)
            fn = self.eval_fn if evaluation else self.rollout_fn
            out = fn(self.args, rollout_id, data_source, evaluation=evaluation)
            if inspect.isawaitable(out):
                out = asyncio.run(_awaited(out))
        finally:
            _CONTEXT.reset(token)
        groups, metrics = (out if isinstance(out, tuple) else (getattr(out, "samples", out), getattr(out, "metrics", None)))
        groups = [g if isinstance(g, list) else [g] for g in groups]

        async def grade():
            ungraded = [[s for s in g if s.reward is None] for g in groups]
            await asyncio.gather(*(rollout.grader.grade_group(g) for g in ungraded if g))

        asyncio.run(grade())
        for g in groups:
            for s in g:
                s.check()
                s.metadata.setdefault("score", s.scalar_reward())
        return groups, dict(metrics or {})


def _hook(path: str | None, flag: str) -> Callable | None:
    """The user function ``path`` of ``flag``, its signature checked (``rlvr.agents.contract``)."""
    if path is None:
        return None
    fn = load_function(path, flag)
    check_signature(fn, flag, path)
    return fn


@dataclass
class EvalData:
    """The ``data_source`` of a rollout function in eval: one held-out set."""

    name: str
    records: list
    n_samples_per_prompt: int
