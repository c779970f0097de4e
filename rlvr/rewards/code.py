"""``--rm-type code``: the pass rate of the response's program on the label's test cases.

The program is the response's last fenced Python block (```` ```python ```` / ```` ```py ```` or an
untagged ```` ``` ````; blocks tagged with another language are skipped), or the whole response
when there is none. ``sample.label`` holds the tests, as a dict or its JSON text, in one of two
forms:

* ``{"inputs": [...], "outputs": [...]}``: run the program with each input on stdin; a case
  passes when the program exits 0 within its limits and its stdout equals the expected output,
  compared after trimming surrounding whitespace and trailing spaces on each line;
* ``{"tests": ["assert f(1) == 2", ...]}``: each assertion is appended to the program and run on
  its own; a case passes when that run exits 0 within its limits.

Every run goes through ``rlvr.sandbox.runner`` with the ``--code-*`` limits, at most
``--code-max-concurrency`` at once. The result is ``{"score": passed / total, "passed", "total",
"reason"}``, ``reason`` being the first failing case's (``"test 2: timeout"``), None if all pass.
A malformed label is a real error: ``ValueError`` naming what is wrong.
"""

from __future__ import annotations

import asyncio
import json
import re
import weakref
from typing import Any

from rlvr.config.reward import RewardConfig
from rlvr.rewards.registry import REWARDS
from rlvr.sandbox.runner import RunResult, SandboxLimits, run_program
from rlvr.core.types import Sample

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3"}


def extract_program(response: str) -> str:
    """The last fenced Python block of ``response``, or all of it when there is none.

    >>> extract_program("try:\\n```python\\nprint(1)\\n```\\nbetter:\\n```\\nprint(2)\\n```")
    'print(2)\\n'
    >>> extract_program("```cpp\\nint main(){}\\n```\\n```py\\nprint(3)\\n```\\n```bash\\nls\\n```")
    'print(3)\\n'
    >>> extract_program("print(4)")
    'print(4)'
    """
    blocks = [body for tag, body in _FENCE.findall(response) if tag.lower() in _PYTHON_TAGS]
    return blocks[-1] if blocks else response


def same_output(actual: str, expected: str) -> bool:
    """Stdout comparison: surrounding whitespace, trailing spaces and CRLF do not matter.

    >>> same_output("3 \\r\\n4\\n\\n", "3\\n4")
    True
    >>> same_output("3 4", "3\\n4")
    False
    """

    def norm(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip().splitlines()]

    return norm(actual) == norm(expected)


def parse_tests(label: Any, program: str) -> list[tuple[str, str, str | None]]:
    """The label as ``[(source, stdin, expected stdout or None)]``; ValueError names the flaw.

    >>> parse_tests('{"inputs": ["1"], "outputs": ["2"]}', "p")
    [('p', '1', '2')]
    >>> parse_tests({"tests": ["assert f(1) == 2"]}, "def f(x): return 2")
    [('def f(x): return 2\\n\\nassert f(1) == 2\\n', '', None)]
    >>> parse_tests({"inputs": ["1"]}, "p")
    Traceback (most recent call last):
    ...
    ValueError: code label: has 'inputs' but no 'outputs'; give {"inputs": [...], "outputs": [...]} or {"tests": [...]}
    """
    if isinstance(label, str):
        try:
            label = json.loads(label)
        except json.JSONDecodeError as e:
            raise ValueError(f"code label: not valid JSON ({e}); give {_FORMS}") from None
    if not isinstance(label, dict):
        raise ValueError(f"code label: must be a dict or its JSON text, got {type(label).__name__}; give {_FORMS}")
    if "tests" in label:
        tests = _strings(label, "tests")
        return [(f"{program}\n\n{t}\n", "", None) for t in tests]
    if "inputs" in label or "outputs" in label:
        for key in ("inputs", "outputs"):
            if key not in label:
                other = "outputs" if key == "inputs" else "inputs"
                raise ValueError(f"code label: has {other!r} but no {key!r}; give {_FORMS}")
        inputs, outputs = _strings(label, "inputs"), _strings(label, "outputs")
        if len(inputs) != len(outputs):
            raise ValueError(
                f"code label: {len(inputs)} inputs but {len(outputs)} outputs; each input needs its expected output"
            )
        return [(program, i, o) for i, o in zip(inputs, outputs)]
    raise ValueError(f"code label: no 'tests' and no 'inputs'/'outputs' (keys: {sorted(label)}); give {_FORMS}")


_FORMS = '{"inputs": [...], "outputs": [...]} or {"tests": [...]}'


def _strings(label: dict, key: str) -> list[str]:
    values = label[key]
    if not isinstance(values, list) or not values:
        raise ValueError(f"code label: {key!r} must be a non-empty list of strings, got {values!r:.80}")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise ValueError(f"code label: {key}[{i}] must be a string, got {type(v).__name__} {v!r:.80}")
    return values


def verdict(result: RunResult, expected: str | None) -> str | None:
    """Why one test case failed, or None when it passed."""
    if result.reason is not None:
        return result.reason
    if expected is not None and not same_output(result.stdout, expected):
        return "wrong answer"
    return None


@REWARDS.register("code")
class CodeReward:
    """Grades a response by running its program on the label's tests in the sandbox."""

    def __init__(self, cfg: RewardConfig):
        self.limits = SandboxLimits.from_reward_config(cfg)
        self.max_concurrency = cfg.code_max_concurrency
        # One semaphore per event loop: rlvr.rewards.score runs each call in a fresh loop.
        self._semaphores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._semaphores:
            self._semaphores[loop] = asyncio.Semaphore(self.max_concurrency)
        return self._semaphores[loop]

    async def __call__(self, sample: Sample) -> dict:
        cases = parse_tests(sample.label, extract_program(sample.response))
        semaphore = self._semaphore()
        results = await asyncio.gather(
            *(run_program(source, stdin, self.limits, semaphore) for source, stdin, _ in cases)
        )
        failures = [(i, why) for i, (r, (_, _, expected)) in enumerate(zip(results, cases))
                    if (why := verdict(r, expected)) is not None]
        passed = len(cases) - len(failures)
        return {
            "score": passed / len(cases),
            "passed": passed,
            "total": len(cases),
            "reason": f"test {failures[0][0]}: {failures[0][1]}" if failures else None,
        }
