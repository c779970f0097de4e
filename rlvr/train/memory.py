"""Peak memory of a training step (``perf/peak_memory_gb``).

On CUDA: ``torch.cuda.max_memory_allocated``. On CPU: the process's peak resident set size
(``VmHWM`` in ``/proc/self/status``), reset at the start of each step by writing ``5`` to
``/proc/self/clear_refs`` (Linux >= 4.0); where that is not possible the value is the peak since
the process started (``ru_maxrss``).
"""

from __future__ import annotations

import resource

import torch


def reset_peak_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # not Linux, or not allowed: the peak is the process's lifetime peak


def peak_memory_gb() -> float:
    """Peak memory since the last ``reset_peak_memory`` (GiB)."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20  # kB -> GiB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux
