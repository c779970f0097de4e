"""A multi-turn verifiers taskset with a tool (built here, no download): products of two numbers,
with a calculator tool served over MCP by verifiers, graded by a rubric.

`rlvr train --environment verifiers:vf_calc ...` trains on it (docs/environments.md).
"""

import random

import verifiers.v1 as vf


class CalcToolsConfig(vf.ToolsetConfig):
    pass


class Calculator(vf.Toolset[CalcToolsConfig, vf.State]):
    TOOL_PREFIX = None  # the tool is offered as `multiply`, not `calculator_multiply`

    @vf.tool
    async def multiply(self, a: int, b: int) -> str:
        """Multiply two integers."""
        return str(a * b)


class CalcData(vf.TaskData):
    answer: int = 0


class CalcTask(vf.Task[CalcData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [Calculator(CalcToolsConfig())]

    @vf.reward
    async def correct(self, task: CalcData, trace: vf.Trace) -> float:
        """1.0 when the final reply contains the product."""
        return float(str(task.answer) in trace.last_reply)


class CalcTaskset(vf.Taskset[CalcTask, vf.TasksetConfig]):
    def load(self):
        rng = random.Random(0)
        for _ in range(64):
            a, b = rng.randint(11, 99), rng.randint(11, 99)
            yield CalcTask(CalcData(prompt=f"Use the multiply tool to compute {a} * {b}, then state the result.",
                                    answer=a * b))


__all__ = ["CalcTaskset"]

if __name__ == "__main__":  # verifiers starts the tool server as `python -m vf_calc`
    Calculator.run()
