"""Fault tolerance under Ray (issue 9, ``--ray --use-fault-tolerance``) on a real local Ray
cluster (one per module): engine actor processes are killed (SIGKILL) and hung (SIGSTOP) for
real; the run goes on, nothing is lost or trained twice. Mirrors tests/test_fault_tolerance.py."""

from __future__ import annotations

import glob
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from rlvr.config import parse_config
from rlvr.observe import read_metrics

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

from test_async import _check_exactly_once, _ledger  # noqa: E402  (the same ledger checks)
from test_fault_tolerance import rollouts_logged  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster():
    """One local cluster for the module: 1 training rank + 2 engines, and slack."""
    from rlvr.distributed.placement import ACTOR_ENV

    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": dict(ACTOR_ENV)}, log_to_driver=False)
    yield
    ray.shutdown()


def raylet_pid() -> int:
    """The raylet of the cluster this test started: Ray's worker processes are its children."""
    from ray._private import ray_constants
    from ray._private.worker import _global_node

    return _global_node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid


def engine_pids() -> list[int]:
    """Live engine actor processes of this test's cluster (Ray titles them ``ray::EngineActor...``;
    only children of this cluster's raylet, so another Ray job on the machine is never touched)."""
    pids, raylet = [], raylet_pid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            state, ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue
        if cmd.startswith(b"ray::EngineActor") and state not in ("Z", "T") and int(ppid) == raylet:
            pids.append(int(d.name))
    return sorted(pids)


def manager_log() -> str:
    """What the rollout manager (and every other worker) wrote to stderr in this Ray session."""
    from ray._private.worker import _global_node

    logs = Path(_global_node.get_session_dir_path()) / "logs"
    return "".join(Path(p).read_text(errors="replace") for p in glob.glob(str(logs / "worker-*.err")))


def ft_args(ckpt, train, out, *extra: str) -> list[str]:
    return ["--hf-checkpoint", str(ckpt), "--prompt-data", str(train), "--rm-type", "math",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "64",
            "--lr", "1e-3", "--output-dir", str(out), "--ray", "--actor-num-cpu-workers-per-node", "1",
            "--rollout-num-engines", "2", "--use-fault-tolerance",
            "--rollout-health-check-interval", "0.3", "--rollout-health-check-timeout", "3", *extra]


def killer(run_dir: Path, rng: random.Random, log: list, stop: threading.Event) -> None:
    """SIGKILL the two engines the run started with, in random order, each at a random moment
    (0-0.4 s) after the next rollout is logged, i.e. while the following rollout is sampled."""
    while not stop.is_set() and len(engine_pids()) < 2:
        time.sleep(0.05)
    pids = engine_pids()
    rng.shuffle(pids)
    for pid in pids:
        seen = rollouts_logged(run_dir)
        while not stop.is_set() and rollouts_logged(run_dir) <= seen:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))
        if stop.is_set():
            return
        os.kill(pid, signal.SIGKILL)
        log.append((time.time(), pid))


# Both modes: async keeps groups in flight at every moment (so a kill always cuts requests) and
# pushes weights from the producer's thread while engines restart; sync re-issues within a rollout.
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_chaos_two_sigkills_during_rollout(ray_cluster, tiny_qwen2, arith_files, tmp_path, mode):
    from rlvr.loop import run

    out = tmp_path / "run"
    extra = ["--async", "--max-staleness", "1", "--rollout-concurrency", "8"] if mode == "async" else []
    # 10 rollouts: the kills come after rollouts 0 and 1, and the rest leave the second replacement
    # (a new worker importing torch: 5-12 s here) time to come up before the run ends.
    cfg = parse_config(ft_args(tiny_qwen2, arith_files[0], out, "--num-rollout", "10", *extra))
    kills: list = []
    stop = threading.Event()
    chaos = threading.Thread(target=killer, args=(out, random.Random(9), kills, stop), daemon=True)
    chaos.start()
    t0 = time.time()
    try:
        run_dir = run(cfg, console=False)
    finally:
        stop.set()
        chaos.join(5)
    assert len(kills) == 2, "the run ended before both kills"
    # the run finished, and every prompt group was trained exactly once
    rows = _ledger(run_dir)
    _check_exactly_once(rows, n=2, batch=4)
    trained = [r for r in rows if r["trained"]]
    assert len(trained) == 10 * 8 and all(r["status"] != "failed" for r in trained)
    # the restarts are visible in the metrics and the logs
    rollouts = [r for r in read_metrics(run_dir) if "rollout/step" in r]
    last = rollouts[-1]
    print(f"{mode} chaos run {time.time() - t0:.1f} s: kills {kills}; restarts {last['rollout/engine_restarts']}, "
          f"re-issued {last['rollout/engine_reissued_requests']}, engines up {last['rollout/engines_up']}")
    assert last["rollout/engine_restarts"] == 2.0 and last["rollout/engines_up"] == 2.0
    assert last["rollout/engine_reissued_requests"] >= 1.0  # a kill cut requests in flight
    text = manager_log()
    for _, pid in kills:
        assert f"(pid {pid}) is down" in text, f"no 'is down' log line for pid {pid}"
    assert text.count("restarted as pid") >= 2


def test_hung_engine_is_detected_within_the_timeout_and_replaced(ray_cluster, tiny_qwen2, arith_files, tmp_path):
    """One engine SIGSTOPped while it samples a rollout: detected within interval + timeout,
    killed, replaced with the current weights, and the rollout's requests answered. Then the
    replacement dies too: with --rollout-max-engine-restarts 1 it is removed, and with no engine
    left the next rollout fails with a clear error."""
    from rlvr.loop import build

    interval, timeout = 0.3, 2.0
    cfg = parse_config(ft_args(tiny_qwen2, arith_files[0], tmp_path / "run", "--num-rollout", "1",
                               "--rollout-num-engines", "1", "--rollout-max-response-len", "256",
                               "--rollout-health-check-timeout", str(timeout), "--rollout-max-engine-restarts", "1"))
    with build(cfg) as c:
        c.rollout.update_weights(c.trainer.weights(), version=3)  # the replacement must get these
        [hung] = c.rollout.engine_pids()
        box: dict = {}
        work = threading.Thread(target=lambda: box.setdefault("batch", c.rollout.generate(0)))
        work.start()
        time.sleep(0.5)  # requests in flight
        os.kill(hung, signal.SIGSTOP)
        t_stop = time.time()
        work.join(120)
        assert "batch" in box, "the requests were not re-issued to the replacement"
        events = c.rollout.engine_events()
        down = next(e for e in events if e["event"] == "down")
        print(f"hung engine detected {down['time'] - t_stop:.2f} s after SIGSTOP "
              f"(interval {interval} + timeout {timeout}); events {events}")
        assert down["pid"] == hung and "unanswered" in down["reason"]
        assert down["time"] - t_stop <= timeout + interval + 0.5  # detected within the health-check timeout
        assert any(e["event"] == "restarted" for e in events) and c.rollout.engine_pids()[0] != hung
        batch = box["batch"]
        assert len(batch.samples) == 8 and all(s.response_length > 0 for s in batch.samples)
        assert {v for s in batch.samples for v in s.weight_versions} == {3}  # sampled by the pushed weights
        reissued = batch.metrics["rollout/engine_reissued_requests"]  # the groups still in flight at SIGSTOP
        assert 2.0 <= reissued <= 8.0 and reissued % 2 == 0
        assert batch.metrics["rollout/engine_restarts"] == 1.0
        for _ in range(50):  # the stopped process was killed, not left stopped
            if hung not in engine_pids() and not Path(f"/proc/{hung}").exists():
                break
            time.sleep(0.1)
        assert not Path(f"/proc/{hung}").exists() or "T" not in Path(f"/proc/{hung}/stat").read_text().split()[2]
        [replacement] = c.rollout.engine_pids()
        os.kill(replacement, signal.SIGKILL)
        with pytest.raises(Exception, match="every engine was removed after --rollout-max-engine-restarts 1"):
            c.rollout.generate(1)
        assert [e["event"] for e in c.rollout.engine_events()] == ["down", "restarted", "down", "removed"]
