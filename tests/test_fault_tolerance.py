"""Fault tolerance: real ``rlvr serve`` processes on 127.0.0.1, killed (SIGKILL) and
hung (SIGSTOP) for real; the run goes on, nothing is lost or trained twice."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
from transformers import AutoModelForCausalLM

import rlvr.runtime.build
from rlvr.runtime.configure import parse_config
from rlvr.config.engine import EngineConfig
from rlvr.engine.remote.processes import ServeProcesses
from rlvr.engine.remote.supervisor import EngineSupervisor
from rlvr.runtime.loop import Step, run
from rlvr.observe import read_metrics
from rlvr.core.testing import RAISE_AT_ENV, RUN_SILENT_ENV
from tests.support import (check_monitor_survives_a_kill, check_trained_once_none_failed, generate_requests,
                           hold_rollout_until, run_under_kills, wait_until)

pytestmark = pytest.mark.slow



def engine_pids(checkpoint: Path) -> list[int]:
    """Live ``rlvr serve`` children of this test process serving ``checkpoint``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"serve" in cmd and str(checkpoint).encode() in cmd and state != "Z":
            pids.append(int(d.name))
    return sorted(pids)


def supervise(checkpoint: Path, tmp_path: Path, n: int, max_restarts: int) -> EngineSupervisor:
    """``n`` supervised ``rlvr serve`` processes, health-checked every 0.3 s, hung after 2 s."""
    settings = EngineConfig(rollout_num_engines=n, use_fault_tolerance=True, rollout_health_check_interval=0.3,
                            rollout_health_check_timeout=2.0, rollout_max_engine_restarts=max_restarts)
    return EngineSupervisor(ServeProcesses(checkpoint, log_dir=tmp_path / "engines"), settings)


def local_engine_probe(monkeypatch) -> tuple[Callable[[], list[int]], Callable[[int], bool], Callable[[], bool]]:
    """(pids, in_flight, recovered) of the supervisor the run builds (caught as ``build_engine``
    returns it); ``recovered()``: both engines were restarted and are up."""
    built: list[EngineSupervisor] = []
    real = rlvr.runtime.build.build_engine
    monkeypatch.setattr(rlvr.runtime.build, "build_engine", lambda *a: built.append(real(*a)) or built[-1])

    def pids() -> list[int]:
        return [s.pid for s in built[0].slots if s.up] if built else []

    def in_flight(pid: int) -> bool:
        return any(s.pid == pid and s.up and s.outstanding > 0 for s in built[0].slots)

    def recovered() -> bool:
        stats = built[0].stats() if built else {}
        return stats.get("rollout/engine_restarts") == 2.0 and stats.get("rollout/engines_up") == 2.0

    return pids, in_flight, recovered


# A tiny-model rollout here takes 0.01-0.2 s and each kill lands up to 0.4 s after a rollout is
# logged once the victim has requests in flight, so the run needs rollouts enough for both kills to
# land (8 were seen to end first); the last one then waits until both engines are restarted and up.
ROLLOUTS = 40


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_chaos_two_sigkills_during_rollout(tiny_qwen2, arith_files, tmp_path, caplog, monkeypatch, mode):
    train, _ = arith_files
    out = tmp_path / "run"
    args = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(train), "--rm-type", "math",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "64",
            "--num-rollout", str(ROLLOUTS), "--lr", "1e-3", "--output-dir", str(out),
            "--use-fault-tolerance", "--rollout-num-engines", "2",
            "--rollout-health-check-interval", "0.3", "--rollout-health-check-timeout", "2"]
    if mode == "async":
        args += ["--async", "--max-staleness", "1", "--rollout-concurrency", "8"]
    cfg = parse_config(args)
    pids, in_flight, recovered = local_engine_probe(monkeypatch)
    hold_rollout_until(monkeypatch, ((Step, "rollout"),), ROLLOUTS - 1, recovered, "both killed engines are back up")
    with caplog.at_level(logging.WARNING, logger="rlvr.engine.remote.supervisor"):
        run_dir, kills = run_under_kills(cfg, out, pids, in_flight, seed=9)
    # the run finished, and every prompt group was trained exactly once
    last = check_trained_once_none_failed(run_dir, rollouts=ROLLOUTS)
    # the restarts are visible in the metrics and the logs
    assert last["rollout/engine_restarts"] == 2.0
    assert last["rollout/engine_reissued_requests"] >= 1.0  # a kill cut requests in flight
    downs = [r for r in caplog.records if "is down" in r.getMessage()]
    restarts = [r for r in caplog.records if "restarted as pid" in r.getMessage()]
    assert last["rollout/engines_up"] == 2.0  # the last rollout waited for both replacements
    assert len(downs) == 2 and len(restarts) == 2
    down_slots = {m.getMessage().split()[1] for m in downs}
    assert {m.getMessage().split()[1] for m in restarts} <= down_slots
    assert {pid for _, pid in kills} <= {int(m.getMessage().split("(pid ")[1].split(")")[0]) for m in downs}
    assert not engine_pids(tiny_qwen2)  # the run stopped its engines


def test_hung_engine_is_detected_within_the_timeout_and_replaced(tiny_qwen2, tmp_path):
    interval, timeout = 0.3, 2.0
    sup = supervise(tiny_qwen2, tmp_path, 1, max_restarts=2)
    try:
        model = AutoModelForCausalLM.from_pretrained(tiny_qwen2)
        sup.update_weights(dict(model.named_parameters()), version=3)  # the restarted engine must get these
        hung = sup.slots[0].pid
        box = {}
        work = threading.Thread(target=lambda: box.setdefault("r", asyncio.run(sup.generate(generate_requests(8, 400)))))
        work.start()
        # 8 x 400 tokens (EOS ignored) take seconds: all 8 are still in flight at the stop
        wait_until(lambda: sup.slots[0].outstanding == 8, "the engine has the 8 requests in flight")
        os.kill(hung, signal.SIGSTOP)
        t_stop = time.time()
        work.join(120)
        assert "r" in box, "the requests were not re-issued to the replacement"
        down = next(e for e in sup.events if e["event"] == "down")
        assert down["pid"] == hung and "unanswered" in down["reason"]
        assert down["time"] - t_stop <= timeout + interval + 0.5  # detected within the health-check timeout
        assert any(e["event"] == "restarted" for e in sup.events) and sup.slots[0].pid != hung
        results = box["r"]
        assert [r.rid for r in results] == [f"r{i}" for i in range(8)]
        assert all(r.finish_reason in ("stop", "length") and r.token_ids for r in results)
        assert all(set(r.weight_versions) == {3} for r in results)  # sampled by the pushed weights
        assert sup.stats()["rollout/engine_reissued_requests"] == 8.0
        with pytest.raises(ProcessLookupError):  # the hung process was killed (and reaped), not left stopped
            os.kill(hung, 0)
    finally:
        sup.close()


def test_an_engine_that_keeps_dying_is_removed(tiny_qwen2, tmp_path):
    sup = supervise(tiny_qwen2, tmp_path, 2, max_restarts=1)
    try:
        def wait_for(event: str) -> None:
            wait_until(lambda: any(e["event"] == event and e["slot"] == 0 for e in sup.events),
                       f"engine 0 is {event}", timeout=120)

        os.kill(sup.slots[0].pid, signal.SIGKILL)
        wait_for("restarted")
        os.kill(sup.slots[0].pid, signal.SIGKILL)  # the replacement dies too: no restarts left
        wait_for("removed")
        assert sup.slots[0].removed and not sup.slots[0].up
        assert [e["event"] for e in sup.events if e["slot"] == 0] == ["down", "restarted", "down", "removed"]
        results = asyncio.run(sup.generate(generate_requests(4, 8)))  # the run goes on with the other engine
        assert all(r.finish_reason in ("stop", "length") for r in results)
        assert sup.stats() == {"rollout/engine_restarts": 1.0, "rollout/engine_reissued_requests": 0.0,
                               "rollout/engines_up": 1.0}
    finally:
        sup.close()


def test_a_monitor_that_raises_still_restarts_a_killed_engine(tiny_qwen2, tmp_path, caplog, monkeypatch):
    """Every other health check of the monitor raises (``rlvr.core.testing.fault_point``): the monitor
    logs it and goes on, so a SIGKILLed engine is still detected, restarted with the newest weights
    and serves again. (A monitor thread that died with its first error would never restart it.)
    The Ray transport runs the same scenario in tests/test_ray_fault_tolerance.py."""
    monkeypatch.setenv(RAISE_AT_ENV, "engine-monitor:2")
    with caplog.at_level(logging.ERROR, logger="rlvr.engine.remote.supervisor"):
        sup = supervise(tiny_qwen2, tmp_path, 1, max_restarts=1)
        try:
            check_monitor_survives_a_kill(sup, caplog)
        finally:
            sup.close()


def test_chaos_run_ledger_is_json(tmp_path):
    """(the ledger helper reads what ``write_ledger`` writes)"""
    from rlvr.observe.run_files import write_ledger
    from rlvr.core.types import Sample

    s = Sample("p", [1], uid="0/0", response_ids=[5, 6], weight_versions=[1, 2])
    write_ledger(tmp_path / "ledger.jsonl", 3, [s], trained=True)
    row = json.loads((tmp_path / "ledger.jsonl").read_text())
    assert row["staleness"] == 2 and row["version_min"] == 1 and row["version_max"] == 2


# What the supervisor reports about its engines (the kills themselves), not what the run computed.
ENGINE_STATE = ("rollout/engine_restarts", "rollout/engine_reissued_requests", "rollout/engines_up")


@pytest.fixture
def deterministic_process():
    """``--deterministic-mode`` in this process (``use_deterministic_mode``) undone after the test."""
    before = torch.are_deterministic_algorithms_enabled(), dict(os.environ)
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, False
    os.environ.clear()
    os.environ.update(before[1])


def test_deterministic_run_is_exact_through_engine_kills(tiny_qwen2, arith_files, tmp_path, monkeypatch,
                                                         deterministic_process):
    """With --deterministic-mode, a run whose two ``rlvr serve`` engines are SIGKILLed mid-rollout
    logs every value the undisturbed run logs: a cut-off call is re-issued whole with its seeds to
    an engine holding the same weights (a restarted one is loaded with the current ones), and each
    call is decoded in forwards of its own, so neither the kill nor the other engine's load shows."""
    # the tiny model's rollouts may have no reward variance at all: run every sample's forward, whose numbers this checks
    monkeypatch.setenv(RUN_SILENT_ENV, "1")
    train, _ = arith_files

    def go(name: str, kill: bool) -> dict:
        out = tmp_path / name
        cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(train), "--rm-type", "math",
                            "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--rollout-max-response-len",
                            "48", "--num-rollout", "6", "--lr", "1e-3", "--output-dir", str(out),
                            "--use-fault-tolerance", "--rollout-num-engines", "2", "--deterministic-mode",
                            "--rollout-health-check-interval", "0.3", "--rollout-health-check-timeout", "2"])
        with monkeypatch.context() as m:
            pids, in_flight, recovered = local_engine_probe(m)
            if kill:  # both kills happened (run_under_kills checks it), both engines back for the last rollout
                hold_rollout_until(m, ((Step, "rollout"),), 5, recovered, "both killed engines are back up")
                run_dir, _ = run_under_kills(cfg, out, pids, in_flight, seed=3)
            else:
                run_dir = run(cfg, console=False)
        records = {}
        for r in read_metrics(run_dir):
            key = next((k, r[k]) for k in ("rollout/step", "train/step") if k in r)
            records[key] = {k: v for k, v in r.items() if k != "time" and not k.startswith("perf/") and k not in ENGINE_STATE}
        if kill:
            last = [r for r in read_metrics(run_dir) if "rollout/step" in r][-1]
            assert last["rollout/engine_restarts"] == 2.0 and last["rollout/engine_reissued_requests"] >= 1
        return records

    calm, killed = go("calm", False), go("killed", True)
    assert calm.keys() == killed.keys() and len(calm) == 12
    for key, values in calm.items():
        assert killed[key] == values, key  # bit for bit
    assert calm[("train/step", 6)]["train/entropy_loss"] != calm[("train/step", 1)]["train/entropy_loss"]  # not constant
