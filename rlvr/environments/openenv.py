"""An OpenEnv environment server as the source of observations and rewards (``--environment openenv:...``).

Two forms: ``openenv:http://127.0.0.1:PORT`` (a server already running on this machine) or
``openenv:module:Class`` (an OpenEnv ``Environment`` subclass; rlvr starts its server with uvicorn on
127.0.0.1, ``rlvr.environments.openenv_server``, once per process, and starts it again if it died).
Each sample is one episode over its own WebSocket session (OpenEnv's ``/ws``, the stateful
protocol; its plain ``POST /reset`` and ``/step`` make a fresh environment per call), driven by
rlvr's multi-turn environment loop (``rlvr.agents.environment``, token-in/token-out):

- ``reset``: called with ``seed`` (a function of ``--seed`` and the prompt's draw: the samples of
  one prompt's group share it, so an environment that makes its task from the seed poses one task
  to the whole group, and a rerun poses the same tasks) and ``episode_id`` (the sample's uid);
  OpenEnv passes them on where the environment's ``reset`` takes them. The prompt's chat messages,
  then the initial observation as a user message, open the conversation;
- each model reply becomes the action: the action schema's one string field (``/schema``) holds
  the reply text;
- the observation (its one string field, else its fields as JSON) is the next user message, masked;
  its reward is the step's reward; the sample's reward is the sum, ``metadata["env_rewards"]``
  the steps'; ``done`` ends the episode (``--max-turns`` and the response budget also do).

A server that dies, refuses the connection or does not answer within ``--environment-timeout``
fails that sample only (logged with the error, ``rollout/agent_errors``, ``metadata["agent_error"]``),
like a failing tool; the run goes on, and a dead server rlvr started is started again for the next sample.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request
from functools import lru_cache

from rlvr.core.errors import ConfigError
from rlvr.core.net import free_port
from rlvr.engine.sampling import request_seed

PREFIX = "openenv:"
_RESERVED = {"done", "reward", "metadata"}
log = logging.getLogger(__name__)


def _client_class():
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as e:
        raise ConfigError("--environment", f"openenv:... needs the openenv-core package ({e}); install the envs "
                                           "extra: pip install -e '.[envs]' (make envs builds .venv-envs)") from None
    return GenericEnvClient


def _get_json(url: str, timeout: float):
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - a local server's URL
        return json.loads(r.read())


class Server:
    """An OpenEnv server rlvr runs for ``module:Class`` (a subprocess), started again when it died."""

    def __init__(self, spec: str, timeout: float):
        self.spec, self.timeout, self.starts = spec, timeout, 0
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        atexit.register(self.stop)

    def url(self) -> str:
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                if self.proc is not None:
                    log.warning("OpenEnv server %s exited (code %s); starting it again", self.spec, self.proc.returncode)
                self._start()
            return self._url

    def _start(self) -> None:
        port = free_port()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen([sys.executable, "-m", "rlvr.environments.openenv_server", self.spec, str(port)],
                                     env=env)
        self._url, self.starts = f"http://127.0.0.1:{port}", self.starts + 1
        deadline = time.monotonic() + max(self.timeout, 60.0)
        while time.monotonic() < deadline:  # until it answers /health, exits, or the deadline
            if self.proc.poll() is not None:
                raise ConfigError("--environment", f"openenv:{self.spec}: the server exited with code "
                                                   f"{self.proc.returncode} at start-up (its error is above)")
            try:
                _get_json(self._url + "/health", 1.0)
                return
            except OSError:
                try:
                    self.proc.wait(0.1)  # returns at once if the server exits
                except subprocess.TimeoutExpired:
                    pass
        raise ConfigError("--environment", f"openenv:{self.spec}: the server did not answer /health in time")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@lru_cache(maxsize=None)
def server(spec: str, timeout: float) -> Server:
    return Server(spec, timeout)


def server_url(spec: str, timeout: float) -> str:
    """The base URL for the spec's part after ``openenv:``."""
    if spec.startswith(("http://", "https://")):
        return spec.rstrip("/")
    return server(spec, timeout).url()


@lru_cache(maxsize=None)
def action_field(url: str, timeout: float) -> str:
    """The action schema's one string field, which the model's reply fills."""
    schema = _get_json(url + "/schema", timeout)["action"]
    fields = [k for k, v in schema.get("properties", {}).items() if k not in _RESERVED and v.get("type") == "string"]
    if len(fields) != 1:
        raise ConfigError("--environment", f"{url}: rlvr puts the model's reply in the action's one string field; "
                                           f"this action schema has {fields or 'none'}: give the action one str field")
    return fields[0]


def observation_text(observation: dict) -> str:
    """An observation as the text of a user message: its one string field, else its fields as JSON.

    >>> observation_text({"text": "hi", "done": False, "reward": None, "metadata": {}})
    'hi'
    >>> observation_text({"x": 1, "y": 2})
    '{"x": 1, "y": 2}'
    """
    fields = {k: v for k, v in observation.items() if k not in _RESERVED}
    strings = [v for v in fields.values() if isinstance(v, str)]
    return strings[0] if len(strings) == 1 and len(fields) == 1 else json.dumps(fields)


def episode_seed(run_seed: int, sample) -> int:
    """The ``seed`` given to ``reset``: the same for every sample of one prompt's group (the uid's
    part before ``/`` names the prompt's draw), below 2**31 so any RNG takes it.

    >>> from rlvr.core.types import Sample
    >>> a, b, c = (Sample(uid=u) for u in ("7/0", "7/3", "8/0"))
    >>> episode_seed(1, a) == episode_seed(1, b) != episode_seed(1, c)
    True
    """
    draw = sample.uid.rsplit("/", 1)[0] if sample.uid else f"index:{sample.group_index}"
    return request_seed(run_seed, "openenv", draw) % 2**31


class Episode:
    """rlvr's environment protocol (``reset`` / ``step``) over one OpenEnv WebSocket session."""

    def __init__(self, url: str, timeout: float, messages: list[dict], seed: int):
        self.url, self.messages, self.seed, self.timeout = url, messages, seed, timeout
        self.field = action_field(url, timeout)
        self.client = _client_class()(base_url=url, connect_timeout_s=timeout, message_timeout_s=timeout)

    async def reset(self, sample) -> list[dict]:
        result = await self.client.reset(seed=self.seed, episode_id=sample.uid or f"index:{sample.index}")
        text = observation_text(result.observation)
        return self.messages + ([{"role": "user", "content": text}] if text.strip() else [])

    async def step(self, response: str) -> tuple[str, float, bool]:
        result = await self.client.step({self.field: response})
        return observation_text(result.observation), float(result.reward or 0.0), bool(result.done)

    async def close(self) -> None:
        """End the session, then let the server close the socket before the client drops it: a
        client that closes first makes OpenEnv's server log a ``WebSocketDisconnect`` traceback
        for every episode (it only expects a ``RuntimeError`` there)."""
        import asyncio

        try:
            if self.client._ws is not None:  # GenericEnvClient's socket (websockets' ClientConnection)
                await self.client._send({"type": "close"})
                await asyncio.wait_for(self.client._ws.wait_closed(), self.timeout)
        finally:
            await self.client.close()


async def generate(args, sample, sampling_params: dict):
    """``--environment openenv:...``: one episode on the sample (module docstring)."""
    import asyncio

    from rlvr.agents.agent_context import context
    from rlvr.agents.environment import run_environment

    ctx = context()
    a = ctx.agent.config
    url = await asyncio.to_thread(server_url, a.environment[len(PREFIX):], a.environment_timeout)
    episode = await asyncio.to_thread(Episode, url, a.environment_timeout, ctx.messages(sample),
                                      episode_seed(ctx.rollout.seed, sample))
    try:
        return await run_environment(episode, sample, sampling_params)
    finally:
        try:
            await episode.close()
        except Exception:  # noqa: BLE001 - a dead server's socket; the episode's own error is what counts
            pass
