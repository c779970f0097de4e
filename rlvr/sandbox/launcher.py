"""The sandbox's launcher: runs as the child of ``rlvr.sandbox.runner``, between fork and the program.

It joins the run's cgroups, enters fresh network and mount namespaces, sets the rlimits, drops
privileges and execs the program. It reports the layers it set up (and those the OS refused) as
one JSON line on a pipe (``status_fd`` in its config) that it closes before exec, so the program
never sees it. It is started as ``python -I -S -B launcher.py CONFIG_JSON``: isolated
mode, no site-packages, so it imports the standard library only, never rlvr.
"""

import ctypes
import json
import os
import resource
import sys

# unshare(2) flags
CLONE_NEWNS = 0x00020000  # a private mount namespace
CLONE_NEWNET = 0x40000000  # a private network namespace (only a down loopback device)
# mount(2) flags
MS_NOSUID = 2
MS_NODEV = 4
MS_BIND = 4096
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
# mount_setattr(2): one call makes every mount under / read-only and nosuid
SYS_MOUNT_SETATTR = 442  # x86_64 and aarch64 share the number
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 1
MOUNT_ATTR_NOSUID = 2
PR_SET_NO_NEW_PRIVS = 38  # prctl(2): exec can never gain privileges (setuid binaries)

libc = ctypes.CDLL(None, use_errno=True)


def check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def closed_ancestor(path: str) -> str | None:
    """The outermost directory on the way to ``path`` that others may not traverse (e.g. /root)."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:i])
        if not os.stat(d).st_mode & 0o001:
            return d
    return None


def _bind_interpreter(prefix: str) -> None:
    """If the interpreter lives under a directory closed to others (pyenv under /root), cover that
    directory with an empty tmpfs and bind only the interpreter's prefix back in."""
    closed = closed_ancestor(prefix)
    if closed is None:
        return
    src = os.open(prefix, os.O_PATH)
    check(libc.mount(b"tmpfs", closed.encode(), b"tmpfs", 0, b"size=1m,mode=0755"), "mount tmpfs")
    os.makedirs(prefix, exist_ok=True)
    check(libc.mount(f"/proc/self/fd/{src}".encode(), prefix.encode(), None, MS_BIND | MS_REC, None),
          "bind interpreter prefix")
    os.close(src)


def private_readonly_fs(cfg: dict, owner: tuple[int, int]) -> None:
    """A new mount namespace with every mount read-only, nosuid and private (nothing leaks back),
    then a fresh tmpfs on the working directory: the only writable place, size-limited."""
    workdir = cfg["workdir"]
    with open(os.path.join(workdir, cfg["program"]), "rb") as f:
        program = f.read()
    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    _bind_interpreter(cfg["prefix"])
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    check(libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)),
          "mount_setattr(/, AT_RECURSIVE, RDONLY)")
    opts = f"size={cfg['disk_mb']}m,mode=0700,uid={owner[0]},gid={owner[1]}".encode()
    check(libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts), "mount tmpfs workdir")
    os.chdir(workdir)  # the old cwd is now hidden under the tmpfs
    with open(cfg["program"], "wb") as f:
        f.write(program)


def isolate(cfg: dict, active: list[str], missing: list[str]) -> tuple[int, int] | None:
    """Network and filesystem namespaces (root only); the uid to run as, or None to stay."""
    user = cfg["user"]
    if not user:
        return None
    try:
        check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        active.append("network namespace")
    except OSError as e:
        missing.append(f"network namespace ({e})")
    try:
        private_readonly_fs(cfg, user)
        active += ["read-only filesystem", "tmpfs workdir"]
    except OSError as e:
        missing.append(f"read-only filesystem ({e})")
        if closed_ancestor(cfg["prefix"]) is not None:  # nobody could not even start Python
            missing.append(f"unprivileged uid (the interpreter is under {closed_ancestor(cfg['prefix'])})")
            return None
    return user


def launch(cfg: dict) -> None:
    """Everything between fork and exec; returns only by raising."""
    active: list[str] = []
    missing: list[str] = []
    os.set_inheritable(cfg["status_fd"], False)  # closed by exec: the program never sees it
    for controller, path in cfg["cgroups"].items():
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        active.append(f"{controller} cgroup")
    user = isolate(cfg, active, missing)
    for name, value in cfg["rlimits"].items():
        resource.setrlimit(getattr(resource, name), tuple(value))
    active.append("rlimits " + ",".join(sorted(cfg["rlimits"])))
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    active.append("no_new_privs")
    if user:
        os.setgroups([])
        os.setgid(user[1])
        os.setuid(user[0])
        active.append(f"uid {user[0]}")
    report(cfg, active=active, missing=missing)
    os.execv(cfg["python"], [cfg["python"], "-I", "-S", "-B", cfg["program"]])


def report(cfg: dict, **msg) -> None:
    os.write(cfg["status_fd"], (json.dumps(msg) + "\n").encode())


def main(argv: list[str]) -> None:
    cfg = json.loads(argv[1])
    try:
        launch(cfg)
    except BaseException as e:
        report(cfg, error=f"{type(e).__name__}: {e}")
        os._exit(125)


if __name__ == "__main__":
    main(sys.argv)
