"""``REWARDS``: the reward registry (``--rm-type``), on its own so that reward modules can import it
without importing the package that lists them. The built-in rewards register themselves in their
own modules, which the registry imports the first time it is read (``rlvr.registry.Registry``)."""

from __future__ import annotations

from typing import Any

from rlvr.registry import Registry

# slime_names last: it registers slime's boxed_* variants of the rewards registered before it.
REWARDS: Registry[Any] = Registry("reward", flag="--rm-type", builtins=tuple(
    f"rlvr.rewards.{m}"
    for m in ("code", "confidence", "dapo", "deepscaler", "math", "qa", "remote", "slime_names")))
