"""``--deterministic-mode``'s process settings: what torch needs to compute the same numbers twice.

slime's deterministic mode runs Megatron with ``torch.use_deterministic_algorithms(True)`` and the
environment of its launch script (``NCCL_ALGO=Ring``, ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``,
``CUBLAS_WORKSPACE_CONFIG=:4096:8``; slime's launch scripts). rlvr applies the same in every
process that trains or samples (the driver, Ray actors, ``rlvr serve``), before its first CUDA
call: cuBLAS reads its workspace setting once, when it starts. On CPU only the first matters
(an op without a deterministic kernel raises instead of running); the batch invariance of the
engine is the engine's own (``rlvr.engine.local.embedded``).
"""

from __future__ import annotations

import os

import torch

# slime's launch-script environment for deterministic runs.
CUDA_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_ALGO": "Ring", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}


def use_deterministic_mode() -> None:
    """Deterministic kernels from here on in this process (and the environment its children inherit).
    An environment value the user already set is kept."""
    for name, value in CUDA_ENV.items():
        os.environ.setdefault(name, value)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
