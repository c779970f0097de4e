"""Environments from other packages trained by rlvr (docs/environments.md).

- ``verifiers``: a verifiers taskset (installed, or a module of the user's) as prompts, rollouts
  and rubric (``--environment verifiers:ID``).
- ``openenv``: an OpenEnv environment server as the source of observations and rewards
  (``--environment openenv:...``).

Both packages are optional (the ``envs`` extra); nothing here imports them until used.
"""
