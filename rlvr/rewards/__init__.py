"""Rewards: plain callables ``(sample) -> float | dict`` registered by name (``--rm-type``).

Training and evaluation call the same function. ``score`` grades one response without a
rollout, for docs, tests and notebooks.
"""

from __future__ import annotations

from typing import Any, Callable

from rlvr.registry import Registry
from rlvr.types import Sample

RewardFn = Callable[[Sample], "float | dict"]
REWARDS: Registry[RewardFn] = Registry("reward", flag="--rm-type")

# Built-ins register themselves on import.
from rlvr.rewards import confidence as _confidence  # noqa: E402,F401
from rlvr.rewards import math as _math  # noqa: E402,F401


def score(rm_type: str, response: str, label: Any, **metadata) -> float:
    """Grade one response with the registered reward ``rm_type``.

    >>> score("math", "The answer is 46", "46")
    1.0
    """
    sample = Sample(prompt="", prompt_ids=[], label=label, metadata=metadata, response=response)
    result = REWARDS[rm_type](sample)
    return float(result["score"] if isinstance(result, dict) else result)


__all__ = ["REWARDS", "RewardFn", "score"]
