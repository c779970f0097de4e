"""Environments from other packages trained by rlvr (docs/environments.md).

- ``verifiers``: a verifiers taskset (installed, or a module of the user's) as prompts, rollouts
  and rubric (``--environment verifiers:ID``).
- ``openenv``: an OpenEnv environment server as the source of observations and rewards
  (``--environment openenv:...``).

Both packages are optional (the ``envs`` extra); nothing here imports them until used.
"""

from __future__ import annotations

KINDS = {"verifiers:": "rlvr.environments.verifiers", "openenv:": "rlvr.environments.openenv"}


def generate_function(spec: str):
    """The per-sample generate function for an ``--environment`` spec (its kind's ``generate``)."""
    import importlib

    for prefix, module in KINDS.items():
        if spec.startswith(prefix):
            return importlib.import_module(module).generate
    raise ValueError(f"--environment {spec!r}: the form is one of {', '.join(p + '...' for p in KINDS)}")
