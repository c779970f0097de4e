"""``RewardConfig``: the reward part of the typed config.

The grader (``rlvr.rewards.grader``) and the configurable built-in rewards (``code``,
``remote_rm``, ``judge``) receive this group and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlvr.core.errors import ConfigError
from rlvr.core.registry import load_function
from rlvr.config.fields import check_bounds
from rlvr.config.fields import option as _f


@dataclass(frozen=True)
class RewardConfig:
    """How responses are graded."""

    rm_type: str = _f(
        "math",
        "reward by name (see docs/rewards.md), or a weighted composite 'math=0.9,format=0.1' "
        "whose parts are logged as rollout/reward/<part>",
    )
    custom_rm_path: str | None = _f(
        None, "your reward, pkg.module:fn(sample) -> float | dict (sync or async); replaces --rm-type"
    )
    reward_key: str | None = _f(None, "a reward returning a dict is scored by this entry (slime); default its 'score'")
    group_rm: bool = _f(False, "--custom-rm-path grades a whole group: fn(samples) -> list[float | dict]")
    reward_failure_value: float = _f(0.0, "reward given when grading fails (exception, timeout, NaN, bad reply)")
    reward_timeout: float = _f(120.0, "seconds one grading call may take before it counts as failed", gt=0)
    reward_max_concurrency: int = _f(16, "grading calls in flight at once (threads, HTTP requests, programs)", ge=1)
    # --- math answers (--rm-type math, deepscaler)
    math_percent_policy: str = _f(
        "value",
        "math: how a percentage compares with a plain number: 'value' (50 percent = 0.5, and = 50 since "
        "labels often drop the sign), 'number' (= 50 only), 'strict' (= 0.5 only)",
        choices=["value", "number", "strict"],
    )
    math_tolerance: float = _f(
        0.0,
        "math: relative tolerance for numeric answers; 0 = exact (a rounded decimal never equals a fraction "
        "or radical unless the prompt asks for rounding). For datasets whose labels are approximations",
        ge=0,
    )
    # --- slime's DAPO grader (--rm-type dapo)
    dapo_strict_box: bool = _f(
        False, "dapo: slime's strict_box_verify: grade the last boxed answer of the last 100 characters, "
        "compared with the label as a string"
    )
    # --- code sandbox (--rm-type code)
    code_timeout: float = _f(10.0, "code: wall-clock seconds per test run", gt=0)
    code_cpu_time: float = _f(10.0, "code: CPU seconds per test run", gt=0)
    code_memory_mb: int = _f(512, "code: address-space limit of a test run, MiB", ge=1)
    code_max_processes: int = _f(16, "code: processes a test run may have at once (fork bombs stop here)", ge=1)
    code_max_file_mb: int = _f(16, "code: largest file a test run may write, MiB", ge=1)
    code_max_output_kb: int = _f(64, "code: stdout/stderr kept per test run, KiB (the rest is discarded)", ge=1)
    code_max_concurrency: int = _f(4, "code: test runs executing at once", ge=1)
    # --- remote reward model (--rm-type remote_rm)
    rm_url: str | None = _f(None, "remote_rm: URL that takes a JSON batch of samples and returns their rewards")
    rm_batch_size: int = _f(16, "remote_rm: samples per HTTP request", ge=1)
    rm_retries: int = _f(3, "remote_rm / judge: retries of a failed request, with exponential backoff", ge=0)
    rm_deadline: float = _f(60.0, "remote_rm / judge: total seconds for one request including retries", gt=0)
    # --- LLM-as-judge (--rm-type judge)
    judge_url: str | None = _f(None, "judge: base URL of an OpenAI-compatible server (…/v1/chat/completions)")
    judge_model: str = _f("default", "judge: model name sent in the request")
    judge_prompt_path: str | None = _f(
        None, "judge: prompt template file with {prompt} {response} {label}; default: built-in 0-10 grading prompt"
    )
    judge_max_score: float = _f(10.0, "judge: the parsed score is divided by this to give a reward in [0, 1]", gt=0)

    def validate(self) -> None:
        """The declared bounds and the rules between these fields; the ``--rm-type`` names are
        checked against the registry by ``rlvr.rewards.registry.check_reward_config``."""
        check_bounds(self)  # the ranges declared on the fields
        if self.judge_prompt_path is not None and not Path(self.judge_prompt_path).is_file():
            raise ConfigError("--judge-prompt-path", f"file not found: {self.judge_prompt_path}")
        if self.group_rm and self.custom_rm_path is None:
            raise ConfigError("--group-rm", "grades with --custom-rm-path; give one (pkg.module:fn)")
        if self.custom_rm_path is not None:
            load_function(self.custom_rm_path, "--custom-rm-path")
