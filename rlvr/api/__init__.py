"""rlvr's public API: what users' plugins import, in one place that does not move.

    from rlvr.api import Sample, Status, context

Names here keep their meaning across releases; where one moves inside the package, this module
keeps serving it, and an old import path that users' code used keeps a bridge that warns
(``DeprecationWarning`` naming the new path; ``rlvr.core.moved``). Everything else under
``rlvr`` is internal and may move.

- Types: ``Sample`` (one prompt + one response), ``Status``, ``RolloutBatch``.
- Inside a generate / rollout function: ``context()`` (``AgentContext``: the sample's
  ``EngineHandle``, the tokenizer, ``ChatTurns``, the rollout), ``SamplingParams``.
- Tools: ``tool_schema`` (a function's JSON schema from its type hints).
- Rewards: ``score`` / ``grade`` run any ``--rm-type`` on one response (``Outcome``).
- Estimators: ``register_estimator``, ``AdvantageInputs``, ``AlgoConfig`` (``cfg.algo``).
- Errors: ``ConfigError`` (a flag and what to change), ``DataError``.
- Signatures: ``RewardFunction``, ``GroupRewardFunction``, ``GenerateFunction``,
  ``RolloutFunction``, ``EstimatorFunction`` (``rlvr.api.signatures``).

Names load on first use, so ``import rlvr.api`` imports none of the implementations.
"""

from __future__ import annotations

import importlib

# public name -> the module that defines it
_HOMES = {
    "Sample": "rlvr.core.types", "Status": "rlvr.core.types", "RolloutBatch": "rlvr.core.types",
    "ConfigError": "rlvr.core.errors", "DataError": "rlvr.core.errors",
    "context": "rlvr.agents.agent_context", "AgentContext": "rlvr.agents.agent_context",
    "EngineHandle": "rlvr.agents.session", "ChatTurns": "rlvr.agents.turns", "tool_schema": "rlvr.agents.tools",
    "SamplingParams": "rlvr.engine.base",
    "score": "rlvr.rewards", "grade": "rlvr.rewards", "Outcome": "rlvr.rewards.grader",
    "register_estimator": "rlvr.algo.advantages", "AdvantageInputs": "rlvr.algo.advantages",
    "AlgoConfig": "rlvr.config.algo",
    "RewardFunction": "rlvr.api.signatures", "GroupRewardFunction": "rlvr.api.signatures",
    "GenerateFunction": "rlvr.api.signatures", "RolloutFunction": "rlvr.api.signatures",
    "EstimatorFunction": "rlvr.api.signatures",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value  # later reads skip this function
        return value
    raise AttributeError(f"module 'rlvr.api' has no attribute {name!r}; the public names are: {', '.join(__all__)}")


def __dir__() -> list[str]:
    return __all__
