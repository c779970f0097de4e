"""Which device a process computes on, and how much memory it has (``--device``).

``resolve(spec)`` turns ``auto | cpu | cuda | cuda:N`` into a ``torch.device``: ``auto`` is
``cuda`` (the process's current CUDA device) when CUDA is available, else ``cpu``; asking for
CUDA on a machine without it, or for ``cuda:N`` beyond the GPUs this process sees, fails naming
the flag and what the machine has. Under ``--ray`` the device is not a choice: an actor placed
in a GPU bundle computes on the one GPU Ray gave it (``cuda``, since Ray sets
``CUDA_VISIBLE_DEVICES``), an actor in a CPU bundle on ``cpu`` (``for_actor``).

Tests start Ray clusters with *logical* GPUs on this CPU-only machine; ``rlvr.core.testing``'s
``logical_gpus()`` seam then makes ``for_actor`` and the GPU count checks treat those GPUs as
present while the compute stays on CPU. Nothing else in the project reads that seam.

``total_memory_bytes(device)`` is what ``--sglang-mem-fraction-static`` is a fraction of: the
GPU's memory on CUDA (``torch.cuda.mem_get_info``'s total), the machine's physical memory on CPU
(``os.sysconf``), so the engine's KV budget means the same thing on both.
"""

from __future__ import annotations

import ctypes
import os
import sys

import torch

from rlvr.core.errors import ConfigError
from rlvr.core.testing import logical_gpus

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"


def cuda_count() -> int:
    """GPUs this process can use (``rlvr.core.testing.logical_gpus`` stands in for them in tests)."""
    fake = logical_gpus()
    if fake is not None:
        return fake
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_spec(spec: str) -> None:
    """Refuse a ``--device`` value that is not one of the forms, whatever the machine.

    >>> check_spec("cuda:1"); check_spec("auto")
    >>> check_spec("gpu")
    Traceback (most recent call last):
    ...
    rlvr.core.errors.ConfigError: --device: 'gpu' is not a device; use auto, cpu, cuda or cuda:N
    """
    head, sep, index = spec.partition(":")
    if spec in ("auto", "cpu", "cuda") or (head == "cuda" and sep and index.isdigit()):
        return
    raise ConfigError("--device", f"{spec!r} is not a device; use {DEVICE_CHOICES}")


def resolve(spec: str) -> torch.device:
    """The device ``--device spec`` means on this machine, or a ``ConfigError`` saying why not."""
    check_spec(spec)
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("--device", f"{spec}: this machine has no CUDA device (torch {torch.__version__}, "
                                      f"CUDA build: {torch.version.cuda or 'none'}); use --device cpu or auto")
    device = torch.device("cuda", torch.cuda.current_device()) if spec in ("auto", "cuda") else torch.device(spec)
    if device.index >= torch.cuda.device_count():
        raise ConfigError("--device", f"{spec}: this process sees {torch.cuda.device_count()} CUDA device(s) "
                                      f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    return device


def for_actor(in_gpu_bundle: bool) -> torch.device:
    """A Ray actor's device: its bundle's GPU (Ray made it ``cuda:0`` of this process), else CPU;
    CPU as well when the GPUs are a test's logical ones."""
    if not in_gpu_bundle or logical_gpus() is not None:
        return torch.device("cpu")
    return resolve("cuda")


def process_group_backend(device: torch.device) -> str:
    """torch.distributed backend of training ranks on ``device``: NCCL between GPUs, gloo on CPU.

    >>> process_group_backend(torch.device("cuda", 0)), process_group_backend(torch.device("cpu"))
    ('nccl', 'gloo')
    """
    return "nccl" if device.type == "cuda" else "gloo"


def total_memory_bytes(device: torch.device) -> int:
    """The memory ``--sglang-mem-fraction-static`` is a fraction of: the GPU's total on CUDA, the
    machine's physical memory on CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes held by a module's parameters and buffers (tied tensors counted once)."""
    seen = {}
    for t in [*module.parameters(), *module.buffers()]:
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def empty_cache(device: torch.device) -> None:
    """Return freed memory to the device: the caching allocator's free blocks on CUDA, the free
    pages of the process's heaps on CPU (``trim_host_heap``)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        trim_host_heap()


def trim_host_heap() -> None:
    """Give the free pages of glibc's heaps back to the OS (``malloc_trim``; nothing elsewhere).
    CPU tensors below glibc's mmap threshold live in those heaps, and the threshold rises to the
    largest block freed so far (up to 32 MiB), so after a training step most activations are heap
    blocks that glibc keeps when they are freed: without the trim a SmolLM2 run held 7.8-8.2 GB
    resident where its steps peak at 4.5-5 GB (docs/benchmarks.md). Called between phases
    (rollout, training), never inside one."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc():
    """glibc, where this process runs on it (``malloc_trim`` is glibc's); else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _glibc()
