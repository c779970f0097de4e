"""Fault tolerance under Ray (``--ray --use-fault-tolerance``) on a real local Ray
cluster (one per module): engine actor processes are killed (SIGKILL) and hung (SIGSTOP) for
real; the run goes on, nothing is lost or trained twice. Mirrors tests/test_fault_tolerance.py."""

from __future__ import annotations

import glob
import os
import signal
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from rlvr.runtime.configure import parse_config
from tests.support import (check_monitor_survives_a_kill, check_trained_once_none_failed, hold_rollout_until,
                           run_under_kills, wait_until)

SERIAL_GROUP = "ray"  # one xdist worker for the group's modules (tests/conftest.py)

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow



RAY_NUM_CPUS = 4  # the ray_cluster fixture (conftest.py): 1 training rank + 2 engines, and slack


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


def ray_engine_probe(monkeypatch):
    """(pids, in_flight) of the engines of the ``RayRollout`` the run builds (``test_fault_tolerance.killer``'s
    arguments). Requests in flight are asked of the engine actor itself (``load``): the rollout
    manager answers nothing while it samples."""
    from rlvr.distributed import rollout_manager

    built, actors = [], {}
    real_setup = rollout_manager.RayRollout.setup

    def setup(self):
        real_setup(self)
        built.append(self)

    monkeypatch.setattr(rollout_manager.RayRollout, "setup", setup)

    def pids() -> list[int]:
        if not built:
            return []
        if not actors:
            actors.update(zip(built[0].engine_pids(), built[0].engine_actors()))
        return [p for p in actors if p is not None]

    def in_flight(pid: int) -> bool:
        return ray.get(actors[pid].load.remote())["num_reqs"] > 0

    def all_up() -> bool:
        return None not in built[0].engine_pids()

    return pids, in_flight, all_up


# Both modes: async keeps groups in flight at every moment (so a kill always cuts requests) and
# pushes weights from the producer's thread while engines restart; sync re-issues within a rollout.
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_chaos_two_sigkills_during_rollout(ray_cluster, tiny_qwen2, arith_files, tmp_path, monkeypatch, mode):
    out = tmp_path / "run"
    extra = ["--async", "--max-staleness", "1", "--rollout-concurrency", "8"] if mode == "async" else []
    # 10 rollouts: the kills come after rollouts 0 and 1 (once the victim is decoding).
    cfg = parse_config(ft_args(tiny_qwen2, arith_files[0], out, "--num-rollout", "10", *extra))
    pids, in_flight, all_up = ray_engine_probe(monkeypatch)
    # A replacement is a new worker importing torch (5-30 s on a busy CPU): the last rollout waits
    # for both to be up, so its engines_up is the state after recovery, not a race with the run's end.
    from rlvr.distributed.rollout_manager import RayAsyncSource, RayRollout

    hold_rollout_until(monkeypatch, ((RayRollout, "generate"), (RayAsyncSource, "next_batch")), 9, all_up,
                       "both killed engines are replaced and up")
    t0 = time.time()
    run_dir, kills = run_under_kills(cfg, out, pids, in_flight, seed=9)
    # the run finished, and every prompt group was trained exactly once
    last = check_trained_once_none_failed(run_dir, rollouts=10)
    # the restarts are visible in the metrics and the logs
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
    from rlvr.runtime.loop import build

    interval, timeout = 0.3, 2.0
    cfg = parse_config(ft_args(tiny_qwen2, arith_files[0], tmp_path / "run", "--num-rollout", "1",
                               "--rollout-num-engines", "1", "--rollout-max-response-len", "256",
                               "--rollout-health-check-timeout", str(timeout), "--rollout-max-engine-restarts", "1"))
    with build(cfg) as c:
        c.rollout.update_weights(c.trainer.weights(), version=3)  # the replacement must get these
        [hung], [actor] = c.rollout.engine_pids(), c.rollout.engine_actors()
        box: dict = {}
        work = threading.Thread(target=lambda: box.setdefault("batch", c.rollout.generate(0)))
        work.start()
        # the rollout's groups reach the engine: 4 groups of 2 x up to 256 tokens take far longer than
        # this wait's 5 ms polls, so the stop lands while they sample (a fixed sleep raced the rollout)
        wait_until(lambda: ray.get(actor.load.remote())["num_reqs"] > 0, "the engine has the rollout's requests",
                   poll=0.005)
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
        # the stopped process was killed, not left stopped
        wait_until(lambda: not Path(f"/proc/{hung}").exists() or "T" not in Path(f"/proc/{hung}/stat").read_text().split()[2],
                   f"the hung engine (pid {hung}) is killed, not left stopped", timeout=5)
        [replacement] = c.rollout.engine_pids()
        os.kill(replacement, signal.SIGKILL)
        with pytest.raises(Exception, match="every engine was removed after --rollout-max-engine-restarts 1"):
            c.rollout.generate(1)
        assert [e["event"] for e in c.rollout.engine_events()] == ["down", "restarted", "down", "removed"]


def test_a_monitor_that_raises_still_restarts_a_killed_engine(ray_cluster, tiny_qwen2, arith_files, tmp_path, caplog,
                                                              monkeypatch):
    """test_fault_tolerance.py's scenario on the Ray transport: the supervised engine-actor group
    is built in this process (so the injected monitor errors and the logs are this test's); every
    other health check raises, a SIGKILLed engine actor is still restarted and answers."""
    import logging

    from ray.util.placement_group import remove_placement_group

    from rlvr.distributed.engines import TolerantEngineGroup, make_engine_actor
    from rlvr.distributed.placement import placement_group, plan
    from rlvr.core.testing import RAISE_AT_ENV

    cfg = parse_config(ft_args(tiny_qwen2, arith_files[0], tmp_path / "run", "--rollout-num-engines", "1",
                               "--rollout-health-check-timeout", "2", "--rollout-max-engine-restarts", "1"))
    p = plan(cfg.cluster, 1)
    pg = placement_group(p)
    monkeypatch.setenv(RAISE_AT_ENV, "engine-monitor:2")
    group = None
    try:
        with caplog.at_level(logging.ERROR, logger="rlvr.engine.remote.supervisor"):
            group = TolerantEngineGroup(partial(make_engine_actor, cfg, pg, p, os.getcwd()), cfg.engine, 1)
            check_monitor_survives_a_kill(group.supervisor, caplog)
    finally:
        if group is not None:
            group.close()
        remove_placement_group(pg)
