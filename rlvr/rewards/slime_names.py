"""The ``--rm-type`` names slime users type that have no rlvr reward of their own.

slime's ``rm_hub.async_rm`` dispatches ``math``, ``dapo``, ``deepscaler``, ``f1``, ``gpqa``,
``ifbench``, ``remote_rm`` and ``random``, and a ``boxed_`` prefix: ``boxed_<name>`` grades the
contents of the response's last ``\\boxed{...}`` (or an empty response when there is none) with
``<name>``. rlvr registers each of those names (``ifbench`` excepted: it needs Google's
instruction-following checkers):

- ``boxed_<name>`` for every rule-based reward registered before this module is imported
  (``boxed_math``, ``boxed_dapo``, ``boxed_deepscaler``, ``boxed_f1``, ``boxed_exact_match``).
  A response truncated at the length limit (status ``truncated``) is graded only on a *closed*
  box, which was completed before the cut; that box's contents are then graded as a finished
  answer.
- ``gpqa``: a multiple-choice letter, graded by the math reward's multiple-choice rules (one
  option letter named in the final answer; "A or C" gets 0). The correct letter is the label when
  it is a letter, ``metadata["correct_letter"]``, the label as a 0-based index, or the letter of
  the choice in ``metadata["choices"]`` whose text equals the label. slime additionally credits a
  response that contains the correct choice's text or whose last capital letter is right; rlvr
  does not, because both credit hedges.
- ``random``: 0.0 or 1.0 with equal probability (a pipeline check, as in slime).
- ``dcpo``: the DCPO recipe's reward, rlvr's ``math_confidence``: accuracy plus the
  stated confidence, which ``--custom-reward-post-process-path dcpo`` hands to the estimator.
"""

from __future__ import annotations

import dataclasses
import random
import re
import string

from rlvr.rewards.grader import build_reward, inline
from rlvr.rewards.math import _choice_readings, choice_letters
from rlvr.rewards.math.extract import boxes
from rlvr.core.types import Sample, Status

BOXED_BASES = ("math", "dapo", "deepscaler", "f1", "exact_match")
LETTERS = string.ascii_uppercase[:10]


class _Boxed:
    """``boxed_<base>``: the base reward on the contents of the last box."""

    base = ""

    def __init__(self, cfg):
        self.inner = build_reward(self.base, cfg)
        self.inline = getattr(self.inner, "inline", False)

    def __call__(self, sample: Sample):
        truncated = sample.status == Status.TRUNCATED
        found = [b for b in boxes(sample.response) if b[3] or not truncated]
        response = found[-1][2] if found else ""
        return self.inner(dataclasses.replace(sample, response=response, status=Status.COMPLETED))


def _normal(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", str(text).lower()).strip()


def gpqa_letter(label, metadata: dict) -> str:
    """The correct option letter from a letter label, ``correct_letter``, an index or a choice text.

    >>> gpqa_letter("c", {}), gpqa_letter(1, {}), gpqa_letter("Paris", {"choices": ["Rome", "Paris"]})
    ('C', 'B', 'B')
    """
    if isinstance(metadata.get("correct_letter"), str) and metadata["correct_letter"].strip():
        return metadata["correct_letter"].strip().upper()
    if isinstance(label, (int, float)) and not isinstance(label, bool) and 0 <= int(label) < len(LETTERS):
        return LETTERS[int(label)]
    text = str(label).strip() if label is not None else ""
    if len(text) == 1 and text.upper() in LETTERS:
        return text.upper()
    choices = metadata.get("choices")
    choices = list(choices.values()) if isinstance(choices, dict) else list(choices or [])
    for letter, choice in zip(LETTERS, choices):
        if text and _normal(choice) == _normal(text):
            return letter
    raise ValueError(f"gpqa reward: cannot tell the correct letter from label {label!r} "
                     "(give a letter, an index, metadata['correct_letter'] or metadata['choices'])")


@inline
def gpqa_reward(sample: Sample) -> float:
    """1.0 when the final answer names exactly the correct option letter.

    >>> from rlvr.core.types import Sample
    >>> gpqa_reward(Sample("", [], label="B", response="The answer is (B)."))
    1.0
    >>> gpqa_reward(Sample("", [], label="B", response="B or C"))
    0.0
    """
    letter = gpqa_letter(sample.label, sample.metadata)
    readings = _choice_readings(sample.response, sample.status == Status.TRUNCATED)
    return 1.0 if any(choice_letters(r) == {letter} for r in readings) else 0.0


@inline
def random_reward(sample: Sample) -> float:
    """0.0 or 1.0, each with probability 1/2 (slime's ``random``: checks a pipeline, learns nothing)."""
    return float(random.random() < 0.5)


def _register() -> None:
    from rlvr.rewards.registry import REWARDS

    for base in BOXED_BASES:
        if base in REWARDS:
            REWARDS.register(f"boxed_{base}")(type(f"Boxed_{base}", (_Boxed,), {"base": base}))
    if "math_confidence" in REWARDS:  # slime's DCPO recipe names its reward "dcpo"
        REWARDS.register("dcpo")(REWARDS["math_confidence"])
    REWARDS.register("gpqa")(gpqa_reward)
    REWARDS.register("random")(random_reward)


_register()
