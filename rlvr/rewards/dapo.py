"""``--rm-type dapo``: the DAPO recipe's answer check, as slime's ``rm_hub`` (``math_dapo_utils``) grades.

Behaviour (kept on purpose, so that rewards compare with slime/verl runs of DAPO-Math-17k):
- Only the last ``TAIL_CHARS`` characters of the response are read (the longest MATH-500 answer
  is shorter than that).
- The answer is the rest of the line after the last ``Answer:`` (any case); none -> ``[INVALID]``.
- Both answer and label go through the Minerva normalisation (Lewkowycz et al. 2022, App. D):
  keep what follows the last ``=``, drop spaces, ``\\$``, unit words and ``\\text{}`` wrappers,
  unwrap ``\\boxed{}``/``\\textbf{}``/``\\overline{}``, fix ``\\frac12``/``\\sqrt2`` shorthand, and drop
  thousands commas from an integer. The label must be an integer (DAPO-Math-17k's are); it is
  compared as ``str(int(float(label)))``, so the check is an exact string match.
- Result: ``{"score": 1.0 | -1.0, "acc": 1.0 | 0.0, "pred": <normalised answer>}``. Note the
  wrong-answer score is -1.0, not 0.0. slime returns ``acc`` as a bool; we return a float so it
  averages directly in the rollout metrics.

Consequences worth knowing (same as slime): ``Answer: 42.`` is wrong (the trailing period stays),
``\\boxed{42}`` without an ``Answer:`` line is wrong, and ``Answer: 1/2`` cannot be right.

**Strict-box mode** (``--dapo-strict-box``, slime's ``strict_box_verify=True``): the answer is the
last closed ``\\boxed{...}`` of the last 100 of those 300 characters, compared with the label as
given, as a plain string (no normalisation, any label type: ``str(label)``); no box ->
``pred`` is None. Score and fields as above.
"""

from __future__ import annotations

import re

from rlvr.rewards.registry import REWARDS
from rlvr.core.types import Sample

TAIL_CHARS = 300
STRICT_BOX_CHARS = 100  # slime's is_correct_strict_box reads only these last characters
_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)

# Minerva's normalisation tables (Lewkowycz et al. 2022, Listing in App. D), applied in order.
_REPLACE = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
_DROP = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds",
    "meters", "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}",
    "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
    r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots",
    "<|im_end|>", "<|endoftext|>",
)
_UNWRAP = tuple(re.compile(rf"\\{cmd}\{{(.*?)\}}") for cmd in ("text", "textbf", "overline"))
_FIRST_MATH = re.compile(r".*?\$(.*?)\$.*")  # keep the first $...$ of a line
_BOXED_GREEDY = re.compile(r"\\boxed\{(.*)\}")


def normalize_final_answer(answer: str) -> str:
    """Minerva's normalisation of a final answer (what DAPO compares).

    >>> normalize_final_answer("x = 1,000 dollars"), normalize_final_answer("$\\\\boxed{42}$")
    ('1000', '42')
    >>> normalize_final_answer("\\\\frac12"), normalize_final_answer("42.")
    ('\\\\frac{1}{2}', '42.')
    """
    s = str(answer).split("=")[-1]
    for old, new in _REPLACE:
        s = s.replace(old, new)
    for word in _DROP:
        s = s.replace(word, "")
    s = _FIRST_MATH.sub(lambda m: f"${m.group(1)}$", s)
    for pattern in _UNWRAP:
        s = pattern.sub(r"\1", s)
    s = _BOXED_GREEDY.sub(r"\1", s)
    s = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", s)  # \frac12 -> \frac{1}{2}
    s = re.sub(r"sqrt([^{])", r"sqrt{\1}", s)  # \sqrt2 -> \sqrt{2}
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def _integer_label(label) -> str:
    if label is None:
        raise ValueError("dapo reward needs a label per sample (--label-key names its field)")
    normalized = normalize_final_answer(str(label))
    try:
        return str(int(float(normalized)))
    except (ValueError, OverflowError):
        raise ValueError(
            f"dapo reward expects integer labels (as DAPO-Math-17k has); got label {label!r}. "
            "Use --rm-type math for fractions, expressions and other answers."
        ) from None


def _strict_box(tail: str) -> str | None:
    """slime's ``last_boxed_only_string`` + ``remove_boxed``: the last closed ``\\boxed{...}``.

    >>> _strict_box("so \\\\boxed{4} and \\\\boxed{\\\\frac{1}{2}}")
    '\\\\frac{1}{2}'
    >>> _strict_box("\\\\boxed{4"), _strict_box("\\\\fbox{4}")
    (None, None)
    """
    start = tail.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for j in range(start, len(tail)):
        depth += (tail[j] == "{") - (tail[j] == "}")
        if tail[j] == "}" and depth == 0:
            return tail[start + len("\\boxed{") : j]
    return None


def dapo_reward(sample: Sample, strict_box: bool = False) -> dict:
    """DAPO's reward: ``score`` 1.0 when the last ``Answer:`` line matches the integer label, else -1.0.

    >>> from rlvr.core.types import Sample
    >>> dapo_reward(Sample("", [], label="1000", response="so...\\nAnswer: $1,000$"))
    {'score': 1.0, 'acc': 1.0, 'pred': '1000'}
    >>> dapo_reward(Sample("", [], label="42", response="\\\\boxed{42}"))
    {'score': -1.0, 'acc': 0.0, 'pred': '[INVALID]'}
    >>> dapo_reward(Sample("", [], label="42", response="\\\\boxed{42}"), strict_box=True)
    {'score': 1.0, 'acc': 1.0, 'pred': '42'}
    """
    tail = sample.response[-TAIL_CHARS:]
    if strict_box:
        if sample.label is None:
            raise ValueError("dapo reward needs a label per sample (--label-key names its field)")
        pred = _strict_box(tail[-STRICT_BOX_CHARS:])
        correct = pred == str(sample.label)
    else:
        gold = _integer_label(sample.label)
        found = _ANSWER_LINE.findall(tail)
        pred = normalize_final_answer(found[-1]) if found else "[INVALID]"
        correct = pred == gold
    return {"score": 1.0 if correct else -1.0, "acc": 1.0 if correct else 0.0, "pred": pred}


@REWARDS.register("dapo")
class DapoReward:
    """``--rm-type dapo`` built with the reward config (``--dapo-strict-box``)."""

    inline = True  # cheap pure CPU: runs on the event-loop thread

    def __init__(self, cfg):
        self.strict_box = cfg.dapo_strict_box

    def __call__(self, sample: Sample) -> dict:
        return dapo_reward(sample, self.strict_box)
