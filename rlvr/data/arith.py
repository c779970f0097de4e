"""A deterministic, verifiable arithmetic task that a tiny model can learn.

Problems are two-operand integer sums and differences written at fixed width, operands
zero-padded to the width of ``max_operand`` and results to the width of the largest sum:
``"07+58="`` with label ``"065"``. The response the model should write is the number, which the
``math`` reward grades by value (``"65"`` is as right as ``"065"``). Fixed width puts every digit
at a fixed distance from the digits it depends on; written unpadded (``"7+58="`` -> ``"65"``) a
tiny model from scratch needed ~3,400 SFT steps to reach 30% greedy accuracy, padded it passes
50% after ~850 (same model, data and recipe otherwise). Results are still written
most-significant digit first, so they need carry look-ahead, which a tiny model half-learns in
a short SFT — so GRPO has reward variance to work with.

Splits are disjoint by construction: every (a, op, b) triple is enumerated, shuffled with a
fixed seed, and cut into held-out (test) and train parts; ``write_splits`` then cuts a validation
split off the front of the train part (``val.jsonl``: what recipes, early stopping and other
choices are made on, so the test split is only ever used to report). The test split is the same
500 problems whether or not a validation split is cut.
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def all_problems(max_operand: int = 99, ops: str = "+-") -> list[dict]:
    """Every problem with operands in ``[0, max_operand]``, at fixed width.

    >>> all_problems(12)[7 * 13 + 5]
    {'prompt': '07+05=', 'label': '12'}
    >>> all_problems(99)[7 * 100 + 58]
    {'prompt': '07+58=', 'label': '065'}
    """
    width, result_width = len(str(max_operand)), len(str(2 * max_operand))
    problems = []
    for op in ops:
        for a in range(max_operand + 1):
            for b in range(max_operand + 1):
                if op == "-" and b > a:  # keep results non-negative
                    continue
                value = a + b if op == "+" else a - b
                problems.append({"prompt": f"{a:0{width}d}{op}{b:0{width}d}=", "label": f"{value:0{result_width}d}"})
    return problems


def make_splits(
    n_test: int = 500, seed: int = 1234, max_operand: int = 99, ops: str = "+-"
) -> tuple[list[dict], list[dict]]:
    """Return (train, test): disjoint, deterministic for a given seed."""
    problems = all_problems(max_operand, ops)
    if n_test >= len(problems):
        raise ValueError(f"n_test={n_test} leaves no training problems (only {len(problems)} exist)")
    random.Random(seed).shuffle(problems)
    return problems[n_test:], problems[:n_test]


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)
    return path


def split_validation(train: list[dict], n_val: int) -> tuple[list[dict], list[dict]]:
    """(train, validation): the first ``n_val`` training problems become the validation split."""
    if n_val >= len(train):
        raise ValueError(f"n_val={n_val} leaves no training problems (only {len(train)})")
    return train[n_val:], train[:n_val]


def write_splits(out_dir: str | Path, n_val: int = 0, **kwargs) -> tuple[Path, ...]:
    """``train.jsonl`` and ``test.jsonl`` in ``out_dir``, and ``val.jsonl`` when ``n_val`` > 0;
    returns their paths (train, test[, val])."""
    train, test = make_splits(**kwargs)
    out = Path(out_dir)
    if not n_val:
        return write_jsonl(train, out / "train.jsonl"), write_jsonl(test, out / "test.jsonl")
    train, val = split_validation(train, n_val)
    return (write_jsonl(train, out / "train.jsonl"), write_jsonl(test, out / "test.jsonl"),
            write_jsonl(val, out / "val.jsonl"))
