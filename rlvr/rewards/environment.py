"""``--rm-type environment``: the reward the sample's environment gave, as a part of rlvr's rewards.

An environment run by rlvr (``--environment verifiers:...`` / ``openenv:...``, ``--environment-path``)
scores its own episodes: verifiers' rubric, OpenEnv's or the ``step`` rewards. The episode's reward
is kept in ``sample.metadata["environment_reward"]`` (``rlvr.agents.environment.record_reward``).
Without this name in ``--rm-type`` it is the sample's reward as it is (the grader is not called);
naming it composes it with any registered reward, ``--rm-type environment=0.9,format=0.1``, each
part logged as ``rollout/reward/<part>``.
"""

from __future__ import annotations

from rlvr.core.types import Sample
from rlvr.rewards.grader import inline
from rlvr.rewards.registry import REWARDS

KEY = "environment_reward"  # where the environment's reward is kept (sample.metadata)


@inline
@REWARDS.register("environment")
def environment_reward(sample: Sample) -> float:
    """The episode's reward from its environment.

    >>> environment_reward(Sample("", [], metadata={"environment_reward": 0.5}))
    0.5
    >>> environment_reward(Sample("", []))
    Traceback (most recent call last):
    ...
    ValueError: no environment reward on this sample: --rm-type environment reads the reward an ...
    """
    if KEY not in sample.metadata:
        raise ValueError(f"no environment reward on this sample: --rm-type environment reads the reward an "
                         f"--environment or --environment-path episode left in metadata[{KEY!r}]")
    return float(sample.metadata[KEY])
