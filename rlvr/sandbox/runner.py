"""Run one untrusted Python program and contain it: the process sandbox behind ``--rm-type code``.

``await run_program(source, stdin, limits)`` runs ``source`` with the grader's own interpreter
(``-I -S -B``: isolated mode, no site-packages, so programs get the standard library only) and
returns a ``RunResult``. What it guarantees, and how (each layer falls back when the OS refuses it;
``RunResult.protections`` lists the layers that were really active for that run):

* **Time**: a wall-clock timeout (``limits.timeout``) and ``RLIMIT_CPU`` (``limits.cpu_time``).
* **Memory**: ``RLIMIT_AS`` per process, and a memory cgroup over the whole run (all its processes
  and its tmpfs working directory together).
* **Processes**: a pids cgroup (``pids.max``). Root ignores ``RLIMIT_NPROC``, so that rlimit is
  only set as the fallback when no cgroup is available and the run has an unprivileged uid.
* **Files**: ``RLIMIT_FSIZE`` per file. When root: a private mount namespace in which every mount
  is read-only and nosuid, and the working directory is a fresh size-limited tmpfs (it vanishes
  with the run). Otherwise: a private temporary directory as cwd, removed afterwards.
* **Privileges**: when root, the program runs as ``nobody`` with no supplementary groups and
  ``PR_SET_NO_NEW_PRIVS`` (no setuid binaries), so it cannot signal the grader or write root's files.
* **Network**: a fresh network namespace (only a down loopback device) when root.
* **Environment**: only ``PATH``, ``LANG``, ``LC_ALL`` and ``HOME`` (the working directory); no
  inherited variables, so no secrets.
* **Output**: stdout and stderr are read incrementally and kept up to ``limits.max_output_bytes``
  each; past the cap the rest is discarded, ``truncated`` is set and the program is killed (like a
  judge's "output limit exceeded": continuing would only burn CPU on output nobody reads).
* **Clean-up**: when the program exits or times out, its process group is killed, and then every
  process left in its cgroup (daemons that ``setsid`` away keep the cgroup, so they die too), with
  forking frozen first (``pids.max`` = 0). Only then is the rest of the output drained.
* **Concurrency**: ``run_program`` takes an ``asyncio.Semaphore`` that bounds runs in flight.

A real setup error (the launcher could not start) raises ``SandboxError``; everything the program
does, including hitting a limit, is a ``RunResult`` with a ``reason``. This is a process sandbox,
not a VM or a seccomp jail: see docs/rewards.md, "The code sandbox", for what it does not stop.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import os
import pwd
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_PROGRAM = "main.py"
_RUN_IDS = itertools.count()
# Kept in every run: enough for Python and the shell tools a program may call, nothing else.
_CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
# The interpreter binary itself, not a venv's symlink to it: with -I -S no venv is used anyway,
# and an unprivileged uid must be able to reach it (see the launcher's private_readonly_fs).
_PYTHON = os.path.realpath(sys.executable)

log = logging.getLogger(__name__)


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): e.g. the launcher could not start."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. ``from_reward_config`` maps the ``--code-*`` flags onto these."""

    timeout: float = 10.0  # wall-clock seconds
    cpu_time: float = 10.0  # CPU seconds per process (RLIMIT_CPU)
    memory_mb: int = 512  # address space per process (RLIMIT_AS); also the run's cgroup budget
    max_processes: int = 16  # processes at once (pids cgroup; RLIMIT_NPROC as fallback)
    max_file_mb: int = 16  # largest file (RLIMIT_FSIZE)
    disk_mb: int = 64  # size of the tmpfs working directory (when a mount namespace is available)
    max_output_bytes: int = 64 * 1024  # kept per stream; more kills the run

    def __post_init__(self):
        for name in ("timeout", "cpu_time"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)}")
        for name in ("memory_mb", "max_processes", "max_file_mb", "disk_mb", "max_output_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"SandboxLimits.{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_reward_config(cls, cfg) -> SandboxLimits:
        """The ``code_*`` fields of a ``RewardConfig``; the tmpfs holds four largest files."""
        return cls(
            timeout=cfg.code_timeout, cpu_time=cfg.code_cpu_time, memory_mb=cfg.code_memory_mb,
            max_processes=cfg.code_max_processes, max_file_mb=cfg.code_max_file_mb,
            disk_mb=4 * cfg.code_max_file_mb, max_output_bytes=cfg.code_max_output_kb * 1024,
        )


@dataclass
class RunResult:
    returncode: int | None  # negative: killed by that signal
    stdout: str
    stderr: str
    reason: str | None  # None when the program exited 0 within every limit
    duration: float  # wall-clock seconds from start to the end of clean-up
    truncated: bool = False  # stdout or stderr went past the cap
    protections: list[str] = field(default_factory=list)  # layers that were active

    @property
    def ok(self) -> bool:
        return self.reason is None


# --------------------------------------------------------------------------- what the OS offers


@functools.lru_cache(maxsize=None)
def _own_cgroup(controller: str) -> Path | None:
    """This process's cgroup v1 directory for ``controller`` if we may create children in it."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            base = CGROUP_ROOT / controller / path.lstrip("/")
            return base if os.access(base, os.W_OK) and (base / "cgroup.procs").exists() else None
    return None


def _cgroup_base(controller: str) -> Path | None:
    # Not cached: a test fences us by moving this process into another cgroup.
    _own_cgroup.cache_clear()
    return _own_cgroup(controller)


@functools.lru_cache(maxsize=None)
def _nobody() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


# --------------------------------------------------------------------------- cgroups


class _RunCgroups:
    """The pids and memory cgroups of one run, created under this process's own cgroups."""

    def __init__(self, limits: SandboxLimits, name: str):
        self.dirs: dict[str, Path] = {}
        for controller in ("pids", "memory"):
            base = _cgroup_base(controller)
            if base is None:
                continue
            path = base / name
            try:
                path.mkdir()
                if controller == "pids":
                    (path / "pids.max").write_text(str(limits.max_processes))
                else:
                    budget = (limits.memory_mb + limits.disk_mb) * 2**20
                    (path / "memory.limit_in_bytes").write_text(str(budget))
                    if (path / "memory.memsw.limit_in_bytes").exists():
                        (path / "memory.memsw.limit_in_bytes").write_text(str(budget))
            except OSError:
                _rmdir(path)
                continue
            self.dirs[controller] = path

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.dirs.values():
            try:
                found.update(int(p) for p in (path / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return found

    def counter(self, controller: str, file: str, key: str) -> int:
        """A ``key value`` line of a cgroup file, e.g. ``pids.events`` ``max``; 0 if absent."""
        path = self.dirs.get(controller)
        if path is None:
            return 0
        try:
            for line in (path / file).read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == key:
                    return int(v)
        except (OSError, ValueError):
            pass
        return 0

    async def kill_all(self, deadline: float = 5.0) -> bool:
        """SIGKILL every process in the run's cgroups until none is left; True when empty."""
        if "pids" in self.dirs:
            try:  # no new processes from here on, so the loop below converges
                (self.dirs["pids"] / "pids.max").write_text("0")
            except OSError:
                pass
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                _signal(pid, signal.SIGKILL)
            await asyncio.sleep(0.01)
        return not self.pids()

    async def remove(self) -> None:
        for path in self.dirs.values():
            for _ in range(200):  # a just-killed process leaves the cgroup a moment later
                if _rmdir(path):
                    break
                await asyncio.sleep(0.01)


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _signal(pid: int, sig: int, group: bool = False) -> None:
    if pid <= 1 or pid == os.getpid():  # never our own process, never init, never "all"
        return
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------- the launcher
# The child runs rlvr/sandbox/launcher.py between fork and the program (a file of its own
# so that it is read, linted and tested as code); it imports the standard library only.
_LAUNCHER = str(Path(__file__).with_name("launcher.py"))


def _rlimits(limits: SandboxLimits, nproc_fallback: bool) -> dict[str, list[int]]:
    """The rlimits of a run, as ``{RLIMIT_NAME: [soft, hard]}``.

    >>> r = _rlimits(SandboxLimits(cpu_time=2.5, memory_mb=64, max_file_mb=1), nproc_fallback=False)
    >>> r["RLIMIT_CPU"], r["RLIMIT_AS"], r["RLIMIT_FSIZE"], "RLIMIT_NPROC" in r
    ([3, 4], [67108864, 67108864], [1048576, 1048576], False)
    """
    cpu = max(1, int(-(-limits.cpu_time // 1)))  # whole seconds, rounded up
    out = {
        "RLIMIT_CPU": [cpu, cpu + 1],  # SIGXCPU at the soft limit, SIGKILL one second later
        "RLIMIT_AS": [limits.memory_mb * 2**20] * 2,
        "RLIMIT_FSIZE": [limits.max_file_mb * 2**20] * 2,
        "RLIMIT_CORE": [0, 0],
    }
    if nproc_fallback:
        out["RLIMIT_NPROC"] = [limits.max_processes] * 2
    return out


# --------------------------------------------------------------------------- output capture


class _Capture:
    """Reads one stream to EOF, keeping at most ``cap`` bytes; ``overflow`` is set past the cap."""

    def __init__(self, stream: asyncio.StreamReader, cap: int, overflow: asyncio.Event):
        self.stream, self.cap, self.overflow = stream, cap, overflow
        self.chunks: list[bytes] = []
        self.kept = 0
        self.truncated = False

    async def run(self) -> None:
        while chunk := await self.stream.read(65536):
            room = self.cap - self.kept
            if len(chunk) > room:
                chunk, self.truncated = chunk[:room], True
                self.overflow.set()
            if chunk:
                self.chunks.append(chunk)
                self.kept += len(chunk)

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", errors="replace")


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    try:
        stdin.write(data)
        await stdin.drain()
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the program exited or closed stdin without reading it all: its business


# --------------------------------------------------------------------------- one run


def explain(returncode: int | None, stderr: str, limits: SandboxLimits, *, timed_out: bool,
            output_limit: bool, pids_hit: int, oom_kills: int) -> str | None:
    """Why a run failed, most specific cause first; None for a clean exit 0.

    >>> L = SandboxLimits()
    >>> explain(0, "", L, timed_out=False, output_limit=False, pids_hit=0, oom_kills=0) is None
    True
    >>> explain(1, "...\\nMemoryError\\n", L, timed_out=False, output_limit=False, pids_hit=0, oom_kills=0)
    'memory limit'
    >>> explain(-9, "", L, timed_out=True, output_limit=False, pids_hit=3, oom_kills=0)
    'process limit'
    >>> explain(-24, "", L, timed_out=False, output_limit=False, pids_hit=0, oom_kills=0)
    'cpu time limit'
    >>> explain(2, "", L, timed_out=False, output_limit=False, pids_hit=0, oom_kills=0)
    'exit code 2'
    """
    if output_limit:
        return "output limit"
    if returncode == 0 and not timed_out:
        return None
    last = stderr.rstrip().rsplit("\n", 1)[-1] if stderr.strip() else ""
    if oom_kills or last.startswith("MemoryError"):
        return "memory limit"
    if pids_hit:
        return "process limit"
    if returncode == -signal.SIGXCPU or (returncode == -signal.SIGKILL and not timed_out):
        return "cpu time limit"  # the hard RLIMIT_CPU is a SIGKILL; our own kills are timeouts
    if timed_out:
        return "timeout"
    if "File too large" in last:
        return "file size limit"
    if "No space left on device" in last:
        return "disk limit"
    if returncode is not None and returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


async def run_program(source: str, stdin: str = "", limits: SandboxLimits = SandboxLimits(),
                      semaphore: asyncio.Semaphore | None = None) -> RunResult:
    """Run ``source`` as a Python program in the sandbox, feeding it ``stdin``.

    >>> r = asyncio.run(run_program("print(input()[::-1])", stdin="abc"))
    >>> r.returncode, r.stdout, r.reason
    (0, 'cba\\n', None)
    """
    if semaphore is None:
        return await _run(source, stdin, limits)
    async with semaphore:
        return await _run(source, stdin, limits)


@dataclass
class _Child:
    """One started program: its process and the readers of its output."""

    proc: asyncio.subprocess.Process
    out: _Capture
    err: _Capture
    overflow: asyncio.Event
    readers: list[asyncio.Future]
    feeder: asyncio.Future
    exited: asyncio.Future


def _launcher_config(limits: SandboxLimits, cgroups: _RunCgroups, user, workdir: Path, status_w: int) -> dict:
    return {
        "cgroups": {k: str(p) for k, p in cgroups.dirs.items()}, "user": user, "workdir": str(workdir),
        "disk_mb": limits.disk_mb, "program": _PROGRAM, "status_fd": status_w,
        "python": _PYTHON, "prefix": os.path.dirname(os.path.dirname(_PYTHON)),
        "rlimits": _rlimits(limits, nproc_fallback="pids" not in cgroups.dirs and user is not None),
    }


async def _start(cfg: dict, workdir: Path, stdin: str, limits: SandboxLimits) -> _Child:
    """The launcher in a new session, its output read and its stdin fed in the background."""
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", "-B", _LAUNCHER, json.dumps(cfg),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=workdir, env={**_CLEAN_ENV, "HOME": str(workdir)},
            start_new_session=True, pass_fds=(cfg["status_fd"],),
        )
    finally:
        os.close(cfg["status_fd"])
    overflow = asyncio.Event()
    out = _Capture(proc.stdout, limits.max_output_bytes, overflow)
    err = _Capture(proc.stderr, limits.max_output_bytes, overflow)
    readers = [asyncio.ensure_future(c.run()) for c in (out, err)]
    feeder = asyncio.ensure_future(_feed(proc.stdin, stdin.encode()))
    return _Child(proc, out, err, overflow, readers, feeder, asyncio.ensure_future(_exit_status(proc)))


async def _finish(child: _Child, cgroups: _RunCgroups, limits: SandboxLimits) -> tuple[int, bool]:
    """Wait for the exit, the timeout or the output cap; then kill the program's group and
    everything left in its cgroups (setsid daemons), and drain the output. (returncode, timed out)."""
    overflowed = asyncio.ensure_future(child.overflow.wait())
    await asyncio.wait([child.exited, overflowed], timeout=limits.timeout, return_when=asyncio.FIRST_COMPLETED)
    timed_out = not child.exited.done() and not child.overflow.is_set()
    overflowed.cancel()
    _signal(child.proc.pid, signal.SIGKILL, group=True)
    emptied = await cgroups.kill_all()
    returncode = await asyncio.wait_for(child.exited, 5.0)
    child.feeder.cancel()
    # Every holder of the pipes is dead when the cgroup is empty; without a cgroup an escaped
    # daemon may hold them open, so the drain is bounded and the pipes are then closed.
    await asyncio.wait(child.readers, timeout=1.0 if emptied and cgroups.dirs else 0.2)
    for r in child.readers:
        r.cancel()
    if not all(r.done() and not r.cancelled() for r in child.readers):
        child.proc._transport.close()  # asyncio has no public way to drop a process's pipes
    try:  # let asyncio reap it now, not after the caller's event loop is gone
        await asyncio.wait_for(child.proc.wait(), 1.0)
    except asyncio.TimeoutError:
        pass
    return returncode, timed_out


def _result(child: _Child, status: dict, cgroups: _RunCgroups, limits: SandboxLimits, returncode: int,
            timed_out: bool, start: float) -> RunResult:
    if "error" in status:
        raise SandboxError(f"sandbox launcher failed: {status['error']}")
    out, err = child.out, child.err
    reason = explain(
        returncode, err.text(), limits, timed_out=timed_out, output_limit=child.overflow.is_set(),
        pids_hit=cgroups.counter("pids", "pids.events", "max"),
        oom_kills=cgroups.counter("memory", "memory.oom_control", "oom_kill"),
    )
    protections = status.get("active", []) + [f"missing: {m}" for m in status.get("missing", [])]
    if not cgroups.dirs:
        protections.append("missing: cgroups (daemons that setsid can outlive the run)")
    return RunResult(returncode, out.text(), err.text(), reason, time.monotonic() - start,
                     out.truncated or err.truncated, protections)


async def _run(source: str, stdin: str, limits: SandboxLimits) -> RunResult:
    start = time.monotonic()
    name = f"rlvr-sbx-{os.getpid()}-{next(_RUN_IDS)}"
    user = _nobody()
    cgroups = _RunCgroups(limits, name)
    workdir = Path(tempfile.mkdtemp(prefix=name + "-"))
    status_r, status_w = os.pipe()
    child = None
    try:
        (workdir / _PROGRAM).write_text(source)
        if user is not None:
            os.chown(workdir, *user)
            os.chmod(workdir, 0o700)
        child = await _start(_launcher_config(limits, cgroups, user, workdir, status_w), workdir, stdin, limits)
        returncode, timed_out = await _finish(child, cgroups, limits)
        return _result(child, _read_status(status_r), cgroups, limits, returncode, timed_out, start)
    finally:
        if child is not None and child.proc.returncode is None:
            _signal(child.proc.pid, signal.SIGKILL, group=True)
        if not await cgroups.kill_all():
            log.warning("sandbox run %s: processes %s still in its cgroups after SIGKILL; left for the kernel",
                        name, sorted(cgroups.pids()))
        await cgroups.remove()
        os.close(status_r)
        shutil.rmtree(workdir, ignore_errors=True)


async def _exit_status(proc: asyncio.subprocess.Process) -> int:
    """The program's exit status as soon as it exits (negative: the signal that killed it).

    ``proc.wait()`` would also wait for its pipes to close, which a daemon can hold open, so this
    polls ``waitid(WNOWAIT)``, leaving the reaping to asyncio.
    """
    while proc.returncode is None:
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # asyncio reaped it already: returncode is about to be set
            info = None
        if info is not None:
            return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        await asyncio.sleep(0.01)
    return proc.returncode


def _read_status(fd: int) -> dict:
    """The launcher's report: its last JSON line (an exec failure follows the setup report)."""
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        data = b""
    lines = data.decode(errors="replace").strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else {"error": "launcher exited before reporting"}
    except json.JSONDecodeError:
        return {"error": f"unreadable launcher report {data[:200]!r}"}


def available_protections() -> dict[str, bool]:
    """Which layers this machine and user can offer (what a run will at most get).

    >>> sorted(available_protections())
    ['memory cgroup', 'pids cgroup', 'unprivileged uid']
    """
    return {
        "pids cgroup": _cgroup_base("pids") is not None,
        "memory cgroup": _cgroup_base("memory") is not None,
        "unprivileged uid": _nobody() is not None,
    }
