"""The code sandbox and ``--rm-type code``: ordinary grading, then a suite of hostile programs.

The hostile programs (tests/hostile/*.pysrc, not .py so that no collector ever imports one) run
in a separate driver process that this test first fences into its own pids + memory cgroup: a
sandbox bug then fails the test (the fence's limit is hit, the driver dies, a process is left
behind) instead of taking the machine down. Parts that need what a machine lacks (root, cgroups,
a mount namespace) are skipped with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlvr.rewards import REWARDS
from rlvr.rewards.code import CodeReward, extract_program
from rlvr.config.reward import RewardConfig
from rlvr.sandbox.runner import SandboxLimits, available_protections, run_program
from rlvr.core.types import Sample
from tests.support import (FAST, FENCE_PIDS, HOSTILE_CFG, HOSTILE_DIR, can_still_act, cgroup_tree_pids, destroy_fence,
                           make_fence, nobody_pids, own_cgroup_dir)

SERIAL_GROUP = "sandbox"  # one xdist worker for the group's modules (tests/conftest.py)

PROTECTIONS = available_protections()
IS_ROOT = os.geteuid() == 0


def grade(response: str, label, **overrides) -> dict:
    reward = CodeReward(RewardConfig(**{**FAST, **overrides}))
    return asyncio.run(reward(Sample(prompt="", prompt_ids=[], label=label, response=response)))


# --------------------------------------------------------------------------- ordinary grading

ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
IO_LABEL = {"inputs": ["1 2", "5 5", "-3 3"], "outputs": ["3", "10", "0"]}


def test_registered_as_code():
    assert REWARDS["code"] is CodeReward


def test_correct_program_scores_one():
    r = grade(f"Here you go:\n```python\n{ADD}```\n", IO_LABEL)
    assert r == {"score": 1.0, "passed": 3, "total": 3, "reason": None}


def test_wrong_program_scores_zero_with_reason():
    r = grade("```python\nprint(0)\n```", json.dumps({"inputs": ["1 2", "5 5"], "outputs": ["3", "10"]}))
    assert r["score"] == 0.0 and r["reason"] == "test 0: wrong answer"


def test_partial_pass_rate():
    # Right only when a == b: passes "5 5" (10) and fails the other two.
    r = grade("```python\na, b = map(int, input().split())\nprint(2 * a)\n```", IO_LABEL)
    assert (r["passed"], r["total"]) == (1, 3)
    assert r["score"] == pytest.approx(1 / 3)
    assert r["reason"] == "test 0: wrong answer"


def test_syntax_error_scores_zero():
    r = grade("```python\ndef f(:\n```", IO_LABEL)
    assert r["score"] == 0.0 and r["reason"] == "test 0: exit code 1"


def test_assertion_label_form():
    program = "```python\ndef f(x):\n    return x + 1 if x < 3 else x\n```"
    r = grade(program, {"tests": ["assert f(1) == 2", "assert f(2) == 3", "assert f(5) == 6"]})
    assert (r["passed"], r["total"], r["reason"]) == (2, 3, "test 2: exit code 1")


def test_last_python_block_is_the_program():
    # The first block is wrong, a non-Python block comes last: the last Python block is graded.
    response = f"```python\nprint(0)\n```\nfixed:\n```\n{ADD}```\n```bash\necho 3\n```"
    assert grade(response, IO_LABEL)["score"] == 1.0


def test_whole_response_is_the_program_without_fences():
    assert grade(ADD, IO_LABEL)["score"] == 1.0


def test_output_whitespace_is_trimmed():
    assert grade("print('  3  \\n')", {"inputs": [""], "outputs": ["3\n"]})["score"] == 1.0


@pytest.mark.parametrize("label, match", [
    ("not json", "not valid JSON"),
    ([1, 2], "must be a dict"),
    ({"inputs": ["1"]}, "no 'outputs'"),
    ({"inputs": ["1", "2"], "outputs": ["1"]}, "2 inputs but 1 outputs"),
    ({"tests": []}, "'tests' must be a non-empty list"),
    ({"inputs": [1], "outputs": ["1"]}, r"inputs\[0\] must be a string"),
    ({"cases": []}, "no 'tests' and no 'inputs'"),
])
def test_malformed_label_names_the_problem(label, match):
    with pytest.raises(ValueError, match=match):
        grade("print(1)", label)


def _sandboxed_children() -> int:
    """This process's sandboxed runs now: children that are the launcher or the program it execs."""
    n = 0
    for d in Path("/proc").iterdir():
        try:
            ppid = int((d / "stat").read_text().rpartition(")")[2].split()[1])
            cmd = (d / "cmdline").read_bytes() if ppid == os.getpid() else b""
        except (OSError, ValueError, IndexError):
            continue
        n += b"rlvr/sandbox/launcher.py" in cmd or cmd.endswith(b"main.py\0")
    return n


def _most_at_once(run) -> int:
    """The most sandboxed runs seen alive together while ``run()`` runs (polled every 5 ms)."""
    most, done = 0, threading.Event()

    def poll():
        nonlocal most
        while not done.is_set():
            most = max(most, _sandboxed_children())
            done.wait(0.005)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        run()
    finally:
        done.set()
        poller.join()
    return most


@pytest.mark.parametrize("slots", [1, 2])
def test_concurrency_is_bounded(slots):
    # 2 * slots sleepers of 0.5 s: never more than `slots` alive at once, and `slots` of them are
    # (each lives long enough for the 5 ms poll to see the overlap however the machine is loaded).
    label = {"tests": ["pass"] * (2 * slots)}
    scores = []
    most = _most_at_once(lambda: scores.append(grade("import time; time.sleep(0.5)", label,
                                                           code_max_concurrency=slots)["score"]))
    assert scores == [1.0] and most == slots


def test_output_cap_reports_truncation():
    r = asyncio.run(run_program("print('y' * 5000)", limits=SandboxLimits(max_output_bytes=1000)))
    assert r.truncated and r.reason == "output limit" and len(r.stdout) == 1000


def test_environment_is_clean(monkeypatch):
    monkeypatch.setenv("RLVR_FAKE_SECRET", "hunter2")
    r = asyncio.run(run_program("import os; print(sorted(os.environ))"))
    assert r.ok and json.loads(r.stdout.replace("'", '"')) == ["HOME", "LANG", "LC_ALL", "PATH"]


def test_cancelled_run_leaves_nothing_behind():
    # The grader cancels a reward that outlives --reward-timeout: the run's processes must die.
    async def cancel_midway():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(run_program("import time; time.sleep(100)"), 0.5)

    before = nobody_pids()
    asyncio.run(cancel_midway())
    assert nobody_pids() - before == set()
    for controller in ("pids", "memory"):
        base = own_cgroup_dir(controller)
        if base is not None:
            assert not list(base.glob(f"rlvr-sbx-{os.getpid()}-*")), "the run's cgroup was not removed"


def test_a_killed_process_cannot_act_once_dead():
    # The outlived-the-call checks count only processes that can still run code: a zombie or a
    # process inside exit(2) is dead already, however long /proc keeps listing it.
    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert can_still_act(proc.pid) and can_still_act(os.getpid())
        proc.kill()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # a zombie now, not yet reaped
        assert Path(f"/proc/{proc.pid}").exists() and not can_still_act(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not can_still_act(proc.pid)


def test_without_cgroups_it_falls_back_and_says_so(monkeypatch, tmp_path):
    from rlvr.sandbox import runner as sandbox

    monkeypatch.setattr(sandbox, "CGROUP_ROOT", tmp_path)  # no cgroup hierarchy here
    r = asyncio.run(run_program("print(2 + 2)"))
    assert r.ok and r.stdout == "4\n"
    assert "missing: cgroups (daemons that setsid can outlive the run)" in r.protections
    assert not any(p.endswith(" cgroup") for p in r.protections)
    if IS_ROOT:  # nobody's RLIMIT_NPROC stands in for the pids cgroup
        assert any("RLIMIT_NPROC" in p for p in r.protections), r.protections


def test_workdir_is_private_and_removed():
    r = asyncio.run(run_program("import os; open('f', 'w').write('x'); print(os.getcwd())"))
    assert r.ok and "rlvr-sbx-" in r.stdout
    assert not Path(r.stdout.strip()).exists()


# --------------------------------------------------------------------------- the hostile suite
# name: (allowed reasons, what the machine must offer for the case to be meaningful and safe)
HOSTILE = {
    "fork_bomb": ({"process limit"}, {"fence"}),
    "memory_bomb": ({"memory limit"}, set()),
    "memory_spread": ({"memory limit"}, {"fence"}),
    "infinite_loop": ({"cpu time limit"}, set()),
    "sleep_forever": ({"timeout"}, set()),
    "huge_output": ({"output limit"}, set()),
    "write_outside": ({"exit code 1"}, {"root"}),
    "delete_files": ({"exit code 1"}, {"root"}),
    "read_env": ({"wrong answer"}, set()),
    "network": ({"exit code 1"}, {"root"}),
    "kill_parent": ({"exit code 1"}, {"root"}),
    "daemon": ({"wrong answer"}, {"fence"}),
    "fill_disk": ({"disk limit", "file size limit"}, {"root", "fence"}),
    "raise_limits": ({"exit code 1"}, {"root"}),
    "escape_cgroup": ({"exit code 1"}, {"root", "fence"}),
}
SLACK = 2.0  # seconds a run may take beyond its limit (start-up, clean-up, a loaded machine)
def _driver(spec: dict) -> None:
    """Runs in the fenced child: grade each hostile program, print one JSON line per program."""
    for d in spec["fence"].values():
        Path(d, "cgroup.procs").write_text(str(os.getpid()))
    reward = CodeReward(RewardConfig(**spec["cfg"]))
    label = {"inputs": [""], "outputs": ["ESCAPED"]}  # only a successful attack would pass
    before = nobody_pids()
    for name, source in spec["programs"].items():
        t = time.monotonic()
        result = asyncio.run(reward(Sample(prompt="", prompt_ids=[], label=label, response=source)))
        duration = time.monotonic() - t
        in_fence = {p for d in spec["fence"].values() for p in cgroup_tree_pids(Path(d))} - {os.getpid()}
        left = {p for p in in_fence if can_still_act(p)}
        row = dict(name=name, duration=duration, left=sorted(left | (nobody_pids() - before)), **result)
        if name == "daemon":  # run it once more, raw, to learn the daemon's pid
            raw = asyncio.run(run_program(extract_program(source), limits=reward.limits))
            row["daemon_pid"] = int(raw.stdout.split()[0]) if raw.stdout.strip() else None
            row["daemon_alive"] = row["daemon_pid"] in nobody_pids()
        print(json.dumps(row), flush=True)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    if sys.platform != "linux":
        pytest.skip("the sandbox's limits and the fence need Linux")
    fence = make_fence()
    have = {"fence"} if fence else set()
    if IS_ROOT:
        have.add("root")
    secret = f"hunter2-{os.getpid()}"
    canary_dir = Path(f"/tmp/rlvr-canary-{os.getpid()}")  # world-writable: only the sandbox protects it
    canary_dir.mkdir(mode=0o777)
    canary_dir.chmod(0o777)
    (canary_dir / "canary.txt").write_text("still here")
    outside = [Path(f"/tmp/rlvr-escape-{os.getpid()}"), HOSTILE_DIR / f".escape-{os.getpid()}"]
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    stalls = [0.0]

    def probe():  # the machine stays responsive: how late does a 50 ms sleep wake up?
        while not stop.is_set():
            t = time.monotonic()
            time.sleep(0.05)
            stalls[0] = max(stalls[0], time.monotonic() - t - 0.05)

    subs = {"@PORT@": str(server.getsockname()[1]), "@SECRET@": secret, "@CANARY_DIR@": str(canary_dir),
            "@OUTSIDE_TMP@": str(outside[0]), "@OUTSIDE_REPO@": str(outside[1])}
    programs = {}
    for name, (_, needs) in HOSTILE.items():
        if needs <= have:
            source = (HOSTILE_DIR / f"{name}.pysrc").read_text()
            for k, v in subs.items():
                source = source.replace(k, v)
            programs[name] = f"```python\n{source}```"
    spec = {"fence": {k: str(v) for k, v in (fence or {}).items()}, "cfg": HOSTILE_CFG, "programs": programs}
    threads = [threading.Thread(target=serve, daemon=True), threading.Thread(target=probe, daemon=True)]
    for th in threads:
        th.start()
    # the repository root on the driver's path: it imports tests.support as this module does
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "RLVR_FAKE_SECRET": secret,
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        proc = subprocess.run([sys.executable, __file__, "--driver", json.dumps(spec)], env=env,
                              capture_output=True, text=True, timeout=55)
        rows = {r["name"]: r for r in map(json.loads, proc.stdout.splitlines())}
        driver = {"returncode": proc.returncode, "stderr": proc.stderr[-3000:]}
    except subprocess.TimeoutExpired as e:
        rows, driver = {}, {"returncode": "timeout", "stderr": str(e)}
    finally:
        stop.set()
        # A limit of the fence itself hit means the sandbox's own limit did not hold.
        fence_hits = {}
        if fence:
            fence_hits["pids.max reached"] = int((fence["pids"] / "pids.peak").read_text()) >= FENCE_PIDS
            fence_hits["memory.failcnt"] = int((fence["memory"] / "memory.failcnt").read_text())
        left_in_fence = destroy_fence(fence) if fence else set()
        for th in threads:
            th.join()
        server.close()
    yield dict(rows=rows, driver=driver, have=have, left_in_fence=left_in_fence, fence_hits=fence_hits,
               stall=stalls[0], accepted=len(accepted), canary_dir=canary_dir, outside=outside)
    for conn in accepted:
        conn.close()
    for path in outside:
        path.unlink(missing_ok=True)
    for p in sorted(canary_dir.rglob("*"), reverse=True):
        p.unlink()
    canary_dir.rmdir()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_is_contained(hostile, name):
    reasons, needs = HOSTILE[name]
    if not needs <= hostile["have"]:
        pytest.skip(f"{name} needs {sorted(needs - hostile['have'])}: "
                    "'root' to drop privileges / unshare namespaces, 'fence' a writable cgroup v1")
    row = hostile["rows"].get(name)
    assert row is not None, f"driver produced no result for {name}: {hostile['driver']}"
    assert row["score"] == 0.0, row
    assert any(row["reason"] == f"test 0: {r}" for r in reasons), row
    assert row["duration"] <= HOSTILE_CFG["code_timeout"] + SLACK, row
    assert row["left"] == [], f"processes outlived the call: {row}"
    if name == "daemon":
        assert row["daemon_pid"] is not None and not row["daemon_alive"], row


def test_hostile_suite_left_the_machine_intact(hostile):
    assert hostile["driver"]["returncode"] == 0, hostile["driver"]  # the grader survived
    assert hostile["left_in_fence"] == set(), "processes were left in the fence cgroup"
    hits = hostile["fence_hits"]
    assert not any(hits.values()), f"the fence's own limits were hit, the sandbox's did not hold: {hits}"
    assert hostile["accepted"] == 0, "a sandboxed program reached the test's TCP server"
    assert (hostile["canary_dir"] / "canary.txt").read_text() == "still here"
    assert sorted(p.name for p in hostile["canary_dir"].iterdir()) == ["canary.txt"]
    assert not any(p.exists() for p in hostile["outside"])
    assert hostile["stall"] < 1.0, f"the machine stalled {hostile['stall']:.2f} s during the suite"
    for name, row in sorted(hostile["rows"].items()):  # the measured table (pytest -rP shows it)
        print(f"{name:15s} {row['duration']:5.2f} s  score {row['score']}  {row['reason']}")
    print(f"max stall of a 50 ms sleep during the suite: {hostile['stall'] * 1000:.0f} ms")


def test_root_gets_every_protection(hostile):
    if not IS_ROOT or "fence" not in hostile["have"]:
        pytest.skip("the full set of layers needs root and writable cgroups")
    got = asyncio.run(run_program("pass")).protections
    for layer in ("pids cgroup", "memory cgroup", "network namespace", "read-only filesystem",
                  "tmpfs workdir", "no_new_privs", "uid 65534"):
        assert layer in got, got
    assert PROTECTIONS == {"pids cgroup": True, "memory cgroup": True, "unprivileged uid": True}


if __name__ == "__main__" and sys.argv[1:2] == ["--driver"]:
    _driver(json.loads(sys.argv[2]))
