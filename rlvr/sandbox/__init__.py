"""The process sandbox for untrusted programs, shared by ``--rm-type code`` (``rlvr.rewards.code``)
and the agents' Python tool (``rlvr.agents.tools.python_tool``).

- ``runner``: ``run_program(source, stdin, limits)`` -> ``RunResult``; ``SandboxLimits``;
  ``available_protections()`` (rlimits, cgroups, namespaces, uid drop: see its docstring).
- ``launcher``: the child between fork and exec that sets the layers up (run as a script).

Imports nothing else of rlvr.
"""
