"""A verifiers taskset trained through ``rlvr train --environment verifiers:ID`` (the real verifiers
package, its chat program, MCP tool server and rubric; the model behind rlvr's recording endpoint).

Runs where verifiers is installed (``make envs`` builds .venv-envs; ``make test`` runs this file
there); skipped in a venv without it."""

from __future__ import annotations

import asyncio
import dataclasses
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
    # (test_a_tool_call_runs_verifiers_tool_and_its_result_is_masked drives a tool call)
    assert all("multiply tool" in s.prompt and s.metadata["tool_errors"] == 0 for s in samples)


@pytest.mark.parametrize("right, rm_type, reward", [
    (True, "math", 1.0), (False, "math", 0.0),  # the default: verifiers' score is the reward (math is not called)
    (True, "environment=0.9,format=0.1", {"score": 0.9, "environment": 1.0, "format": 0.0}),  # one part of rlvr's
])
def test_a_tool_call_runs_verifiers_tool_and_its_result_is_masked(tiny_qwen2, tmp_path, monkeypatch, right, rm_type,
                                                                  reward):
    """The multi-turn tool path, against a scripted engine (the tiny random model writes no tool
    call): the model's first turn is a Hermes tool call, which rlvr's endpoint hands to verifiers'
    chat program as ``tool_calls``; verifiers runs its MCP ``multiply`` tool and sends the result
    back; the model's second turn answers. The sample is model turn, masked tool result, model
    turn, with the engine's exact tokens, and its reward is verifiers' own score (1 for the right
    product, 0 for a wrong one), or with ``--rm-type environment=...`` a part of rlvr's composite."""
    from rlvr.config import Config
    from rlvr.data.dataset import PromptRecord
    from rlvr.environments.verifiers import runner
    from rlvr.runtime.build import load_tokenizer, make_rollout
    from tests.support import ScriptedEngine

    shutil.copy(EXAMPLES / "vf_calc.py", tmp_path)
    monkeypatch.chdir(tmp_path)  # verifiers imports the taskset, and its tool server, from here
    monkeypatch.syspath_prepend(str(tmp_path))
    task = runner("vf_calc").task(0)
    a, b = (int(x) for x in task.data.prompt.split("compute ")[1].split(",")[0].split(" * "))
    call = f'<tool_call>{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    answer = f"The result is {a * b if right else a * b + 1}."
    tok = load_tokenizer(str(tiny_qwen2))
    engine = ScriptedEngine(tok, [call, answer])
    cfg = Config()
    cfg.data.apply_chat_template = True
    cfg.agent.environment = "verifiers:vf_calc"
    cfg.reward = dataclasses.replace(cfg.reward, rm_type=rm_type)
    cfg.rollout.n_samples_per_prompt, cfg.rollout.rollout_max_response_len = 2, 512
    record = PromptRecord(prompt=task.data.prompt, label=None, metadata={"verifiers_task": 0, "source_name": "vf_calc"},
                          index=0)
    rollout = make_rollout(cfg, engine, tok, [record])
    group = rollout.next_groups(1)[0]
    asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))
    call_ids = tok(call, add_special_tokens=False)["input_ids"]
    answer_ids = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    for s in group:
        assert s.status.value == "completed", s.metadata.get("agent_error")
        s.check()
        segs = s.segments()
        assert [t for _, _, t in segs] == [True, False, True]
        (m1, e1, _), (t0, t1, _), (m2, e2, _) = segs
        # the model turns are the engine's tokens and log-probs, exactly
        assert s.response_ids[m1:e1] == call_ids and s.response_ids[m2:e2] == answer_ids
        assert s.rollout_log_probs[m1:e1] == [-0.5] * len(call_ids)
        assert s.rollout_log_probs[m2:e2] == [-0.5] * len(answer_ids)
        # the tool's result, computed by verifiers' MCP server, is an environment segment: masked
        tool_text = tok.decode(s.response_ids[t0:t1])
        assert f"<|im_start|>tool\n{a * b}<|im_end|>" in tool_text
        assert s.loss_mask[t0:t1] == [0] * (t1 - t0) and s.loss_mask[m1:e1] == [1] * (e1 - m1)
        assert s.loss_mask[m2:e2] == [1] * (e2 - m2)
        assert s.metadata["openai_calls"] == 2
        assert (s.metadata["tool_calls"], s.metadata["tool_errors"], s.metadata["tool_counts"]) == (1, 0, {"multiply": 1})
        # verifiers' rubric scored the answer: its reward is the sample's
        assert s.metadata["verifiers_rewards"] == {"correct": float(right)} and s.reward == reward
        assert s.metadata["environment_reward"] == float(right) and "reward_error" not in s.metadata
        # the second call continued from the first call's exact ids plus the tool result's
        assert s.prompt_ids + s.response_ids[:m2] in engine.prompts
