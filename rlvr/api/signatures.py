"""The shapes of the functions a user hands to rlvr, as ``typing.Protocol`` classes.

They document and type-check plugins (``def generate(...) -> Sample`` against ``GenerateFunction``);
rlvr checks the same shapes at start-up (``rlvr.agents.contract.SIGNATURES`` binds each hook's
signature to the call rlvr makes) and names the flag when one does not fit.

==========================  ====================================  ==========================================
flag                        protocol                              the call rlvr makes
==========================  ====================================  ==========================================
``--custom-rm-path``        ``RewardFunction``                    ``fn(sample)`` -> float or dict with "score"
``--custom-rm-path``        ``GroupRewardFunction``               ``fn(samples)`` under ``--group-rm``
``--custom-generate-...``   ``GenerateFunction``                  ``await fn(args, sample, sampling_params)``
``--rollout-function-path`` ``RolloutFunction``                   ``fn(args, rollout_id, data_source, evaluation)``
``--custom-advantage-...``  ``EstimatorFunction``                 ``fn(inputs, cfg)`` -> (advantages, returns)
==========================  ====================================  ==========================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Protocol, Union

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.algo.advantages import AdvantageInputs
    from rlvr.config.algo import AlgoConfig
    from rlvr.core.types import Sample

RewardValue = Union[float, dict]  # a score, or {"score": float, other fields logged as rollout/reward/<field>}


class RewardFunction(Protocol):
    """``(sample) -> float | dict`` (or ``async def``); a reward written for slime may take
    ``(args, sample)``: a first parameter named ``args`` gets the config by slime's flag names."""

    def __call__(self, sample: Sample) -> RewardValue | Awaitable[RewardValue]: ...


class GroupRewardFunction(Protocol):
    """``--group-rm``: the samples of one prompt in, one reward per sample out, in order."""

    def __call__(self, samples: list[Sample]) -> list[RewardValue] | Awaitable[list[RewardValue]]: ...


class GenerateFunction(Protocol):
    """``--custom-generate-function-path`` (slime's custom generate): fill ``sample``'s response
    segments through ``rlvr.api.context().engine`` and return it; ``sampling_params`` is SGLang's
    dict (``temperature``, ``top_p``, ``max_new_tokens``, ...); ``args`` is the config."""

    def __call__(self, args: Any, sample: Sample, sampling_params: dict) -> Awaitable[Sample]: ...


class RolloutFunction(Protocol):
    """``--rollout-function-path`` / ``--eval-function-path`` (slime's rollout function): the
    rollout's groups of samples, optionally with a dict of metrics to log: ``groups`` or
    ``(groups, metrics)``."""

    def __call__(self, args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any: ...


class EstimatorFunction(Protocol):
    """An advantage estimator (``rlvr.api.register_estimator``): ``(advantages [B, T], returns [B, T])``."""

    def __call__(self, inputs: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]: ...
