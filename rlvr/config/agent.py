"""``AgentConfig``: multi-turn, tool-using and agentic rollouts (slime's flag names)."""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.core.errors import ConfigError
from rlvr.core.registry import load_function
from rlvr.config.fields import check_bounds
from rlvr.config.fields import option as _f

ENVIRONMENT_KINDS = ("verifiers:", "openenv:")  # --environment's forms (rlvr.environments.KINDS)


@dataclass
class AgentConfig:
    """Multi-turn rollouts: slime's custom generate / rollout function hooks, tools, environments."""

    custom_generate_function_path: str | None = _f(
        None, "pkg.module:fn, async fn(cfg, sample, sampling_params) -> Sample: generates one sample (several turns, "
              "tools) in place of the engine call; rlvr.agents.context() gives the engine handle and tokenizer"
    )
    rollout_function_path: str | None = _f(
        None, "pkg.module:fn(cfg, rollout_id, data_source, evaluation=False) -> groups of samples [, metrics]: the whole rollout"
    )
    tools: str | None = _f(
        None, "pkg.module:list of plain Python callables (or a YAML file listing pkg.module:fn) offered as tools; "
              "the built-in loop parses Hermes <tool_call>{json}</tool_call> calls"
    )
    environment_path: str | None = _f(
        None, "pkg.module:factory() -> an environment with reset(sample) -> messages and step(response) -> "
              "(observation, reward, done), run by the built-in multi-turn loop"
    )
    environment: str | None = _f(
        None, "an environment from another package: verifiers:TASKSET_ID (a verifiers taskset: its episodes and "
              "rubric; prompts from python -m rlvr.environments.verifiers), openenv:http://127.0.0.1:PORT (a running "
              "OpenEnv server) or openenv:module:Class (an OpenEnv Environment rlvr serves); docs/environments.md"
    )
    environment_timeout: float = _f(60.0, "seconds an --environment openenv: server may take to answer a reset or "
                                          "step before the sample fails", gt=0)
    max_turns: int | None = _f(None, "model turns per sample in the built-in --tools / --environment-path loop "
                                     "(default 4); a custom generate function reads it as args.agent.max_turns", ge=1)
    tool_timeout: float | None = _f(None, "seconds a --tools call may take before it is an error observation "
                                          "(default 10)", gt=0)
    tool_executor: str = _f("thread", "where a sync --tools function runs: a thread the rollout abandons at "
                                      "--tool-timeout (it runs on), or a worker process killed at the timeout "
                                      "(for tools that can hang for good; arguments and results must pickle)",
                            choices=["thread", "process"])
    agent_failure_limit: float = _f(0.5, "fraction of a rollout's samples whose generate function (or tool / "
                                         "environment loop) may raise before the run stops; a failed sample is "
                                         "logged with its traceback and not trained", ge=0, le=1)

    def validate(self) -> None:
        """The declared bounds and the rules between these fields; the ``--tools`` list is loaded
        and checked by ``rlvr.runtime.configure`` (the tool runner lives in ``rlvr.agents``)."""
        check_bounds(self)

        for flag, value in (("--custom-generate-function-path", self.custom_generate_function_path),
                            ("--rollout-function-path", self.rollout_function_path),
                            ("--environment-path", self.environment_path)):
            if value is not None:
                load_function(value, flag)  # a ConfigError naming the flag when it cannot be imported
        given = [f for f, v in (("--custom-generate-function-path", self.custom_generate_function_path),
                                ("--tools", self.tools), ("--environment-path", self.environment_path),
                                ("--environment", self.environment)) if v]
        if self.environment is not None and not self.environment.startswith(ENVIRONMENT_KINDS):
            raise ConfigError("--environment", f"{self.environment!r} is not one of the forms verifiers:TASKSET_ID, "
                                               "openenv:http://127.0.0.1:PORT, openenv:module:Class")
        if len(given) > 1 and self.environment is not None:
            other = next(f for f in given if f != "--environment")
            raise ConfigError("--environment", f"runs its own multi-turn loop; drop {other}")
        if len(given) > 1 and self.custom_generate_function_path is not None:
            raise ConfigError(given[1], "is run by the built-in multi-turn loop, which --custom-generate-function-path "
                                        "replaces; use one of them")
        if self.environment_timeout != 60.0 and not (self.environment or "").startswith("openenv:"):
            raise ConfigError("--environment-timeout", "applies to --environment openenv:...; drop it")
        if self.tools and self.environment_path:
            raise ConfigError("--environment-path", "and --tools are two built-in loops; give one of them")
        if self.max_turns is not None and not given:
            raise ConfigError("--max-turns", "bounds the built-in --tools / --environment-path loops (a custom "
                                             "generate function reads it as args.agent.max_turns); without one of "
                                             "them it does nothing: drop it")
        for flag, value in (("--tool-timeout", self.tool_timeout),
                            ("--tool-executor", None if self.tool_executor == "thread" else self.tool_executor)):
            if value is not None and not self.tools:
                raise ConfigError(flag, "applies to the --tools loop; without --tools it does nothing: drop it")

    @property
    def turns_limit(self) -> int:
        """``--max-turns``, 4 when not given (the built-in loops)."""
        return 4 if self.max_turns is None else self.max_turns

    @property
    def timeout(self) -> float:
        """``--tool-timeout`` in seconds, 10 when not given."""
        return 10.0 if self.tool_timeout is None else self.tool_timeout

    @property
    def per_sample(self) -> bool:
        """A per-sample generate function replaces the engine call (custom or built-in loop)."""
        return bool(self.custom_generate_function_path or self.tools or self.environment_path or self.environment)
