"""A 4-rollout GRPO run of ``rlvr train --rollout-engine vllm`` on SmolLM2 through the real CLI,
SIGKILLed after rollout 2's checkpoint and resumed with ``--load``: rewards and weights change,
after every weight update the engine's log-probs match the trainer's within the measured gap, and
ICE-POP runs on the engine's log-probs.

``make test`` runs this file in .venv-vllm (``make vllm``); elsewhere it skips where vLLM is not
installed. Cost: two processes, ~2 min on one thread.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed in this environment; `make vllm` builds .venv-vllm and "
                                   "`make test` runs tests/test_vllm*.py there")
SMOLLM2 = Path(__file__).resolve().parents[1] / "models" / "smollm2-135m-instruct"
pytestmark = [pytest.mark.real, pytest.mark.slow,
              pytest.mark.skipif(not (SMOLLM2 / "config.json").exists(), reason="needs SmolLM2 (make smollm2)")]

# Measured (docs/engine.md): vLLM fp32 vs the trainer's fp32 forward, mean |log p - log q| per token
# ~5e-6 on SmolLM2; a push that left vLLM's tied head stale gave 9.4e-4 here after one real step.
GAP = 1e-4


def rlvr(out: Path, data: dict, kill_at: str | None = None, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.pop("RLVR_TEST_SIGKILL_AT", None)
    if kill_at:
        env["RLVR_TEST_SIGKILL_AT"] = kill_at
    args = ["train", "--rollout-engine", "vllm", "--vllm-kv-cache-gb", "0.5", "--hf-checkpoint", str(SMOLLM2),
            "--prompt-data", str(data["train"]), "--apply-chat-template", "--rm-type", "math",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "16",
            "--num-rollout", "4", "--lr", "1e-5", "--rollout-temperature", "1.0", "--save-interval", "1",
            "--use-tis", "--tis-mode", "icepop", "--tis-clip-low", "0.5", "--tis-clip", "2.0",
            "--output-dir", str(out), "--save", str(out / "ckpt"), "--load", str(out / "ckpt"), *extra]
    return subprocess.run([sys.executable, "-m", "rlvr", *args], capture_output=True, text=True, env=env, timeout=900)


def sums(tmp_path: Path) -> dict:
    from rlvr.data.arith import write_jsonl

    # one-digit sums: SmolLM2-135M gets some right at temperature 1, so groups have reward variance
    rows = [{"prompt": f"What is {a} + {b}? Answer with the number only.", "label": str(a + b)}
            for a in range(2, 9) for b in range(1, 5)]
    return {"train": write_jsonl(rows, tmp_path / "train.jsonl")}


def test_grpo_with_vllm_killed_and_resumed(tmp_path):
    from safetensors.torch import load_file

    from rlvr.runtime.checkpoint import list_checkpoints, read_latest

    data = sums(tmp_path)
    out = tmp_path / "run"
    killed = rlvr(out, data, kill_at="rollout:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert read_latest(out / "ckpt") == 2
    resumed = rlvr(out, data)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rollouts = [r for r in records if "rollout/step" in r]
    train = [r for r in records if "train/step" in r]
    assert [r["rollout/step"] for r in rollouts] == [0, 1, 2, 3]  # none lost, none twice
    assert len(train) == 4
    # rewards: some right, some wrong, so the groups have advantages and the policy gets gradients
    rewards = [r["rollout/raw_reward"] for r in rollouts]
    assert 0 < sum(rewards) < len(rewards), rewards
    assert sum(r["train/grad_norm"] > 0 for r in train) >= 2, train
    # the engine's q against the trainer's p0 on the same tokens, every rollout (rollouts 1-3 were sampled
    # after a weight push; rollout 2 after the resumed process pushed the checkpoint's weights)
    # (a rollout whose groups all lack reward variance trains no sample and has no p0: the freshness
    # probe's gap below covers every rollout)
    for r in (r for r in train if r["train/grad_norm"] > 0):
        assert r["train/train_rollout_logprob_abs_diff"] < GAP, r
        assert 0 <= r["train/train_rollout_kl"] < GAP, r
        # ICE-POP on vLLM's q: the importance ratios p0/q sit at 1 within the gap, none is masked
        assert r["train/tis_abs"] < 10 * GAP and r["train/tis_clipfrac"] == 0, r
    assert all(r["rollout/engine_weight_reloads"] >= 1 for r in rollouts[1:]), rollouts
    # the policy-freshness probe after every push (rlvr.runtime.freshness): vLLM holds the trainer's policy
    assert all(r["rollout/policy_freshness_gap"] < GAP and r["rollout/policy_version_lag"] == 0 for r in rollouts)
    # the weights moved: the last checkpoint's policy differs from the starting checkpoint
    (_, last), start = list_checkpoints(out / "ckpt")[-1], load_file(str(SMOLLM2 / "model.safetensors"))
    trained = load_file(str(next(last.glob("*.safetensors"))))
    moved = [k for k in start if k in trained and not torch.equal(start[k], trained[k])]
    assert len(moved) > len(start) // 2, (len(moved), len(start))


def test_grpo_with_lora_through_vllms_lora_route(tmp_path, monkeypatch):
    """``--lora-rank``: the trainer sends its adapters only and vLLM serves them with its LoRA route
    (pushed at version 0 too, so both sides start from the same policy); after each push the engine's
    log-probs match the trainer's within the same gap as full weights, and the adapter learns."""
    from safetensors.torch import load_file

    from rlvr.runtime.checkpoint import list_checkpoints

    monkeypatch.setenv("RLVR_TEST_RUN_SILENT_SAMPLES", "1")  # every sample's forward: the gap on every rollout
    out = tmp_path / "run"
    run = rlvr(out, sums(tmp_path), extra=("--num-rollout", "2", "--lora-rank", "8", "--lr", "1e-4"))
    assert run.returncode == 0, run.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rollouts = [r for r in records if "rollout/step" in r]
    train = [r for r in records if "train/step" in r]
    assert [r["rollout/step"] for r in rollouts] == [0, 1] and len(train) == 2
    assert [r["rollout/engine_weight_reloads"] for r in rollouts] == [1, 2]  # version 0's adapter, then rollout 0's
    # (a rollout whose groups all lack reward variance trains no sample and has no p0: the freshness
    # probe's gap below covers every rollout)
    for r in (r for r in train if r["train/grad_norm"] > 0):
        assert r["train/train_rollout_logprob_abs_diff"] < GAP, r
        assert 0 <= r["train/train_rollout_kl"] < GAP, r
    assert any(r["train/grad_norm"] > 0 for r in train), train
    adapters = [load_file(str(d / "adapter_model.safetensors")) for _, d in list_checkpoints(out / "ckpt")]
    assert any(not torch.equal(t, adapters[-1][k]) for k, t in adapters[0].items())  # the adapter moved
