"""What a user's generate or rollout function sees of the rollout: ``rlvr.agents.context()``.

The rollout (``rlvr.agents.hooks.Agent``) sets it around each call of a user's function; the
helpers that run inside such a call (tools, environments, the OpenAI proxy) read it here.
"""

from __future__ import annotations

import contextvars
import copy
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from rlvr.agents.session import EngineHandle
from rlvr.core.errors import ConfigError
from rlvr.core.types import Sample
from rlvr.engine.base import SamplingParams


@dataclass
class AgentContext:
    """What a generate / rollout function may use (``rlvr.agents.context()``)."""

    args: Any  # what the hook got as ``args``: the config by group and by slime's flat names
    engine: EngineHandle | None  # this sample's session (None inside a rollout function: make one with new_handle)
    tokenizer: Any
    chat_turns: Any  # ChatTurns with --apply-chat-template (or --tools / --environment-path), else None
    rollout: Any  # the Rollout: grader, new_group / next_groups, sampling_params()
    agent: Any = None  # the Agent

    @property
    def cfg(self):
        """The same view as ``args`` (the name this field had)."""
        return self.args

    @property
    def turns(self):
        """``ChatTurns``: the token ids of observations after a model turn (token-in/token-out)."""
        if self.chat_turns is None:
            raise ConfigError("--apply-chat-template", "context().turns renders observations with the chat template, "
                                                       "so the run needs --apply-chat-template")
        return self.chat_turns

    def messages(self, sample: Sample) -> list[dict]:
        """The sample's prompt as chat messages, what an OpenAI-client agent sends first: the data's
        messages (a text prompt is one user message). Not ``sample.prompt``: with
        --apply-chat-template that is the prompt already rendered by the chat template."""
        messages = sample.metadata.get("prompt_messages")
        if messages is None:  # a sample made outside the rollout (by a rollout function, a test)
            messages = [{"role": "user", "content": sample.prompt}]
        return copy.deepcopy(messages)

    def new_handle(self, session: str = "") -> EngineHandle:
        return EngineHandle(self.agent.engine, self.tokenizer, session)

    @property
    def openai_base_url(self) -> str:
        """Base URL of an OpenAI-compatible endpoint recording this sample's session
        (``rlvr.agents.openai_proxy``): give it to ``openai.AsyncOpenAI(base_url=...)``."""
        if self.engine is None:
            raise RuntimeError("openai_base_url is per sample: use it inside a generate function")
        return self.agent.openai_session(self.engine)

    def session_sample(self, sample: Sample) -> Sample:
        """``sample`` filled with the calls recorded on ``openai_base_url`` (exact ids, log-probs)."""
        return self.agent.proxy.fill(self.engine.session, sample)


_CONTEXT: contextvars.ContextVar[AgentContext] = contextvars.ContextVar("rlvr_agent_context")


def context() -> AgentContext:
    """The calling generate / rollout function's context (slime's ``GenerateState``)."""
    try:
        return _CONTEXT.get()
    except LookupError:
        raise RuntimeError("rlvr.agents.context() is only set inside a generate or rollout function") from None


def sampling_dict(params: SamplingParams) -> dict:
    """SGLang's ``sampling_params`` dict of a ``SamplingParams`` (what slime's functions get)."""
    return {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "max_new_tokens": params.max_new_tokens, "stop_token_ids": list(params.stop_token_ids),
            "stop": list(params.stop), **({"seed": params.seed} if params.seed is not None else {})}


async def call_maybe_async(fn: Callable, *args, **kwargs):
    out = fn(*args, **kwargs)
    return await out if inspect.isawaitable(out) else out


