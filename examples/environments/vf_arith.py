"""A verifiers taskset built here (no download): sums of two two-digit numbers, graded by a rubric.

`rlvr train --environment verifiers:vf_arith ...` trains on it (docs/environments.md). verifiers
finds a taskset by importing the module its id names and taking the Taskset subclass in `__all__`.
"""

import random

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: int = 0


class ArithTask(vf.Task[ArithData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: ArithData, trace: vf.Trace) -> float:
        """1.0 when the last number in the final reply is the sum."""
        numbers = [w.strip(".,!") for w in trace.last_reply.split()]
        numbers = [w for w in numbers if w.lstrip("-").isdigit()]
        return float(bool(numbers) and int(numbers[-1]) == task.answer)


class ArithTaskset(vf.Taskset[ArithTask, vf.TasksetConfig]):
    def load(self):
        rng = random.Random(0)
        for _ in range(256):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            yield ArithTask(ArithData(prompt=f"What is {a} + {b}? Answer with the number only.", answer=a + b))


__all__ = ["ArithTaskset"]
