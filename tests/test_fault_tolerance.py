"""Fault tolerance (issue 9): real ``rlvr serve`` processes on 127.0.0.1, killed (SIGKILL) and
hung (SIGSTOP) for real; the run goes on, nothing is lost or trained twice."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from rlvr.config import parse_config
from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.supervisor import EngineSupervisor
from rlvr.loop import run
from rlvr.observe import read_metrics

pytestmark = pytest.mark.slow

from test_async import _check_exactly_once, _ledger  # noqa: E402  (the same ledger checks)


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


def rollouts_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    return sum('"rollout/step"' in line for line in path.read_text().splitlines())


def killer(checkpoint: Path, run_dir: Path, rng: random.Random, log: list, stop: threading.Event):
    """SIGKILL the two engines the run started with, in random order, each at a random moment
    (0-0.4 s) after the next rollout is logged. The second may die before the first one's
    replacement is up: then no engine is left for a while, and the run must wait, not fail."""
    while not stop.is_set() and len(engine_pids(checkpoint)) < 2:
        time.sleep(0.05)
    pids = engine_pids(checkpoint)
    rng.shuffle(pids)
    for pid in pids:
        seen = rollouts_logged(run_dir)
        while not stop.is_set() and rollouts_logged(run_dir) <= seen:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.4))
        if stop.is_set():
            return
        os.kill(pid, signal.SIGKILL)
        log.append((time.time(), pid))


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_chaos_two_sigkills_during_rollout(tiny_qwen2, arith_files, tmp_path, caplog, mode):
    train, _ = arith_files
    out = tmp_path / "run"
    args = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(train), "--rm-type", "math",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "64",
            "--num-rollout", "8", "--lr", "1e-3", "--output-dir", str(out),
            "--use-fault-tolerance", "--rollout-num-engines", "2",
            "--rollout-health-check-interval", "0.3", "--rollout-health-check-timeout", "2"]
    if mode == "async":
        args += ["--async", "--max-staleness", "1", "--rollout-concurrency", "8"]
    cfg = parse_config(args)
    kills: list = []
    stop = threading.Event()
    chaos = threading.Thread(target=killer, args=(tiny_qwen2, out, random.Random(9), kills, stop), daemon=True)
    with caplog.at_level(logging.WARNING, logger="rlvr.engine.supervisor"):
        chaos.start()
        run_dir = run(cfg, console=False)
    stop.set()
    chaos.join(5)
    assert len(kills) == 2, "the run ended before both kills"
    # the run finished, and every prompt group was trained exactly once
    rows = _ledger(run_dir)
    _check_exactly_once(rows, n=2, batch=4)
    trained = [r for r in rows if r["trained"]]
    assert len(trained) == 8 * 8 and all(r["status"] != "failed" for r in trained)
    # the restarts are visible in the metrics and the logs
    rollouts = [r for r in read_metrics(run_dir) if "rollout/step" in r]
    assert rollouts[-1]["rollout/engine_restarts"] == 2.0
    assert rollouts[-1]["rollout/engine_reissued_requests"] >= 1.0  # a kill cut requests in flight
    downs = [r for r in caplog.records if "is down" in r.getMessage()]
    restarts = [r for r in caplog.records if "restarted as pid" in r.getMessage()]
    assert len(downs) == 2 and len(restarts) == 2
    assert {pid for _, pid in kills} <= {int(m.getMessage().split("pid ")[1].split(",")[0]) for m in downs}
    assert not engine_pids(tiny_qwen2)  # the run stopped its engines


def _requests(n: int, max_new: int) -> list[GenerateRequest]:
    return [GenerateRequest([40, 41, 42, 43], SamplingParams(max_new_tokens=max_new), rid=f"r{i}") for i in range(n)]


def test_hung_engine_is_detected_within_the_timeout_and_replaced(tiny_qwen2, tmp_path):
    interval, timeout = 0.3, 2.0
    sup = EngineSupervisor(str(tiny_qwen2), 1, health_check_interval=interval, health_check_timeout=timeout,
                           max_restarts=2, log_dir=tmp_path / "engines")
    try:
        model = AutoModelForCausalLM.from_pretrained(tiny_qwen2)
        sup.update_weights(dict(model.named_parameters()), version=3)  # the restarted engine must get these
        hung = sup.slots[0].proc.pid
        box = {}
        work = threading.Thread(target=lambda: box.setdefault("r", asyncio.run(sup.generate(_requests(8, 400)))))
        work.start()
        time.sleep(0.3)  # requests in flight
        os.kill(hung, signal.SIGSTOP)
        t_stop = time.time()
        work.join(120)
        assert "r" in box, "the requests were not re-issued to the replacement"
        down = next(e for e in sup.events if e["event"] == "down")
        assert down["pid"] == hung and "unanswered" in down["reason"]
        assert down["time"] - t_stop <= timeout + interval + 0.5  # detected within the health-check timeout
        assert any(e["event"] == "restarted" for e in sup.events) and sup.slots[0].proc.pid != hung
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
    sup = EngineSupervisor(str(tiny_qwen2), 2, health_check_interval=0.3, health_check_timeout=2.0,
                           max_restarts=1, log_dir=tmp_path / "engines")
    try:
        def wait_for(event: str) -> None:
            deadline = time.time() + 60
            while time.time() < deadline and not any(e["event"] == event and e["slot"] == 0 for e in sup.events):
                time.sleep(0.05)

        os.kill(sup.slots[0].proc.pid, signal.SIGKILL)
        wait_for("restarted")
        os.kill(sup.slots[0].proc.pid, signal.SIGKILL)  # the replacement dies too: no restarts left
        wait_for("removed")
        assert sup.slots[0].removed and not sup.slots[0].up
        assert [e["event"] for e in sup.events if e["slot"] == 0] == ["down", "restarted", "down", "removed"]
        results = asyncio.run(sup.generate(_requests(4, 8)))  # the run goes on with the other engine
        assert all(r.finish_reason in ("stop", "length") for r in results)
        assert sup.stats() == {"rollout/engine_restarts": 1.0, "rollout/engine_reissued_requests": 0.0,
                               "rollout/engines_up": 1.0}
    finally:
        sup.close()


def test_chaos_run_ledger_is_json(tmp_path):
    """(the ledger helper reads what ``write_ledger`` writes)"""
    from rlvr.observe.run_files import write_ledger
    from rlvr.types import Sample

    s = Sample("p", [1], uid="0/0", response_ids=[5, 6], weight_versions=[1, 2])
    write_ledger(tmp_path / "ledger.jsonl", 3, [s], trained=True)
    row = json.loads((tmp_path / "ledger.jsonl").read_text())
    assert row["staleness"] == 2 and row["version_min"] == 1 and row["version_max"] == 2
