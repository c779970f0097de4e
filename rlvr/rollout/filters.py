"""Dynamic-sampling filters (DAPO, Yu et al. 2025): which finished groups a rollout keeps.

A filter is ``fn(group: list[Sample]) -> bool`` (keep). ``--dynamic-sampling-filter-path`` takes a
registered name or a dotted path to your own function. The rollout keeps sampling new groups until
``--rollout-batch-size`` groups pass (at most ``--dynamic-sampling-max-rounds`` rounds), and logs
how many were dropped.
"""

from __future__ import annotations

from typing import Callable

from rlvr.core.registry import Registry
from rlvr.core.types import Sample

GroupFilter = Callable[[list[Sample]], bool]
FILTERS: Registry[GroupFilter] = Registry("dynamic sampling filter", flag="--dynamic-sampling-filter-path")


@FILTERS.register("nonzero_std")
def nonzero_std(group: list[Sample]) -> bool:
    """Keep a group whose rewards are not all equal: an all-correct or all-wrong group has zero
    GRPO advantage everywhere and only dilutes the batch (DAPO's dynamic sampling)."""
    rewards = [s.scalar_reward() for s in group]
    return max(rewards) > min(rewards)
