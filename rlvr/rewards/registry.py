"""``REWARDS``: the reward registry (``--rm-type``), on its own so that reward modules can import it
without importing the package that lists them. The built-in rewards register themselves in their
own modules, which the registry imports the first time it is read (``rlvr.core.registry.Registry``)."""

from __future__ import annotations

from typing import Any

from rlvr.config.reward import RewardConfig
from rlvr.core.errors import ConfigError
from rlvr.core.registry import Registry

# slime_names last: it registers slime's boxed_* variants of the rewards registered before it.
REWARDS: Registry[Any] = Registry("reward", flag="--rm-type", builtins=tuple(
    f"rlvr.rewards.{m}"
    for m in ("code", "confidence", "dapo", "deepscaler", "environment", "math", "qa", "reasoning_gym", "remote",
              "slime_names")))


def parse_rm_type(text: str) -> dict[str, float]:
    """``--rm-type`` as ``{reward name: weight}``.

    >>> parse_rm_type("math")
    {'math': 1.0}
    >>> parse_rm_type("math=0.9, format=0.1")
    {'math': 0.9, 'format': 0.1}
    >>> parse_rm_type("nope")
    Traceback (most recent call last):
    ...
    rlvr.core.errors.ConfigError: --rm-type: unknown reward 'nope'; valid: ...
    """
    parts: dict[str, float] = {}
    for item in (p.strip() for p in text.split(",")):
        name, sep, weight = item.partition("=")
        name = name.strip()
        if not name:
            raise ConfigError("--rm-type", f"empty reward name in {text!r}; write e.g. 'math' or 'math=0.9,format=0.1'")
        if name not in REWARDS:
            raise ConfigError("--rm-type", f"unknown reward {name!r}; valid: {', '.join(REWARDS.names())}")
        if name in parts:
            raise ConfigError("--rm-type", f"reward {name!r} appears twice in {text!r}")
        try:
            parts[name] = float(weight) if sep else 1.0
        except ValueError:
            raise ConfigError("--rm-type", f"weight of {name!r} must be a number, got {weight!r}") from None
    return parts


def check_reward_config(cfg: RewardConfig) -> None:
    """The reward group's declared rules (``RewardConfig.validate``), then what needs the
    registry: every ``--rm-type`` name registered, and the URL each remote reward reads."""
    cfg.validate()
    if cfg.custom_rm_path is None:
        parts = parse_rm_type(cfg.rm_type)  # raises ConfigError naming --rm-type
        if "remote_rm" in parts and not cfg.rm_url:
            raise ConfigError("--rm-url", "is required by --rm-type remote_rm: the reward model's URL")
        if "judge" in parts and not cfg.judge_url:
            raise ConfigError("--judge-url", "is required by --rm-type judge: an OpenAI-compatible base URL")
