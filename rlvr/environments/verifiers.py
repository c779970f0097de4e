"""A verifiers taskset trained by rlvr (``--environment verifiers:ID``).

verifiers 0.4 (``verifiers.v1``) splits an environment into a *taskset* (its tasks, their
``@vf.reward`` / ``@vf.metric`` rubric and the MCP tool servers they use), an ``Env`` (how a task
becomes an episode: the single-agent env for a plain taskset) and a *harness* (the program that
talks to the model). rlvr runs all three unchanged, with two choices made for it:

- the harness is verifiers' ``null`` chat loop (its MCP tools, multi-turn), run by this
  interpreter rather than a ``uv``-built venv (``rlvr.environments.vf_harness``), in a local
  subprocess runtime;
- the model is rlvr's recording OpenAI-compatible endpoint (``rlvr.agents.openai_proxy``):
  verifiers' interception server forwards every model call of an episode to the sample's session,
  so the sample holds the engine's exact tokens and log-probs, and tool results and other
  environment text are masked segments.

The taskset's tasks are the prompts: ``python -m rlvr.environments.verifiers ID OUT.jsonl`` writes
them as a ``--prompt-data`` file (``metadata.verifiers_task`` is the task's position,
``metadata.source_name`` the taskset id, for per-environment metrics). A sample's reward is the
episode's trace reward (verifiers' weighted sum of its rewards), or with ``--rm-type
environment=...`` a part of rlvr's composite reward (``rlvr.rewards.environment``); each reward is
kept in ``metadata["verifiers_rewards"]``. An episode verifiers marks failed (its harness, tool server or
scoring raised) fails that sample only, like any agent error.

verifiers runs on its own event loop in a daemon thread, entered once per taskset (its
interception server and taskset-scoped tool servers stay up across rollouts).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from functools import lru_cache

from rlvr.core.errors import ConfigError

PREFIX = "verifiers:"


def _verifiers():
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ConfigError("--environment", f"verifiers:... needs the verifiers package ({e}); install the envs "
                                           "extra: pip install -e '.[envs]' (make envs builds .venv-envs)") from None
    from rlvr.environments import vf_harness

    # verifiers starts a taskset's tool servers as `python -m <its module>`: they import it from
    # where rlvr imports user modules (the working directory) too
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if os.getcwd() not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), *paths]))
    sys.modules.setdefault(vf_harness.HARNESS_ID, vf_harness)  # verifiers imports harnesses by top-level name
    return vf


def load_env(taskset_id: str):
    """The verifiers ``Env`` for ``taskset_id`` (an installed taskset package or an importable module),
    its agent on rlvr's local chat harness in a subprocess runtime."""
    vf = _verifiers()
    from rlvr.environments.vf_harness import HARNESS_ID

    config = {"taskset": {"id": taskset_id},
              "agent": {"harness": {"id": HARNESS_ID}, "runtime": {"type": "subprocess"}}}
    try:
        return vf.load_environment(vf.resolve_env_config(config))
    except (ImportError, TypeError, ValueError, AttributeError) as e:
        raise ConfigError("--environment", f"verifiers:{taskset_id}: {e}") from None


class Runner:
    """One taskset's env, served on a daemon thread's event loop; ``episode`` runs one task there."""

    def __init__(self, taskset_id: str):
        self.taskset_id = taskset_id
        self.env = load_env(taskset_id)
        self.tasks = list(self.env.taskset)
        self.loop = asyncio.new_event_loop()
        self._ready, self._error = threading.Event(), None
        threading.Thread(target=self._serve, name=f"verifiers-{taskset_id}", daemon=True).start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def hold():
            try:
                async with self.env.serving():
                    self._ready.set()
                    await asyncio.Event().wait()  # until the process ends
            except Exception as e:  # noqa: BLE001 - reported to the constructor
                self._error = e
                self._ready.set()

        self.loop.run_until_complete(hold())

    def task(self, index: int):
        if not 0 <= index < len(self.tasks):
            raise ValueError(f"metadata.verifiers_task {index} is not a task of {self.taskset_id} "
                             f"({len(self.tasks)} tasks): regenerate the prompt file")
        return self.tasks[index]

    async def episode(self, index: int, base_url: str, sampling: dict):
        """Run task ``index`` against ``base_url`` on the runner's loop; the finished ``Episode``."""
        from verifiers.v1.clients import ModelContext
        from verifiers.v1.configs.client import EvalClientConfig

        vf = _verifiers()
        ctx = ModelContext(model="rlvr-policy", client=EvalClientConfig(base_url=base_url, api_key_var="RLVR_API_KEY"),
                           sampling=vf.SamplingConfig(**sampling))
        future = asyncio.run_coroutine_threadsafe(self.env.run_episode(self.task(index), ctx), self.loop)
        return await asyncio.wrap_future(future)


@lru_cache(maxsize=None)
def runner(taskset_id: str) -> Runner:
    return Runner(taskset_id)


def episode_error(episode) -> str | None:
    """The first error of a failed episode (its own, or one of its traces'), as one line."""
    errors = list(episode.errors) + [e for t in episode.traces for e in (t.errors or [])]
    if episode.ok and not errors:
        return None
    first = errors[0] if errors else None
    return f"{first.type}: {first.message}" if first else "the episode did not finish (no error recorded)"


async def generate(args, sample, sampling_params: dict):
    """``--environment verifiers:ID``: one episode of the sample's task, recorded as the sample."""
    from rlvr.agents.agent_context import context
    from rlvr.agents.environment import record_reward

    ctx = context()
    taskset_id = ctx.agent.config.environment[len(PREFIX):]
    if "verifiers_task" not in sample.metadata:
        raise ConfigError("--prompt-data", "rows need metadata.verifiers_task (the task's position): write the file "
                                           f"with python -m rlvr.environments.verifiers {taskset_id} OUT.jsonl")
    run = await asyncio.to_thread(runner, taskset_id)
    sampling = {"temperature": sampling_params["temperature"], "top_p": sampling_params["top_p"]}
    ep = await run.episode(int(sample.metadata["verifiers_task"]), ctx.openai_base_url, sampling)
    error = episode_error(ep)
    if error is not None:
        raise RuntimeError(f"verifiers episode failed: {error}")
    trace = ep.traces[-1]
    sample.metadata["verifiers_rewards"] = {k: float(r.score) for k, r in trace.rewards.items() if r is not None}
    record_reward(sample, float(trace.reward))  # the sample's reward, or a part of --rm-type's composite
    return sample


def export_prompts(taskset_id: str, path: str, limit: int | None = None) -> int:
    """Write the taskset's tasks as a ``--prompt-data`` JSONL file; returns the number of rows."""
    env = load_env(taskset_id)
    n = 0
    with open(path, "w") as f:
        for i, task in enumerate(env.taskset):
            if limit is not None and i >= limit:
                break
            prompt = task.data.prompt if isinstance(task.data.prompt, str) else task.data.prompt_text
            row = {"prompt": prompt, "label": None, "metadata": {"verifiers_task": i, "source_name": taskset_id}}
            f.write(json.dumps(row) + "\n")
            n += 1
    return n


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m rlvr.environments.verifiers",
                                description="write a verifiers taskset's tasks as rlvr prompt data (JSONL)")
    p.add_argument("taskset_id")
    p.add_argument("out")
    p.add_argument("--limit", type=int, default=None, help="first N tasks only")
    a = p.parse_args(argv)
    sys.path.insert(0, ".")
    print(f"{export_prompts(a.taskset_id, a.out, a.limit)} prompts written to {a.out}")


if __name__ == "__main__":
    main()
