"""``RewardConfig``: the reward part of the typed config (STYLE point 5).

The grader (``rlvr.rewards.grader``) and the configurable built-in rewards (``code``,
``remote_rm``, ``judge``) receive this group and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlvr.errors import ConfigError
from rlvr.fields import flag_of
from rlvr.fields import option as _f


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
    group_rm: bool = _f(False, "--custom-rm-path grades a whole group: fn(samples) -> list[float | dict]")
    reward_failure_value: float = _f(0.0, "reward given when grading fails (exception, timeout, NaN, bad reply)")
    reward_timeout: float = _f(120.0, "seconds one grading call may take before it counts as failed")
    reward_max_concurrency: int = _f(16, "grading calls in flight at once (threads, HTTP requests, programs)")
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
    )
    # --- slime's DAPO grader (--rm-type dapo)
    dapo_strict_box: bool = _f(
        False, "dapo: slime's strict_box_verify: grade the last boxed answer of the last 100 characters, "
        "compared with the label as a string"
    )
    # --- code sandbox (--rm-type code)
    code_timeout: float = _f(10.0, "code: wall-clock seconds per test run")
    code_cpu_time: float = _f(10.0, "code: CPU seconds per test run")
    code_memory_mb: int = _f(512, "code: address-space limit of a test run, MiB")
    code_max_processes: int = _f(16, "code: processes a test run may have at once (fork bombs stop here)")
    code_max_file_mb: int = _f(16, "code: largest file a test run may write, MiB")
    code_max_output_kb: int = _f(64, "code: stdout/stderr kept per test run, KiB (the rest is discarded)")
    code_max_concurrency: int = _f(4, "code: test runs executing at once")
    # --- remote reward model (--rm-type remote_rm)
    rm_url: str | None = _f(None, "remote_rm: URL that takes a JSON batch of samples and returns their rewards")
    rm_batch_size: int = _f(16, "remote_rm: samples per HTTP request")
    rm_retries: int = _f(3, "remote_rm / judge: retries of a failed request, with exponential backoff")
    rm_deadline: float = _f(60.0, "remote_rm / judge: total seconds for one request including retries")
    # --- LLM-as-judge (--rm-type judge)
    judge_url: str | None = _f(None, "judge: base URL of an OpenAI-compatible server (…/v1/chat/completions)")
    judge_model: str = _f("default", "judge: model name sent in the request")
    judge_prompt_path: str | None = _f(
        None, "judge: prompt template file with {prompt} {response} {label}; default: built-in 0-10 grading prompt"
    )
    judge_max_score: float = _f(10.0, "judge: the parsed score is divided by this to give a reward in [0, 1]")

    def validate(self) -> None:
        from rlvr.rewards.grader import parse_rm_type

        if self.custom_rm_path is None:
            parts = parse_rm_type(self.rm_type)  # raises ConfigError naming --rm-type
            if "remote_rm" in parts and not self.rm_url:
                raise ConfigError("--rm-url", "is required by --rm-type remote_rm: the reward model's URL")
            if "judge" in parts and not self.judge_url:
                raise ConfigError("--judge-url", "is required by --rm-type judge: an OpenAI-compatible base URL")
        if self.judge_prompt_path is not None and not Path(self.judge_prompt_path).is_file():
            raise ConfigError("--judge-prompt-path", f"file not found: {self.judge_prompt_path}")
        if self.group_rm and self.custom_rm_path is None:
            raise ConfigError("--group-rm", "grades with --custom-rm-path; give one (pkg.module:fn)")
        if self.custom_rm_path is not None:
            from rlvr.registry import load_function

            load_function(self.custom_rm_path, "--custom-rm-path")
        for name in ("reward_timeout", "code_timeout", "code_cpu_time", "rm_deadline", "judge_max_score"):
            if getattr(self, name) <= 0:
                raise ConfigError(flag_of(name), f"must be > 0, got {getattr(self, name)}")
        for name in ("reward_max_concurrency", "code_memory_mb", "code_max_processes", "code_max_file_mb",
                     "code_max_output_kb", "code_max_concurrency", "rm_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(flag_of(name), f"must be >= 1, got {getattr(self, name)}")
        from rlvr.rewards.math_equiv import PERCENT_POLICIES

        if self.math_percent_policy not in PERCENT_POLICIES:
            raise ConfigError("--math-percent-policy",
                              f"must be one of {', '.join(PERCENT_POLICIES)}, got {self.math_percent_policy!r}")
        if self.math_tolerance < 0:
            raise ConfigError("--math-tolerance", f"must be >= 0, got {self.math_tolerance}")
        if self.rm_retries < 0:
            raise ConfigError("--rm-retries", f"must be >= 0, got {self.rm_retries}")
