"""An OpenEnv environment server as the source of observations and rewards
(``rlvr train --environment openenv:...``): a real OpenEnv server (uvicorn on 127.0.0.1), started by
rlvr from the environment class below or already running at a URL.

Runs where openenv-core is installed (``make envs``; ``make test`` runs this file there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv.core")

from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from rlvr.core.testing import RUN_SILENT_ENV  # noqa: E402
from rlvr.core.types import RolloutBatch  # noqa: E402
from rlvr.environments.openenv import episode_seed  # noqa: E402
from tests.support import free_port, wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    text: str = ""


class GuessEnv(Environment):
    """Two steps: a reward of 0.25 per reply, done after the second. With ``KILL_FILE`` set, the
    server dies in the middle of the first episode that finds the file (once: the file is removed)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        self._state = State(episode_id="e", step_count=0)

    def reset(self, seed=None, episode_id=None, **kw) -> GuessObservation:
        self._state = State(episode_id="e", step_count=0)
        return GuessObservation(text=f"Say a number. [{episode_id} {seed}]", done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s=None, **kw) -> GuessObservation:
        self._state.step_count += 1
        kill = os.environ.get("KILL_FILE")
        if kill and os.path.exists(kill):
            os.remove(kill)
            os._exit(1)  # the server process dies mid-episode
        return GuessObservation(text=f"Step {self._state.step_count} done. Again.", done=self._state.step_count >= 2,
                                reward=0.25)

    @property
    def state(self) -> State:
        return self._state


def run(tmp_path: Path, ckpt: Path, arith_files, environment: str, env_extra: dict | None = None, *extra: str) -> Path:
    out = tmp_path / "run"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", RUN_SILENT_ENV: "1",
           **(env_extra or {})}
    r = subprocess.run([sys.executable, "-m", "rlvr", "train", "--hf-checkpoint", str(ckpt),
                        "--prompt-data", str(arith_files[0]), "--apply-chat-template", "--environment", environment,
                        "--max-turns", "3", "--environment-timeout", "20",
                        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "48",
                        "--num-rollout", "2", "--lr", "1e-3", "--output-dir", str(out),
                        "--save-debug-rollout-data", str(out / "dump" / "r{rollout_id}.pt"), *extra],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-5000:]
    return out


def samples_of(out: Path) -> list:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/step"] for r in rows if "train/step" in r] == [1, 2]
    samples = [s for r in range(2) for s in RolloutBatch.load(out / "dump" / f"r{r}.pt").samples]
    assert len(samples) == 8 and len({s.uid for s in samples}) == 8  # nothing duplicated
    seeds = {s.uid: episode_seed(1234, s) for s in samples}
    assert len(set(seeds.values())) == 4  # one seed per prompt's group of 2
    return samples


def check_episode(s) -> None:
    """The server's rewards are the sample's; its observations are masked segments between model turns;
    ``reset`` got the sample's uid as the episode id and its group's seed (the run's --seed is 1234)."""
    assert s.reward == sum(s.metadata["env_rewards"]) and all(r == 0.25 for r in s.metadata["env_rewards"])
    assert f"Say a number. [{s.uid} {episode_seed(1234, s)}]" in s.prompt  # reset's observation opens the conversation
    for start, end, trainable in s.segments():
        if not trainable:
            assert s.loss_mask[start:end] == [0] * (end - start) and "Again." in s.response


@pytest.mark.slow
def test_openenv_server_started_by_rlvr_trains(tiny_qwen2, arith_files, tmp_path):
    out = run(tmp_path, tiny_qwen2, arith_files, "openenv:tests.test_environments_openenv:GuessEnv")
    for s in samples_of(out):
        assert s.status.value != "failed", s.metadata.get("agent_error")
        check_episode(s)


@pytest.mark.slow
def test_a_server_killed_mid_episode_fails_one_sample_and_the_run_goes_on(tiny_qwen2, arith_files, tmp_path):
    kill = tmp_path / "kill"
    kill.write_text("")
    out = run(tmp_path, tiny_qwen2, arith_files, "openenv:tests.test_environments_openenv:GuessEnv",
              {"KILL_FILE": str(kill)}, "--agent-failure-limit", "1")  # all 4 episodes of a rollout share the server
    samples = samples_of(out)
    failed = [s for s in samples if s.status.value == "failed"]
    assert failed and all("agent_error" in s.metadata and not s.response_ids for s in failed)
    assert len(failed) <= 4  # the episodes in flight when it died; the server was started again after
    for s in samples:
        if s.status.value != "failed":
            check_episode(s)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("rollout/agent_errors", 0) for r in rows if "rollout/step" in r) == len(failed)


@pytest.mark.slow
def test_openenv_server_already_running_at_a_url(tiny_qwen2, arith_files, tmp_path):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "rlvr.environments.openenv_server",
                               "tests.test_environments_openenv:GuessEnv", str(port)],
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        import urllib.request

        def up() -> bool:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200
            except OSError:
                return False

        wait_until(up, "the OpenEnv server answers /health")
        out = run(tmp_path, tiny_qwen2, arith_files, f"openenv:http://127.0.0.1:{port}")
        for s in samples_of(out):
            check_episode(s)
    finally:
        server.terminate()
        server.wait(10)
