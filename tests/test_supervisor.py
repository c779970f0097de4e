"""The engine supervisor's policy on an in-memory transport (fast; the real transports are killed
for real in tests/test_fault_tolerance.py and tests/test_ray_fault_tolerance.py): re-issue
exactly once, restart with the newest weights, removal, ``EnginesLost``, a monitor that survives
its own errors."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from concurrent.futures import Future

import pytest

from rlvr.engine.base import GenerateRequest, GenerateResult, SamplingParams
from rlvr.config.engine import EngineConfig
from rlvr.engine.remote.supervisor import EngineDown, EngineSupervisor, EnginesLost
from rlvr.core.testing import RAISE_AT_ENV, InjectedFault
from tests.support import wait_until


class FakeEngine:
    def __init__(self, index: int, restarts: int, pid: int):
        self.index, self.restarts, self.pid, self.version, self.dead = index, restarts, pid, 0, False


class FakeEngines:
    """``Transport`` over ``FakeEngine``s: a request takes ``latency`` s; ``crash(i)`` kills one."""

    batched = False

    def __init__(self, latency: float = 0.0, ready_delay: float = 0.0):
        self.latency, self.ready_delay = latency, ready_delay
        self.pids = itertools.count(100)
        self.engines: list[FakeEngine] = []

    def launch(self, index: int, restarts: int) -> FakeEngine:
        engine = FakeEngine(index, restarts, next(self.pids))
        self.engines.append(engine)
        return engine

    def wait_ready(self, engine: FakeEngine, index: int) -> int:
        time.sleep(self.ready_delay if engine.restarts else 0.0)  # a replacement loads slowly
        return engine.pid

    def exit_code(self, engine: FakeEngine) -> int | None:
        return -9 if engine.dead else None

    def probe(self, engine: FakeEngine, timeout: float) -> Future:
        future: Future = Future()
        future.set_result(True)
        return future

    def kill(self, engine: FakeEngine, graceful: bool = False) -> None:
        engine.dead = True

    def stage_weights(self, weights, version: int):
        return weights

    def push_weights(self, engine: FakeEngine, payload, version: int) -> None:
        if engine.dead:
            raise EngineDown("dead", dead=True)
        engine.version = version

    async def send(self, engine: FakeEngine, requests: list[GenerateRequest]) -> list[GenerateResult]:
        deadline = time.monotonic() + self.latency
        while time.monotonic() < deadline:
            if engine.dead:
                raise EngineDown("connection reset", dead=True)
            await asyncio.sleep(0.01)
        return [GenerateResult(q.rid, [engine.index], [0.0], "length", engine.version, {"pid": engine.pid})
                for q in requests]

    def abort(self, engine: FakeEngine, rid: str | None) -> None:
        pass

    def close(self) -> None:
        pass


def settings(n: int, max_restarts: int = 2) -> EngineConfig:
    return EngineConfig(rollout_num_engines=n, use_fault_tolerance=True, rollout_health_check_interval=0.05,
                        rollout_health_check_timeout=0.5, rollout_max_engine_restarts=max_restarts)


def requests(n: int) -> list[GenerateRequest]:
    return [GenerateRequest([1, 2], SamplingParams(max_new_tokens=1), rid=f"r{i}") for i in range(n)]


def test_least_outstanding_spread_and_reissue_exactly_once():
    fake = FakeEngines(latency=0.5)
    sup = EngineSupervisor(fake, settings(2))
    try:
        box = {}
        work = threading.Thread(target=lambda: box.setdefault("r", asyncio.run(sup.generate(requests(6)))))
        work.start()
        wait_until(lambda: [s.outstanding for s in sup.slots] == [3, 3], "both engines have 3 requests in flight")
        first = fake.engines[0]
        first.dead = True  # crashes with 3 requests in flight
        work.join(30)
        results = box["r"]
        assert [r.rid for r in results] == [f"r{i}" for i in range(6)]  # one result per request, in order
        assert all(r.meta["pid"] != first.pid for r in results)  # none taken from the dead engine
        assert sup.stats()["rollout/engine_reissued_requests"] == 3.0
        wait_until(lambda: sup.slots[0].up, "engine 0 is restarted")
        assert [e["event"] for e in sup.events] == ["down", "restarted"]
        assert sup.stats() == {"rollout/engine_restarts": 1.0, "rollout/engine_reissued_requests": 3.0,
                               "rollout/engines_up": 2.0}
    finally:
        sup.close()


def test_a_restarted_engine_gets_weights_pushed_while_it_loads():
    fake = FakeEngines(ready_delay=0.5)
    sup = EngineSupervisor(fake, settings(1))
    try:
        sup.update_weights({"w": 1}, version=1)
        fake.engines[0].dead = True
        wait_until(lambda: len(fake.engines) == 2, "the replacement is launched")
        sup.update_weights({"w": 2}, version=2)  # lands while the replacement loads version 1's
        wait_until(lambda: sup.slots[0].up, "engine 0 is restarted")
        assert fake.engines[1].version == 2 and sup.events[-1]["reason"] == "weights v2"
        [result] = asyncio.run(sup.generate(requests(1)))
        assert result.weight_version == 2
    finally:
        sup.close()


def test_no_engine_left_fails_with_engines_lost():
    fake = FakeEngines()
    sup = EngineSupervisor(fake, settings(1, max_restarts=0))
    try:
        fake.engines[0].dead = True
        wait_until(lambda: sup.slots[0].removed, "engine 0 is removed")
        with pytest.raises(EnginesLost, match="every engine was removed after --rollout-max-engine-restarts 0"):
            asyncio.run(sup.generate(requests(2)))
        assert [e["event"] for e in sup.events] == ["down", "removed"]
    finally:
        sup.close()


def test_the_monitor_survives_its_own_errors(monkeypatch, caplog):
    monkeypatch.setenv(RAISE_AT_ENV, "engine-monitor:2")  # every other check raises

    def injected() -> int:
        return sum(bool(r.exc_info) and isinstance(r.exc_info[1], InjectedFault) for r in caplog.records)

    fake = FakeEngines()
    with caplog.at_level(logging.ERROR, logger="rlvr.engine.remote.supervisor"):
        sup = EngineSupervisor(fake, settings(1))
        try:
            wait_until(lambda: injected() >= 2, "the monitor has raised twice")  # a monitor that died would not
            fake.engines[0].dead = True
            wait_until(lambda: sup.slots[0].up and sup.slots[0].pid != fake.engines[0].pid, "engine 0 is restarted")
            after = injected()
            wait_until(lambda: injected() > after, "the monitor raises again after the restart")
            assert sup._monitor.is_alive()
        finally:
            sup.close()


def test_session_affinity_keeps_a_sessions_turns_on_one_engine_while_it_is_up():
    """Turns of one session go to the engine of its first turn even when least-outstanding would
    pick another; when that engine dies the session moves to a live one and stays there."""
    fake = FakeEngines(latency=0.3, ready_delay=1.0)
    sup = EngineSupervisor(fake, settings(2))

    def turn(session: str, i: int) -> int:  # the engine that served the turn (FakeEngines answers its index)
        req = GenerateRequest([1, 2], SamplingParams(max_new_tokens=1), rid=f"{session}#{i}", session=session)
        return asyncio.run(sup.generate([req]))[0].token_ids[0]

    try:
        assert turn("a", 1) == 0 and turn("b", 1) == 0  # both idle: the first engine
        box = {}
        busy = threading.Thread(target=lambda: box.setdefault("r", asyncio.run(sup.generate(requests(4)))))
        busy.start()  # 4 requests without a session: 2 on each engine
        wait_until(lambda: [s.outstanding for s in sup.slots] == [2, 2], "both engines are busy")
        with sup._lock:
            sup.slots[0].outstanding += 5  # engine 0 looks loaded: least-outstanding alone would pick 1
        try:
            assert turn("a", 2) == 0 and turn("c", 1) == 1  # a keeps its engine; a new session does not
        finally:
            with sup._lock:
                sup.slots[0].outstanding -= 5
        busy.join(30)
        fake.engines[0].dead = True
        wait_until(lambda: sup.events, "engine 0 is seen down")
        assert not sup.slots[0].up and turn("a", 3) == 1  # moved: its engine is down (restarting for 1 s)
        wait_until(lambda: sup.slots[0].up, "engine 0 is restarted")
        assert [turn("a", 4), turn("b", 2)] == [1, 0]  # a stays where it moved; b's engine is back up
    finally:
        sup.close()
