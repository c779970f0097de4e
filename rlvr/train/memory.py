"""Peak memory of a phase (``perf/peak_memory_gb``, ``perf/rollout_peak_memory_gb``, ...).

On a CUDA device: ``torch.cuda.max_memory_allocated(device)`` (tensors the caching allocator
handed out; its reserved-but-free blocks are not counted). On CPU: the process's peak resident
set size (``VmHWM`` in ``/proc/self/status``), reset at the start of each phase by writing ``5``
to ``/proc/self/clear_refs`` (Linux >= 4.0); where that is not possible the value is the peak
since the process started (``ru_maxrss``). ``device`` None means the current CUDA device when
CUDA is available, else CPU (what the trainer measured before it had a device).
"""

from __future__ import annotations

import resource

import torch


def _cuda(device: torch.device | str | None) -> torch.device | None:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    device = torch.device(device)
    return device if device.type == "cuda" else None


def reset_peak_memory(device: torch.device | str | None = None) -> None:
    cuda = _cuda(device)
    if cuda is not None:
        torch.cuda.reset_peak_memory_stats(cuda)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # not Linux, or not allowed: the peak is the process's lifetime peak


def peak_memory_gb(device: torch.device | str | None = None) -> float:
    """Peak memory since the last ``reset_peak_memory`` (GiB)."""
    cuda = _cuda(device)
    if cuda is not None:
        return torch.cuda.max_memory_allocated(cuda) / 2**30
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20  # kB -> GiB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux
