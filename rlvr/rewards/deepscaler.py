"""``--rm-type deepscaler``: DeepScaleR's rule-based reward, as slime's ``rm_hub/deepscaler.py`` grades.

Behaviour:
- The solution is the text after the first ``</think>`` (up to a second one, as slime's
  ``response.split("</think>")[1]``); with no ``</think>``, the text after the first
  ``###Response`` (up to a second); with neither, the reward is 0.0 (an unfinished thought
  earns nothing).
- The answer is the last closed ``\\boxed{...}`` of the solution; none (also ``\\fbox``, an
  unclosed box, ``\\boxed 5``) -> 0.0.
- A label written as ``\\boxed{...}`` is unboxed first; an empty label gives 0.0 (as in slime).
- 1.0 when answer and label are equivalent, else 0.0.

One deliberate difference: equivalence is ``rlvr.rewards.math.is_equivalent`` (math-verify plus
the math reward's normalisation and rules, default options) instead of DeepScaleR's
Hendrycks-string / sympy heuristics. It accepts what those accept on ordinary answers; it is more
lenient on unreduced fractions (``2/4`` vs ``1/2``, which DeepScaleR rejects), stricter where
sympy's ``simplify`` would hang (huge powers), and gives 0 to a box that names several answers
for a single-valued label (``\\boxed{A, C}``, ``\\boxed{12 \\text{ or } 15}``).
"""

from __future__ import annotations

from rlvr.rewards.grader import inline
from rlvr.rewards.math import is_equivalent, last_boxed
from rlvr.rewards.registry import REWARDS
from rlvr.core.types import Sample


def solution_part(response: str) -> str | None:
    """The part of ``response`` DeepScaleR grades, or None when the model never finished thinking.

    >>> solution_part("<think>3+4</think> It is \\\\boxed{7}")
    ' It is \\\\boxed{7}'
    >>> solution_part("<think>3+4 is \\\\boxed{7}") is None
    True
    >>> solution_part("<think>a</think> b </think> c")
    ' b '
    """
    if "</think>" in response:
        return response.split("</think>")[1]
    if "###Response" in response:
        return response.split("###Response")[1]
    return None


@inline  # cheap pure CPU: runs on the event-loop thread, where math-verify's alarm works
@REWARDS.register("deepscaler")
def deepscaler_reward(sample: Sample) -> float:
    """1.0 when the boxed answer after ``</think>`` equals the label, else 0.0.

    >>> from rlvr.core.types import Sample
    >>> deepscaler_reward(Sample("", [], label="\\\\frac{1}{2}", response="<think>...</think> \\\\boxed{0.5}"))
    1.0
    >>> deepscaler_reward(Sample("", [], label="7", response="<think>so \\\\boxed{7}"))
    0.0
    """
    if sample.label is None:
        raise ValueError("deepscaler reward needs a label per sample (--label-key names its field)")
    solution = solution_part(sample.response)
    if solution is None:
        return 0.0
    answer = last_boxed(solution, strict=True)
    label = str(sample.label)
    if "\\boxed" in label:
        label = last_boxed(label, strict=True) or ""
    if answer is None or not label.strip():
        return 0.0
    return 1.0 if is_equivalent(answer, label) else 0.0
