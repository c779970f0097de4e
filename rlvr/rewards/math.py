"""``--rm-type math``: 1.0 when the response's final answer equals the label, else 0.0.

The answer is taken from the response in this order: the last ``\\boxed{...}``, the text after
the last "answer is" / "Answer:", else the last number in the response. Equivalence is decided
by the math-verify library (fractions, decimals, LaTeX, sets, intervals ...), so ``\\frac{1}{2}``
matches ``0.5``.

math-verify enforces its time limit with ``signal.alarm``, which works only in the main
thread; elsewhere we call it without its timeout (the caller then owns the deadline).
"""

from __future__ import annotations

import re
import threading

from math_verify import parse, verify

from rlvr.types import Sample

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_ANSWER_IS = re.compile(r"(?:answer is|answer:)\s*(.+)", re.IGNORECASE | re.DOTALL)


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed{") - 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def extract_answer(response: str) -> str | None:
    """The final answer written in ``response``, or None.

    >>> extract_answer("so 3+4 = \\\\boxed{7}.")
    '7'
    >>> extract_answer("The answer is 1/2.")
    '1/2'
    >>> extract_answer("12 then 46")
    '46'
    """
    boxed = _last_boxed(response)
    if boxed is not None:
        return boxed.strip()
    matches = list(_ANSWER_IS.finditer(response))
    if matches:
        tail = matches[-1].group(1).strip().rstrip(".").strip()
        if tail:
            return tail.splitlines()[0].strip().rstrip(".")
    numbers = _NUMBER.findall(response)
    return numbers[-1].replace(",", "") if numbers else None


def is_equivalent(answer: str, label: str) -> bool:
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(_as_math(label), parsing_timeout=timeout)
    pred = parse(_as_math(answer), parsing_timeout=timeout)
    if not gold or not pred:
        return answer.strip() == label.strip()
    return bool(verify(gold, pred, timeout_seconds=timeout))


def _as_math(text: str) -> str:
    # math-verify's LaTeX extractor wants delimiters for LaTeX commands; bare numbers parse as is.
    return f"${text}$" if "\\" in text and "$" not in text else text


def math_reward(sample: Sample) -> float:
    if sample.label is None:
        raise ValueError("math reward needs a label (--label-key)")
    answer = extract_answer(sample.response)
    if answer is None:
        return 0.0
    return 1.0 if is_equivalent(answer, str(sample.label)) else 0.0


def _register() -> None:
    from rlvr.rewards import REWARDS

    REWARDS.register("math")(math_reward)


_register()
