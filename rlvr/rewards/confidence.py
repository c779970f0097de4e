"""``--rm-type math_confidence``: math accuracy plus the confidence the response states.

For calibration training (DCPO) a response ends with its confidence, e.g.
``"46 confidence: 0.8"``. The reward is a dict: ``score`` (accuracy of the answer written before
the confidence), ``confidence`` (the stated value clipped to [0, 1], 0 when absent) and
``confidence_char_pos`` (where the confidence span starts in the response text, -1 when absent),
which the ``dcpo`` post-process turns into a token mask.
"""

from __future__ import annotations

import re

from rlvr.rewards.grader import inline
from rlvr.rewards.math import math_reward
from rlvr.rewards.registry import REWARDS
from rlvr.core.types import Sample

_CONFIDENCE = re.compile(r"confidence\s*[:=]\s*([0-9]*\.?[0-9]+)", re.IGNORECASE)


@inline
@REWARDS.register("math_confidence")
def math_confidence_reward(sample: Sample) -> dict:
    """
    >>> from rlvr.core.types import Sample
    >>> math_confidence_reward(Sample("", [], label="46", response="46 confidence: 0.8"))
    {'score': 1.0, 'confidence': 0.8, 'confidence_char_pos': 3}
    >>> math_confidence_reward(Sample("", [], label="46", response="45"))
    {'score': 0.0, 'confidence': 0.0, 'confidence_char_pos': -1}
    """
    text = sample.response
    matches = list(_CONFIDENCE.finditer(text))
    if not matches:
        return {"score": math_reward(sample), "confidence": 0.0, "confidence_char_pos": -1}
    m = matches[-1]
    answer_part = Sample(sample.prompt, sample.prompt_ids, label=sample.label, response=text[: m.start()])
    confidence = min(max(float(m.group(1)), 0.0), 1.0)
    return {"score": math_reward(answer_part), "confidence": confidence, "confidence_char_pos": m.start()}
