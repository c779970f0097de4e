"""Tools: schemas, Hermes parsing, the built-in loop with every kind of bad call as an
observation, the environment protocol, and a fork bomb through the python tool contained by the
``code`` reward's sandbox (in a fenced driver process, as tests/test_sandbox.py fences its suite).

The loop runs against a scripted engine (the tiny random model cannot write tool calls): each
session's k-th call returns the k-th scripted turn, as token ids with log-probs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from examples.agents.my_tools import multiply  # docs/agents.md's example tool: its schema is pinned below
from rlvr.agents.tools import PythonTool, parse_tool_calls, run_tool, tool_schema
from rlvr.core.types import Status
from tests.support import FENCE_PIDS, HOSTILE_CFG, HOSTILE_DIR, agent_rollout, destroy_fence, make_fence

SERIAL_GROUP = "sandbox"  # one xdist worker for the group's modules (tests/conftest.py)


def boom(x: str) -> str:
    """Always fails."""
    raise RuntimeError("kaput")


def slow(x: str = "") -> str:
    """Sleeps too long."""
    time.sleep(3)
    return "late"


TOOLS = [multiply, boom, slow]
SANDBOXED = [PythonTool()]


def test_schema_and_parsing():
    s = tool_schema(multiply)["function"]
    assert s == {"name": "multiply", "description": "Multiply two integers.",
                 "parameters": {"type": "object", "required": ["a", "b"],
                                "properties": {"a": {"type": "integer", "description": "the first factor"},
                                               "b": {"type": "integer", "description": "the second factor"}}}}
    calls = parse_tool_calls('a<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
                             '<tool_call>[1]</tool_call><tool_call>{"name": "g", "arguments": 3}</tool_call>')
    assert calls[0].name == "f" and calls[0].arguments == {"x": 1}
    assert calls[1].error and calls[2].error and "arguments must be a JSON object" in calls[2].error


def test_bad_calls_are_error_observations():
    tools = {f.__name__: f for f in TOOLS}

    async def run(text):
        return await run_tool(tools, parse_tool_calls(text)[0], timeout=0.5)

    ok = asyncio.run(run('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'))
    assert ok == ("42", True)
    for text, expect in [('<tool_call>{"name": multiply}</tool_call>', "malformed tool call"),
                         ('<tool_call>{"name": "divide", "arguments": {}}</tool_call>', "unknown tool 'divide'"),
                         ('<tool_call>{"name": "multiply", "arguments": {"a": 1}}</tool_call>', "wrong arguments"),
                         ('<tool_call>{"name": "boom", "arguments": {"x": "y"}}</tool_call>', "RuntimeError: kaput"),
                         ('<tool_call>{"name": "slow", "arguments": {}}</tool_call>', "timed out after 0.5 s")]:
        obs, good = asyncio.run(run(text))
        assert not good and expect in json.loads(obs)["error"], obs


CALLS = ('<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>'
         '<tool_call>{"name": multiply}</tool_call>'
         '<tool_call>{"name": "divide", "arguments": {"a": 1}}</tool_call>'
         '<tool_call>{"name": "multiply", "arguments": {"a": 1}}</tool_call>'
         '<tool_call>{"name": "boom", "arguments": {"x": "y"}}</tool_call>'
         '<tool_call>{"name": "slow", "arguments": {}}</tool_call>')


def test_builtin_tool_loop_turns_bad_calls_into_observations(tiny_qwen2):
    from rlvr.observe.rollout_metrics import rollout_metrics

    rollout, engine, tok = agent_rollout(tiny_qwen2, [CALLS, "408"], tool_timeout=0.5)
    group = rollout.next_groups(1)[0]
    asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))
    for s in group:
        s.check()
        assert [t for _, _, t in s.segments()] == [True, False, True]
        assert s.status == Status.COMPLETED and s.metadata["turns"] == 2
        assert s.metadata["tool_calls"] == 6 and s.metadata["tool_errors"] == 5
        assert s.response.count('"error"') == 5 and "<|im_start|>tool\n408<|im_end|>" in s.response
        assert s.reward == 1.0  # the math reward reads the last number of the transcript: the answer 408
        # token-in/token-out: turn 2 continued from exactly the ids of turn 1 + the observation
        assert engine.prompts[-1] == s.prompt_ids + s.response_ids[: s.segments()[-1][0]]
    m = rollout_metrics(group, 2, "rollout/")
    assert m["rollout/turns/mean"] == 2 and m["rollout/tool_calls/mean"] == 6 and m["rollout/tool_errors"] == 10
    assert m["rollout/tool_calls/multiply"] == 4  # per-tool counts name only tools that exist
    tool_keys = sorted(k.rpartition("/")[2] for k in m if k.startswith("rollout/tool_calls/"))
    assert tool_keys == ["boom", "mean", "multiply", "slow"]  # not 'divide' (unknown) nor '<malformed>'


def test_max_turns_and_the_token_budget_bound_the_loop(tiny_qwen2):
    call = '<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call>'
    rollout, _, _ = agent_rollout(tiny_qwen2, [call], max_turns=3)
    group = rollout.next_groups(1)[0]
    asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))
    assert all(s.metadata["turns"] == 3 and s.status == Status.TRUNCATED for s in group)
    rollout.cfg.rollout_max_response_len = 100  # one call + its observation (~90 tokens) leave no room
    group = rollout.next_groups(1)[0]
    asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))
    assert all(s.response_length <= 100 and s.status == Status.TRUNCATED for s in group)


def test_the_agent_keeps_the_tools_the_builder_loaded(tiny_qwen2, monkeypatch):
    """The builder loads ``--tools`` once (it renders the prompts with their schemas) and hands the
    agent those callables; the agent uses them, and loads the flag itself only when given none."""
    import rlvr.agents.tools as agent_tools
    from rlvr.agents.hooks import Agent
    from rlvr.config import Config

    loads = []
    load_tools = agent_tools.load_tools
    monkeypatch.setattr(agent_tools, "load_tools", lambda spec: loads.append(spec) or load_tools(spec))
    rollout, _, tok = agent_rollout(tiny_qwen2, ["408"])
    assert loads == ["tests.test_agent_tools:TOOLS"]  # by the builder, not again by the agent
    assert list(rollout.agent.tools) == ["multiply", "boom", "slow"]

    cfg = Config()
    cfg.agent.tools = "tests.test_agent_tools:TOOLS"
    given = {"multiply": multiply}
    agent = Agent(cfg.agent, None, tok, tools=given, chat_template={}, max_response_len=16)
    assert agent.tools == given and len(loads) == 1
    assert Agent(cfg.agent, None, tok, chat_template={}, max_response_len=16).tools.keys() == {"multiply", "boom", "slow"}
    assert len(loads) == 2  # no tools given: the agent loads the flag's


class CountdownEnv:
    """Say a number; the environment answers 'lower' until the model has spoken three times."""

    def __init__(self):
        self.steps = 0

    def reset(self, sample):
        return [{"role": "user", "content": "guess"}]

    def step(self, response):
        self.steps += 1
        return "lower", 0.5, self.steps == 3


def make_env():
    return CountdownEnv()


def test_environment_protocol(tiny_qwen2):
    rollout, _, tok = agent_rollout(tiny_qwen2, ["7", "5", "3"], tools=None, environment_path="tests.test_agent_tools:make_env")
    group = rollout.next_groups(1)[0]
    asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))
    for s in group:
        assert s.prompt == "<|im_start|>user\nguess<|im_end|>\n<|im_start|>assistant\n"
        assert [t for _, _, t in s.segments()] == [True, False, True, False, True]
        assert s.reward == 1.5 and s.metadata["env_rewards"] == [0.5, 0.5, 0.5] and s.metadata["turns"] == 3
        assert s.metadata["environment_reward"] == 1.5


def test_environment_reward_composes_with_rlvr_rewards(tiny_qwen2):
    """``--rm-type environment=2,format=0.1``: the environment's reward (1.5) is one part of rlvr's
    composite, graded with the other parts: 2 * 1.5 + 0.1 * format."""
    script = ["<think>a</think><answer>7</answer>"]  # format 1 for a one-turn response; 0 for three turns
    rollout, _, _ = agent_rollout(tiny_qwen2, script, tools=None, environment_path="tests.test_agent_tools:make_env",
                                  rm_type="environment=2,format=0.1")
    group = rollout.next_groups(1)[0]
    asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))
    for s in group:
        assert s.metadata["environment_reward"] == 1.5 and "reward_error" not in s.metadata
        assert s.reward == {"score": 3.0, "environment": 1.5, "format": 0.0}
    rollout, _, _ = agent_rollout(tiny_qwen2, script, tools=None, environment_path="tests.test_agent_tools:make_env1",
                                  rm_type="environment=2,format=0.1")
    group = rollout.next_groups(1)[0]
    asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))
    for s in group:  # one turn, in the format: both parts count
        assert s.reward == {"score": 2 * 0.5 + 0.1, "environment": 0.5, "format": 1.0}


def make_env1():
    """``CountdownEnv`` done after the first reply."""
    env = CountdownEnv()
    env.steps = 2
    return env


# ---- a sync tool past --tool-timeout never holds the rollout ------------------------------------
RELEASE = threading.Event()  # what the hung thread-executor tool waits on (set by its test)


def hang(x: str = "") -> str:
    """Hangs (30 s, or until the test releases it)."""
    RELEASE.wait(30)
    return "late"


def sleep30(x: str = "") -> str:
    """A plain sync tool that sleeps 30 s."""
    time.sleep(30)
    return "late"


def quick(x: str = "") -> str:
    """A fast tool of this module: its worker imports what sleep30's does."""
    return "6"


HANGING = [multiply, hang, sleep30, quick]


def _rollout_time(tiny_qwen2, tool: str, **agent_kw) -> tuple[float, float, object, object]:
    """(perf/rollout_time, CPU seconds, the first sample, the agent) of one rollout of 2 samples whose first turn
    calls ``tool``, with --tool-timeout 0.5."""
    call = '<tool_call>{"name": "%s", "arguments": {%s}}</tool_call>' % (
        tool, '"a": 2, "b": 3' if tool == "multiply" else "")
    rollout, _, _ = agent_rollout(tiny_qwen2, [call, "6"], tools="tests.test_agent_tools:HANGING", tool_timeout=0.5, **agent_kw)
    rollout.cfg.rollout_batch_size = 1
    cpu = time.process_time()
    batch = rollout.generate(0)
    return batch.metrics["perf/rollout_time"], time.process_time() - cpu, batch.samples[0], rollout.agent


def _threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def test_a_hung_sync_tool_on_a_thread_is_abandoned_at_the_timeout(tiny_qwen2):
    """--tool-executor thread: the rollout ends at the timeout, not when the tool returns; the
    abandoned thread ends when the tool does (nothing joins it, nothing is left after)."""
    from rlvr.agents.tool_runner import abandoned_threads

    import importlib

    release = importlib.import_module("tests.test_agent_tools").RELEASE  # the module --tools imported
    release.clear()
    before = len(threading.enumerate())
    fast, _, _, _ = _rollout_time(tiny_qwen2, "multiply")
    slow, cpu, s, _ = _rollout_time(tiny_qwen2, "hang")
    print(f"thread executor: rollout {fast:.2f} s with a fast tool, {slow:.2f} s (CPU {cpu:.2f} s) with a hung one")
    assert slow - fast < 2 and s.metadata["tool_errors"] == 1 and "timed out after 0.5 s" in s.response
    assert len(_threads("rlvr-tool-hang")) == 2 and abandoned_threads() >= 2  # one per sample, still waiting
    release.set()
    for t in _threads("rlvr-tool-hang"):
        t.join(10)
    assert _threads("rlvr-tool-hang") == [] and len(threading.enumerate()) <= before


def _children() -> dict[int, str]:
    """This process's live child processes: {pid: command line}."""
    me, out = str(os.getpid()), {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            out[int(stat.parent.name)] = cmd
    return out


@pytest.mark.skipif(sys.platform != "linux", reason="counts child processes in /proc")
def test_a_sync_tool_that_sleeps_30_s_is_killed_at_the_timeout(tiny_qwen2):
    """--tool-executor process: the plain ``time.sleep(30)`` tool's worker is killed at 0.5 s; the
    rollout takes about as long as with a fast tool of the same module (each worker imports it
    first, outside the timeout), and no process outlives the agent."""
    before = _children()
    fast, _, _, agent = _rollout_time(tiny_qwen2, "quick", tool_executor="process")
    agent.close()
    slow, cpu, s, agent = _rollout_time(tiny_qwen2, "sleep30", tool_executor="process")
    print(f"process executor: rollout {fast:.2f} s with a fast tool, {slow:.2f} s (CPU {cpu:.2f} s) with sleep(30)")
    assert slow - fast < 2 and s.metadata["tool_errors"] == 1 and "sleep30 timed out after 0.5 s" in s.response
    assert agent.tool_processes.killed == 2  # one worker per sample, killed at the timeout
    agent.close()
    left = {pid: cmd for pid, cmd in _children().items() if pid not in before}
    # multiprocessing's resource tracker: one helper per process, started with the first spawn
    assert [cmd for cmd in left.values() if "resource_tracker" not in cmd] == [], left


def test_a_tool_that_raises_in_its_worker_is_an_observation():
    from rlvr.agents.tool_runner import ProcessTools

    tools, workers = {f.__name__: f for f in TOOLS}, ProcessTools()

    async def run(text):
        return await run_tool(tools, parse_tool_calls(text)[0], 10.0, workers)

    try:
        assert asyncio.run(run('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>')) == ("42", True)
        obs, ok = asyncio.run(run('<tool_call>{"name": "boom", "arguments": {"x": "y"}}</tool_call>'))
        assert not ok and json.loads(obs)["error"] == "boom raised RuntimeError: kaput"
    finally:
        workers.close()


def test_a_process_worker_imports_the_tool_module_outside_the_tool_timeout():
    """The tool's module sleeps 1 s at import, its timeout is 0.5 s: the first call still succeeds
    (a fresh worker's start and import are waited for apart), the second reuses the worker; a
    ``start_timeout`` shorter than the import kills the worker with an error observation that says
    so; a worker that exits during a call is an error observation with its exit code."""
    from rlvr.agents.tool_runner import ProcessTools
    from tests.slow_import_tools import SLOW_IMPORT_S, echo, exit_worker

    tools = {"echo": echo, "exit_worker": exit_worker}

    def run(workers, text):
        return asyncio.run(run_tool(tools, parse_tool_calls(text)[0], SLOW_IMPORT_S / 2, workers))

    call = '<tool_call>{"name": "echo", "arguments": {"x": "hi"}}</tool_call>'
    workers = ProcessTools()
    try:
        t = time.monotonic()
        assert run(workers, call) == ("hi", True)
        assert time.monotonic() - t >= SLOW_IMPORT_S  # the import ran in the worker, past the tool's timeout
        t = time.monotonic()
        assert run(workers, call) == ("hi", True)
        assert time.monotonic() - t < SLOW_IMPORT_S / 2 and workers.killed == 0
        obs, ok = run(workers, '<tool_call>{"name": "exit_worker", "arguments": {"code": 3}}</tool_call>')
        assert not ok and json.loads(obs)["error"] == ("exit_worker could not run: its worker process exited "
                                                       "(exit code 3) during the call")
    finally:
        workers.close()

    workers = ProcessTools(start_timeout=SLOW_IMPORT_S / 4)
    try:
        obs, ok = run(workers, call)
        assert not ok and json.loads(obs)["error"] == ("echo could not run: its worker process did not start and "
                                                       f"import tests.slow_import_tools within {SLOW_IMPORT_S / 4:g} s")
        assert workers.killed == 1
    finally:
        workers.close()


# ---- a fork bomb through the python tool, fenced ----------------------------------------------------
def _driver(spec: dict) -> None:
    """In the fenced child: one sample whose first turn calls python with a fork bomb, then answers."""
    for d in spec["fence"].values():
        Path(d, "cgroup.procs").write_text(str(os.getpid()))
    sys.path.insert(0, spec["root"])
    from rlvr.config.reward import RewardConfig
    from rlvr.sandbox.runner import SandboxLimits

    rollout, _, _ = agent_rollout(spec["ckpt"], spec["script"], tools="tests.test_agent_tools:SANDBOXED")
    rollout.agent.tools["python"].configure(SandboxLimits.from_reward_config(RewardConfig(**spec["limits"])))
    group = rollout.next_groups(1)[0][:1]
    t = time.monotonic()
    asyncio.run(rollout.agent.generate_group(rollout, group, rollout.sampling_params()))
    s = group[0]
    print(json.dumps({"duration": time.monotonic() - t, "status": s.status.value, "response": s.response,
                      "tool_errors": s.metadata["tool_errors"], "turns": s.metadata["turns"]}), flush=True)


def test_fork_bomb_through_the_python_tool_is_contained(tiny_qwen2):

    if sys.platform != "linux":
        pytest.skip("the sandbox's limits and the fence need Linux")
    fence = make_fence()
    if fence is None:
        pytest.skip("a fork bomb is only run inside a writable pids + memory cgroup fence")
    code = (HOSTILE_DIR / "fork_bomb.pysrc").read_text()
    call = "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"
    spec = {"fence": {k: str(v) for k, v in fence.items()}, "root": str(Path(__file__).parents[1]),
            "ckpt": str(tiny_qwen2), "script": [call, "the tool failed"],
            "limits": {k: v for k, v in HOSTILE_CFG.items() if k.startswith("code_")}}
    try:
        proc = subprocess.run([sys.executable, __file__, "--driver", json.dumps(spec)], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "PYTHONPATH": spec["root"]})
    finally:
        hit = int((fence["pids"] / "pids.peak").read_text()) >= FENCE_PIDS
        left = destroy_fence(fence)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads(proc.stdout.splitlines()[-1])
    assert not hit and left == set(), (hit, left)  # the sandbox's own limit held; nothing outlived the run
    assert row["tool_errors"] == 1 and row["turns"] == 2 and row["status"] == "completed"  # the run went on
    assert "process limit" in row["response"] and row["response"].endswith("the tool failed")
    assert row["duration"] <= HOSTILE_CFG["code_timeout"] + 5


if __name__ == "__main__" and sys.argv[1:2] == ["--driver"]:
    _driver(json.loads(sys.argv[2]))
