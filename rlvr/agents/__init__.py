"""Multi-turn, tool-using and agentic rollouts (docs/agents.md).

- ``rlvr.core.types.Sample.append_segment``: a response as model segments (loss mask 1, engine
  log-probs) and environment/tool segments (loss mask 0).
- ``turns.ChatTurns``: token-in/token-out turns (only new environment text is tokenized).
- ``session.EngineHandle``: generate from token ids with log-probs, one session per sample.
- ``agent_context``: ``context()``, what a user's function sees of its rollout.
- ``hooks``: ``--custom-generate-function-path`` and ``--rollout-function-path`` (slime's shapes);
  ``context()`` inside them gives the engine handle, the tokenizer and the chat turns.
- ``tools``: ``--tools`` (schemas from type hints, Hermes ``<tool_call>`` parsing, sandboxed Python).
- ``environment``: ``--environment-path`` (``reset`` / ``step``).

Names are imported lazily, so importing the package loads none of its modules.
"""

from __future__ import annotations

_LAZY = {"context": "agent_context", "AgentContext": "agent_context", "EvalData": "hooks", "EngineHandle": "session",
         "ChatTurns": "turns", "tool_schema": "tools", "parse_tool_calls": "tools", "python_tool": "tools"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"rlvr.agents.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'rlvr.agents' has no attribute {name!r}")


__all__ = sorted(_LAZY)
