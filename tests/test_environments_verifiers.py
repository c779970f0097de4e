"""A verifiers taskset trained through ``rlvr train --environment verifiers:ID`` (the real verifiers
package, its chat program, MCP tool server and rubric; the model behind rlvr's recording endpoint).

Runs where verifiers is installed (``make envs`` builds .venv-envs; ``make test`` runs this file
there); skipped in a venv without it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

from rlvr.core.testing import RUN_SILENT_ENV  # noqa: E402
from rlvr.core.types import RolloutBatch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "environments"


def rlvr(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # RUN_SILENT_ENV: the tiny model's groups may have no reward variance; train on them anyway, so the
    # trainer's log-probs of the recorded tokens are measured against the engine's
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(cwd), RUN_SILENT_ENV: "1"}
    return subprocess.run([sys.executable, "-m", "rlvr", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def train(tmp_path: Path, ckpt: Path, taskset: str, *extra: str) -> Path:
    shutil.copy(EXAMPLES / f"{taskset}.py", tmp_path)
    r = subprocess.run([sys.executable, "-m", "rlvr.environments.verifiers", taskset, "prompts.jsonl", "--limit", "8"],
                       cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "run"
    r = rlvr(tmp_path, "train", "--hf-checkpoint", str(ckpt), "--prompt-data", "prompts.jsonl", "--apply-chat-template",
             "--environment", f"verifiers:{taskset}", "--rollout-batch-size", "1", "--n-samples-per-prompt", "2",
             "--rollout-max-response-len", "24", "--num-rollout", "2", "--lr", "1e-3", "--output-dir", str(out),
             "--save-debug-rollout-data", str(out / "dump" / "r{rollout_id}.pt"), *extra)
    assert r.returncode == 0, r.stderr[-5000:]
    return out


def check_samples(out: Path, taskset: str) -> list:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/step"] for r in rows if "train/step" in r] == [1, 2]
    # on-policy, one step per rollout: the trainer's log-probs of the recorded tokens are the engine's
    assert [r for r in rows if "train/step" in r][0]["train/train_rollout_logprob_abs_diff"] < 1e-5
    samples = [s for r in range(2) for s in RolloutBatch.load(out / "dump" / f"r{r}.pt").samples]
    assert len(samples) == 4 and len({s.uid for s in samples}) == 4  # nothing duplicated
    for s in samples:
        assert s.status.value != "failed", s.metadata.get("agent_error")
        assert s.metadata["openai_calls"] >= 1 and s.metadata["source_name"] == taskset
        # the reward is the episode's: verifiers' rubric, one reward function here
        assert s.reward == sum(s.metadata["verifiers_rewards"].values())
        for start, end, trainable in s.segments():
            if not trainable:  # environment text: masked, placeholder log-probs
                assert s.loss_mask[start:end] == [0] * (end - start)
    return samples


@pytest.mark.slow
def test_single_turn_taskset_with_a_rubric_trains(tiny_qwen2, tmp_path):
    out = train(tmp_path, tiny_qwen2, "vf_arith")
    samples = check_samples(out, "vf_arith")
    assert all(s.segments()[0][2] and len(s.segments()) == 1 for s in samples)  # one model turn each
    assert all("What is" in s.prompt for s in samples)  # the taskset's prompt, as verifiers sent it


@pytest.mark.slow
def test_multi_turn_taskset_with_a_tool_trains(tiny_qwen2, tmp_path):
    out = train(tmp_path, tiny_qwen2, "vf_calc")
    samples = check_samples(out, "vf_calc")
    # verifiers served the tool (MCP, a subprocess importing vf_calc) and every episode finished;
    # the tiny model's chat template renders no tool schemas, so it never calls the tool here
    assert all("multiply tool" in s.prompt and s.metadata["tool_errors"] == 0 for s in samples)
