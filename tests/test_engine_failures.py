"""The one engine-failure policy (``rlvr.engine.remote.failures``), as the HTTP client of external servers
and the engine supervisor both follow it: a failed call is retried on another engine, the engine
that failed it is avoided until it answers, and a call with no engine left is given up as an
``error`` result."""

from __future__ import annotations

import asyncio
import threading

from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.remote.client import HttpEngine
from rlvr.engine.remote.failures import FailurePolicy
from rlvr.engine.remote.supervisor import EngineDown, EngineSupervisor
from tests.support import free_port, wait_until
from tests.test_supervisor import FakeEngines, settings


def _request(rid: str = "x") -> GenerateRequest:
    return GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=2), rid=rid)


def test_the_policy_retries_elsewhere_avoids_the_failed_engine_and_runs_out_of_choices():
    p = FailurePolicy(attempts=2, avoid_for=10.0)
    assert p.choices(["a", "b"], tried=set(), now=0.0) == ["a", "b"]
    p.failed("a", now=0.0)
    assert p.choices(["a", "b"], tried={"a"}, now=1.0) == ["b"]  # elsewhere
    assert p.choices(["a", "b"], tried=set(), now=1.0) == ["b"]  # another call avoids a too
    assert p.choices(["a"], tried={"a"}, now=1.0) == []  # tried and avoided: nothing left
    assert p.choices(["a"], tried={"a"}, now=10.5) == ["a"]  # avoidance over
    p.answered("a")
    assert not p.avoided("a", now=1.0)


class FlakyFirstEngine(FakeEngines):
    """Engine 0 fails its first call with a transport error that does not prove it dead (an
    HTTP 503, say); every other call is answered with the answering engine's index."""

    def __init__(self):
        super().__init__()
        self.failed_once = threading.Event()

    async def send(self, engine, requests):
        if engine.index == 0 and not self.failed_once.is_set():
            self.failed_once.set()
            raise EngineDown("HTTP 503")
        return await super().send(engine, requests)


def test_the_supervisor_retries_a_failed_call_on_another_engine():
    sup = EngineSupervisor(FlakyFirstEngine(), settings(2))
    try:
        (result,) = asyncio.run(sup.generate([_request()]))  # both idle: engine 0 is picked first
        assert sup.transport.failed_once.is_set()
        assert result.finish_reason == "length" and result.token_ids == [1]  # retried elsewhere, not on 0
        assert sup.policy.avoided((0, sup.slots[0].incarnation)) or sup.slots[0].up
        # engine 0 answers its next probe and takes calls again (no restart: it was never down)
        wait_until(lambda: not sup.policy.avoided((0, sup.slots[0].incarnation)), "engine 0 answered its probe")
        assert sup.events == [] and sup.slots[0].up
    finally:
        sup.close()


def test_the_supervisor_waits_for_an_avoided_engine_rather_than_giving_up():
    """One engine, one failed call: the call waits until the engine answers its probe, then is answered."""
    sup = EngineSupervisor(FlakyFirstEngine(), settings(1))
    try:
        (result,) = asyncio.run(sup.generate([_request()]))
        assert result.finish_reason == "length" and result.token_ids == [0]
        assert sup.stats()["rollout/engine_reissued_requests"] == 1.0 and sup.events == []
    finally:
        sup.close()


def test_the_http_client_tries_each_address_once_then_gives_up_with_their_errors():
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    engine = HttpEngine(dead, timeout=5, retries=5, cooldown=60)
    (result,) = asyncio.run(engine.generate([_request()]))
    assert result.finish_reason == "error" and engine.failures == 2  # each address once: no address left
    assert all(f"http://{a}" in result.meta["error"] for a in dead)
    assert all(engine.policy.avoided(u) for u in engine.urls)
    (again,) = asyncio.run(engine.generate([_request("y")]))  # both avoided: tried once more each, in turn
    assert again.finish_reason == "error" and engine.failures == 4
