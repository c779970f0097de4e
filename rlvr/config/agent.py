"""``AgentConfig``: multi-turn, tool-using and agentic rollouts (issue 17; slime's flag names)."""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.core.errors import ConfigError
from rlvr.core.registry import load_function
from rlvr.config.fields import check_bounds
from rlvr.config.fields import option as _f


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
    max_turns: int = _f(4, "model turns per sample in the built-in tool/environment loop", ge=1)
    tool_timeout: float = _f(10.0, "seconds a tool call may take before it is an error observation", gt=0)

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
                                ("--tools", self.tools), ("--environment-path", self.environment_path)) if v]
        if len(given) > 1 and self.custom_generate_function_path is not None:
            raise ConfigError(given[1], "is run by the built-in multi-turn loop, which --custom-generate-function-path "
                                        "replaces; use one of them")
        if self.tools and self.environment_path:
            raise ConfigError("--environment-path", "and --tools are two built-in loops; give one of them")

    @property
    def per_sample(self) -> bool:
        """A per-sample generate function replaces the engine call (custom or built-in loop)."""
        return bool(self.custom_generate_function_path or self.tools or self.environment_path)
