"""Arithmetic questions in plain English for a small pretrained chat model (the SmolLM2 demo).

Each problem is one chat-turn question (``"What is 47 + 85?"`` under a chosen wording) and its
integer answer as the label; ``--rm-type math`` grades the response's final number by value, so
``"47 + 85 = 132"`` and ``"132"`` both score 1. The families and wordings here are the ones
docs/demo.md compares on the validation split.

Splits are disjoint by construction: every problem of a family is enumerated, shuffled with
``seed``, and cut into test, validation and train in that order, so the same seed always gives
the same three files, and no (a, b) pair is in two of them.
"""

from __future__ import annotations

import random
from pathlib import Path

from rlvr.data.arith import write_jsonl

# family -> (operand ranges, how the expression is written, its value)
FAMILIES = {
    "add2": (((10, 99), (10, 99)), "{a} + {b}", lambda a, b: a + b),  # two-digit sums
    "add3": (((100, 999), (100, 999)), "{a} + {b}", lambda a, b: a + b),  # three-digit sums
    "mul": (((2, 9), (11, 99)), "{a} * {b}", lambda a, b: a * b),  # one digit times two digits
}
# name -> the user turn; {expr} is the expression
WORDINGS = {
    "plain": "What is {expr}?",
    "number": "What is {expr}? Answer with the number only.",
    "compute": "Compute {expr}. Reply with just the result.",
}


def all_problems(family: str, wording: str) -> list[dict]:
    """Every problem of ``family`` (operands in its ranges), in enumeration order.

    >>> all_problems("add2", "plain")[0]
    {'prompt': 'What is 10 + 10?', 'label': '20'}
    >>> len(all_problems("mul", "number")), all_problems("mul", "number")[1]["prompt"]
    (712, 'What is 2 * 12? Answer with the number only.')
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; valid: {', '.join(FAMILIES)}")
    if wording not in WORDINGS:
        raise ValueError(f"unknown wording {wording!r}; valid: {', '.join(WORDINGS)}")
    ((a_lo, a_hi), (b_lo, b_hi)), expr, value = FAMILIES[family]
    return [{"prompt": WORDINGS[wording].format(expr=expr.format(a=a, b=b)), "label": str(value(a, b))}
            for a in range(a_lo, a_hi + 1) for b in range(b_lo, b_hi + 1)]


def make_splits(family: str = "add2", wording: str = "plain", n_test: int = 200, n_val: int = 200,
                seed: int = 0) -> dict[str, list[dict]]:
    """{"train", "val", "test"}: disjoint, the same for the same arguments.

    >>> s = make_splits("mul", n_test=100, n_val=100, seed=3)
    >>> [len(s[k]) for k in ("train", "val", "test")], s == make_splits("mul", n_test=100, n_val=100, seed=3)
    ([512, 100, 100], True)
    >>> len({r["prompt"] for rows in s.values() for r in rows})
    712
    """
    problems = all_problems(family, wording)
    if n_test + n_val >= len(problems):
        raise ValueError(f"n_test={n_test} + n_val={n_val} leave no training problems (only {len(problems)})")
    random.Random(seed).shuffle(problems)
    return {"test": problems[:n_test], "val": problems[n_test:n_test + n_val], "train": problems[n_test + n_val:]}


def write_splits(out_dir: str | Path, **kwargs) -> dict[str, Path]:
    """``train.jsonl``, ``val.jsonl`` and ``test.jsonl`` of ``make_splits(**kwargs)`` in ``out_dir``."""
    return {name: write_jsonl(rows, Path(out_dir) / f"{name}.jsonl") for name, rows in make_splits(**kwargs).items()}
