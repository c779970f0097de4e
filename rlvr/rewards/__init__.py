"""Rewards: plain callables ``(sample) -> float | dict`` registered by name (``--rm-type``).

An entry of ``REWARDS`` is a function (sync or ``async``) or, for rewards that need settings
(``code``, ``remote_rm``, ``judge``), a class built with the ``RewardConfig`` whose instances
are such callables. Training and evaluation call the same function, through the ``Grader``
(``rlvr.rewards.grader``), which contains every failure.

Importing this package is cheap: the built-ins (and math-verify, aiohttp behind them) are
imported the first time ``REWARDS`` is read (``rlvr.rewards.registry``).

``score`` grades one response without a rollout, for docs, tests and notebooks; ``grade`` does
the same and returns the detailed ``Outcome`` (score, extra fields, failure reason).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

from rlvr.config.reward import RewardConfig
from rlvr.rewards.grader import Grader, Outcome, outcome_of
from rlvr.rewards.registry import REWARDS
from rlvr.core.types import Sample

RewardFn = Callable[[Sample], "float | dict"]


@functools.lru_cache(maxsize=32)
def _grader(cfg: RewardConfig) -> Grader:
    return Grader(cfg)


def grade(rm_type: str, response: str, label: Any, config: RewardConfig | None = None, **metadata) -> Outcome:
    """Grade one response with ``rm_type`` (any ``--rm-type`` value); the detailed outcome.

    ``config`` supplies the reward settings (URLs, sandbox limits); its ``rm_type`` is replaced.

    >>> grade("math", "so it is \\\\boxed{\\\\frac{1}{2}}", "0.5")
    Outcome(score=1.0, fields={}, error=None)
    """
    cfg = dataclasses.replace(config or RewardConfig(), rm_type=rm_type, custom_rm_path=None, group_rm=False)
    sample = Sample(prompt=metadata.pop("prompt", ""), prompt_ids=[], label=label, metadata=metadata, response=response)
    _grader(cfg).grade_sync([sample])
    outcome = outcome_of(sample.reward)  # already checked by the grader: this only unpacks it
    outcome.error = sample.metadata.get("reward_error")
    return outcome


def score(rm_type: str, response: str, label: Any, config: RewardConfig | None = None, **metadata) -> float:
    """Grade one response with the registered reward ``rm_type``, synchronously.

    A failing reward gives ``--reward-failure-value`` (0.0 by default), as in training; use
    ``grade`` to see why.

    >>> score("math", "The answer is 46", "46")
    1.0
    >>> score("f1", "the Eiffel tower", "Eiffel Tower")
    1.0
    """
    return grade(rm_type, response, label, config, **metadata).score


__all__ = ["REWARDS", "RewardConfig", "RewardFn", "Grader", "Outcome", "grade", "score"]
