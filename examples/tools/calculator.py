"""The tools example's task, tool and reward: 2-digit multiplication with a calculator tool.

A tiny model cannot multiply 2-digit numbers unaided; with ``mul`` it only has to call the tool
with the two factors copied from the prompt and copy the result into its answer.
"""

from __future__ import annotations

import json
import random
import re


def mul(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


TOOLS = [mul]


def call_text(a: int, b: int) -> str:
    """The tool call the SFT teaches (Hermes format, compact JSON)."""
    return "<tool_call>" + json.dumps({"name": "mul", "arguments": {"a": a, "b": b}}, separators=(",", ":")) + "</tool_call>"


def problems(seed: int = 0, n_test: int = 200) -> tuple[list[dict], list[dict]]:
    """(train, test) 2-digit products, disjoint."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(seed).shuffle(pairs)
    rows = [{"prompt": f"{a}*{b}=", "label": str(a * b), "metadata": {"a": a, "b": b}} for a, b in pairs]
    return rows[n_test:], rows[:n_test]


def final_answer(sample) -> float:
    """1.0 when the model's last turn (after the last tool result) is exactly the product.

    >>> from rlvr.core.types import Sample
    >>> turns = '<tool_call>..</tool_call>\\n<|im_start|>tool\\n408<|im_end|>\\n<|im_start|>assistant\\n'
    >>> final_answer(Sample("p", [1], label="408", response=turns + '408'))
    1.0
    >>> final_answer(Sample("p", [1], label="408", response=turns))
    0.0
    """
    last = sample.response.rsplit("<|im_start|>assistant\n", 1)[-1]
    last = re.sub(r"<\|im_end\|>.*", "", last, flags=re.S).strip()
    return float(last == str(sample.label))
