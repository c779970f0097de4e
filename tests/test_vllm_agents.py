"""The OpenAI agent path with ``--rollout-engine vllm``: an agent on the official ``openai`` client
(two turns, the second streamed) trains two rollouts through the CLI unchanged, on the tiny Qwen2,
with vLLM's log-probs matching the trainer's on the model's tokens.

``make test`` runs this file in .venv-vllm (``make vllm``); elsewhere it skips where vLLM is not
installed. Cost: one process, vLLM start-up plus two short rollouts (~40 s).
"""

from __future__ import annotations

import json

import pytest

from rlvr.core.testing import RUN_SILENT_ENV
from rlvr.core.types import RolloutBatch

pytest.importorskip("vllm", reason="vLLM is not installed in this environment; `make vllm` builds .venv-vllm and "
                                   "`make test` runs tests/test_vllm*.py there")
pytest.importorskip("openai")
pytestmark = pytest.mark.slow


def test_openai_agent_trains_on_vllm(tiny_qwen2, arith_files, tmp_path, monkeypatch):
    from tests.support import cli

    # the tiny model's rollouts may have no reward variance at all: run every sample's forward, whose numbers this checks
    monkeypatch.setenv(RUN_SILENT_ENV, "1")

    train, _ = arith_files
    out = tmp_path / "run"
    r = cli("train", "--rollout-engine", "vllm", "--vllm-kv-cache-gb", "0.25", "--hf-checkpoint", str(tiny_qwen2),
            "--prompt-data", str(train), "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
            "--rollout-max-response-len", "96", "--num-rollout", "2", "--lr", "1e-3", "--output-dir", str(out),
            "--custom-generate-function-path", "tests.test_agents_openai:openai_agent",
            "--save-debug-rollout-data", str(out / "dump" / "r{rollout_id}.pt"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/step" in r]
    assert [r["train/step"] for r in train_rows] == [1, 2]
    assert all(r["train/train_rollout_logprob_abs_diff"] < 1e-4 for r in train_rows), train_rows
    for k in range(2):
        for s in RolloutBatch.load(out / "dump" / f"r{k}.pt").samples:
            assert [t for _, _, t in s.segments()] == [True, False, True] and s.metadata["openai_calls"] == 2
            assert s.metadata["streamed"]  # the streamed second turn came back (one increment: no token stream)
