"""``--rm-type math``: 1.0 when the response's final answer equals the label, else 0.0.

Two layers (rules stated in full in ``docs/rewards.md``):

- **Which text is the final answer** (``math_extract``): the part after ``</think>`` (an unclosed
  ``<think>`` has none); there the last group of ``\\boxed{}``, else a GSM8K ``####`` line, else
  the text after "answer is"/"answer:", else the values of the last sentence when the response
  ends like a finished statement. A response truncated at ``--rollout-max-response-len``
  (``Sample.status == TRUNCATED``) is credited only for an answer completed before the cut, never
  by the last-number fallback.
- **Whether it equals the label** (``math_equiv``): presentation and units removed, scale words
  and percent as values (``--math-percent-policy``), lists / tuples / vectors / interval unions /
  the empty set compared as such, numbers exactly unless the prompt asks for an approximation
  or ``--math-tolerance`` is set, the algebra decided by math-verify.

**Anti-hedging**: a response that states several different final answers gets 0 unless the
label is that very collection: "A, C" or "A or C" for label A, "6 (or 4 if ...)", "either 12
or 15", ``\\pm 3`` for 3. A label that is a single letter A-J (``B``, ``(B)``, ``\\text{(B)}``)
is graded as a multiple-choice letter: exactly one option letter may be named ("B, not C" names
one), case-insensitive.

Safety: only the last ``MAX_SCAN_CHARS`` of a response are searched; huge powers, towers,
factorials and over-long answers never reach sympy. math-verify enforces its time limits with
``signal.alarm``, which works only in the main thread; elsewhere we call it with its timeouts
off and the grader around every reward call owns the deadline.
"""

from __future__ import annotations

import re

from rlvr.rewards.grader import inline
from rlvr.rewards.math_equiv import (  # noqa: F401  (re-exported: the math grader's public names)
    DEFAULT,
    MAX_ANSWER_CHARS,
    PERCENT_POLICIES,
    MathOptions,
    arity,
    is_equivalent,
    is_unsafe,
    normalize,
)
from rlvr.rewards.math_extract import (  # noqa: F401
    FALLBACK_TAIL,
    MAX_SCAN_CHARS,
    extract_answer,
    final_answers,
    last_boxed,
    split_thinking,
)
from rlvr.rewards.registry import REWARDS
from rlvr.core.types import Sample, Status

__all__ = [  # the math grader's public names, some defined in math_extract / math_equiv
    "DEFAULT", "FALLBACK_TAIL", "MAX_ANSWER_CHARS", "MAX_SCAN_CHARS", "PERCENT_POLICIES", "MathOptions",
    "MathReward", "arity", "choice_letters", "extract_answer", "final_answers", "grade_math", "is_equivalent",
    "is_unsafe", "label_choice", "last_boxed", "math_reward", "normalize", "split_thinking",
]

# --- multiple choice ----------------------------------------------------------------------------

_WRAPPERS = re.compile(r"\\(?:textbf|textrm|text|mathrm|mathbf|mbox|operatorname|displaystyle)\s*")
_CHOICE_LABEL = re.compile(r"^\(?([A-J])\)?$")
_SINGLE_LETTER = re.compile(r"\s*\(?([A-Ja-j])\)?[.:]?\s*")
# A letter the response rejects ("B, not C") is not a second answer.
_REJECTED = re.compile(r"\b(?:not|except|rather than|instead of)\s+\(?[A-J]\)?(?![A-Za-z])")
_LETTERS = re.compile(r"\(([A-J])\)|(?<![A-Za-z\\])([A-J]{1,4})(?![A-Za-z])")
_CHOICE_IN_TEXT = re.compile(r"\(([A-J])\)")


def _plain(text: str) -> str:
    return _WRAPPERS.sub("", text).replace("$", "").replace("{", "").replace("}", "")


def choice_letters(answer: str) -> set[str]:
    """The option letters an answer names: ``\\boxed{(B)}`` -> {B}; "A, C", "AC", "B/D" name two.

    >>> sorted(choice_letters("\\\\textbf{(B)} 5")), sorted(choice_letters("A \\\\text{ or } C"))
    (['B'], ['A', 'C'])
    >>> sorted(choice_letters("b"))
    ['B']
    >>> sorted(choice_letters("B, not C")), sorted(choice_letters("AC")), sorted(choice_letters("12"))
    (['B'], ['A', 'C'], [])
    """
    plain = _REJECTED.sub("", _plain(answer))
    single = _SINGLE_LETTER.fullmatch(plain)
    if single:
        return {single.group(1).upper()}
    letters: set[str] = set()
    for m in _LETTERS.finditer(plain):
        token = m.group(1) or m.group(2)
        if token == "I" and re.match(r"\s+[a-z']", plain[m.end() :]):
            continue  # the pronoun: "I think B"
        letters.update(token)
    return letters


def label_choice(label: str) -> str | None:
    """The option letter when ``label`` is a multiple-choice label (``B``, ``(B)``, ``\\text{(B)}``).

    >>> label_choice("(B)"), label_choice("\\\\text{(C)}"), label_choice("e"), label_choice("12")
    ('B', 'C', None, None)
    """
    m = _CHOICE_LABEL.match(_plain(label).strip())
    return m.group(1) if m else None


def _choice_readings(response: str, truncated: bool) -> list[str]:
    found = final_answers(response, truncated, fallback=False)
    if found:
        return found
    _, final = split_thinking(response)
    if final is None or truncated:
        return []
    final = final[-MAX_SCAN_CHARS:]
    if _SINGLE_LETTER.fullmatch(_plain(final)):  # the whole response is one letter
        return [final]
    tail = final[-FALLBACK_TAIL:].rstrip()
    last = re.split(r"(?<=[.!?])\s+|\n", tail.rstrip(".!"))[-1]
    letters = _CHOICE_IN_TEXT.findall(_REJECTED.sub("", last)) or _CHOICE_IN_TEXT.findall(tail)[-1:]
    return [", ".join(letters)] if letters else []


# --- the reward ---------------------------------------------------------------------------------

# The prompt asks for an approximate answer: then a rounded decimal is what it wants.
_ASKS_APPROXIMATION = re.compile(
    r"\b(?:round(?:ed)?|nearest|decimal places?|significant (?:figures|digits)|approximate(?:ly)?|"
    r"estimate|to \w+ decimal)\b",
    re.IGNORECASE,
)


def grade_math(sample: Sample, opts: MathOptions = DEFAULT) -> float:
    """1.0 when the final answer of ``sample.response`` equals ``sample.label``, else 0.0."""
    if sample.label is None or str(sample.label).strip() == "":
        raise ValueError("math reward needs a non-empty label per sample (--label-key names its field)")
    label = str(sample.label)
    truncated = sample.status == Status.TRUNCATED
    letter = label_choice(label)
    if letter is not None:
        readings = _choice_readings(sample.response, truncated)
        return 1.0 if any(choice_letters(r) == {letter} for r in readings) else 0.0
    if opts.tolerance == 0 and _ASKS_APPROXIMATION.search(sample.prompt or ""):
        opts = MathOptions(opts.percent_policy, opts.tolerance, approximate=True)
    readings = final_answers(sample.response, truncated, arity(label))
    return 1.0 if any(is_equivalent(r.strip(), label, opts) for r in readings) else 0.0


@inline  # cheap pure CPU: runs on the event-loop thread, where math-verify's alarm works
def math_reward(sample: Sample) -> float:
    """``grade_math`` with the default options (``--math-percent-policy value``, exact numbers).

    >>> from rlvr.core.types import Sample, Status
    >>> math_reward(Sample(prompt="", prompt_ids=[], label="0.5", response="so \\\\boxed{\\\\frac12}"))
    1.0
    >>> math_reward(Sample("", [], label="A", response="The answer is \\\\boxed{A, C}."))
    0.0
    >>> math_reward(Sample("", [], label="42", response="6 * 7 = 42. Next we", status=Status.TRUNCATED))
    0.0
    """
    return grade_math(sample)


@REWARDS.register("math")
class MathReward:
    """``--rm-type math`` built with the reward config (percent policy, tolerance)."""

    inline = True  # the grader runs it on the event-loop thread (see ``grader.inline``)

    def __init__(self, cfg):
        self.opts = MathOptions(cfg.math_percent_policy, cfg.math_tolerance)

    def __call__(self, sample: Sample) -> float:
        return grade_math(sample, self.opts)

