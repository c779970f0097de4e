"""The OpenAI agent path with ``--rollout-engine vllm``: an agent on the official ``openai`` client
(two turns, the second streamed) trains two rollouts through the CLI unchanged, on the tiny Qwen2,
with vLLM's log-probs matching the trainer's on the model's tokens.

``make test`` runs this file in .venv-vllm (``make vllm``); elsewhere it skips where vLLM is not
installed. Cost: one process, vLLM start-up plus two short rollouts (~40 s).
"""

from __future__ import annotations


import pytest

from rlvr.core.testing import RUN_SILENT_ENV

pytest.importorskip("vllm", reason="vLLM is not installed in this environment; `make vllm` builds .venv-vllm and "
                                   "`make test` runs tests/test_vllm*.py there")
pytest.importorskip("openai")
pytestmark = pytest.mark.slow


def test_openai_agent_trains_on_vllm(tiny_qwen2, arith_files, tmp_path, monkeypatch):
    from tests.support import train_openai_agent

    # the tiny model's rollouts may have no reward variance at all: run every sample's forward, whose numbers this checks
    monkeypatch.setenv(RUN_SILENT_ENV, "1")

    train_rows, samples = train_openai_agent(tiny_qwen2, arith_files[0], tmp_path / "run", "--rollout-engine", "vllm",
                                             "--vllm-kv-cache-gb", "0.25")
    assert all(r["train/train_rollout_logprob_abs_diff"] < 1e-4 for r in train_rows), train_rows
    for s in samples:
        assert s.metadata["streamed"]  # the streamed second turn came back (one increment: no token stream)
