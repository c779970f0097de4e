"""Reward post-processing over a whole rollout, before advantages (slime's
``--custom-reward-post-process-path``): ``fn(samples, tokenizer) -> None``, free to fill
``Sample.train_metadata`` with per-sample values the loss needs.

``dcpo`` reads the ``math_confidence`` reward's fields and writes what the
``dcpo`` advantage estimator consumes: ``dcpo_confidence`` (a float) and
``dcpo_confidence_mask`` (one 0/1 per response token, 1 from the token where the stated
confidence starts). The group statistics (hybrid accuracy, calibration reward, the two
normalisations) are computed by the estimator itself, in ``rlvr.algo.advantages``.
"""

from __future__ import annotations

from typing import Callable

from rlvr.algo.advantages import DCPO_CONFIDENCE, DCPO_CONFIDENCE_MASK
from rlvr.core.registry import Registry
from rlvr.core.types import Sample

PostProcess = Callable[[list[Sample], object], None]
POST_PROCESS: Registry[PostProcess] = Registry("reward post-process", flag="--custom-reward-post-process-path")


def char_to_token_index(token_ids: list[int], char_pos: int, tokenizer) -> int:
    """Index of the first token whose decoded text reaches past ``char_pos`` (decoding the prefix
    token by token, as slime does); ``len(token_ids)`` if none does."""
    for i in range(len(token_ids)):
        if len(tokenizer.decode(token_ids[: i + 1], skip_special_tokens=True)) > char_pos:
            return i
    return len(token_ids)


@POST_PROCESS.register("dcpo")
def dcpo_post_process(samples: list[Sample], tokenizer) -> None:
    for s in samples:
        if not isinstance(s.reward, dict) or "confidence" not in s.reward:
            raise ValueError("the dcpo post-process needs a reward with a 'confidence' field (--rm-type math_confidence)")
        pos = int(s.reward.get("confidence_char_pos", -1))
        start = char_to_token_index(s.response_ids, pos, tokenizer) if pos >= 0 else s.response_length
        s.train_metadata[DCPO_CONFIDENCE] = float(s.reward["confidence"])
        s.train_metadata[DCPO_CONFIDENCE_MASK] = [0] * start + [1] * (s.response_length - start)
