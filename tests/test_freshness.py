"""The policy-freshness guard (rlvr.runtime.freshness) on the embedded engine: a push broken on
purpose stops the run naming the engine and its route, or with ``warn`` is counted; a healthy run
logs a gap of float noise. The embedded engine holds a copy of the weights here
(``--update-weights-interval 2``: rollouts 1 and 3 are sampled one push behind), so a push that does
not copy them leaves it on the old policy. vLLM's engines: tests/test_vllm_freshness.py."""

import json

import pytest
import torch

from rlvr.engine.local.embedded import EmbeddedEngine
from rlvr.runtime.configure import parse_config
from rlvr.runtime.freshness import PolicyStale
from rlvr.runtime.loop import build, run

pytestmark = pytest.mark.slow


def _args(ckpt, train, out, *extra) -> list[str]:
    return ["--hf-checkpoint", str(ckpt), "--prompt-data", str(train), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6", "--num-rollout", "4",
            "--lr", "1e-3", "--use-kl-loss", "--kl-loss-coef", "0.01", "--entropy-coef", "0.01",
            "--update-weights-interval", "2", "--output-dir", str(out), *extra]


def _rollouts(run_dir) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "rollout/step" in r]


def skip_tensors(self, named_tensors, version):
    """A push that takes the version and drops the tensors."""
    self._version = version


def keep_version(push):
    """A push that copies the tensors but leaves the engine's version where it was."""
    def stuck(self, named_tensors, version):
        before = self._version
        push(self, named_tensors, version)
        self._version = before
    return stuck


# One token: the trainer scores next-token distributions while the engine samples; three: after it.
@pytest.mark.parametrize("tokens", ["1", "3"])
def test_a_healthy_run_shows_only_float_noise(tiny_qwen2, arith_files, tmp_path, tokens):
    run_dir = run(parse_config(_args(tiny_qwen2, arith_files[0], tmp_path / "run", "--policy-freshness-probe-tokens",
                                     tokens)), console=False)
    probed = [r for r in _rollouts(run_dir) if "rollout/policy_freshness_gap" in r]
    assert [r["rollout/step"] for r in probed] == [1, 3]  # the pushes (every 2 rollouts)
    for r in probed:
        assert r["rollout/policy_freshness_gap"] < 1e-4 and r["rollout/policy_version_lag"] == 0.0
        assert r["rollout/policy_freshness_failures"] == 0.0 and r["perf/policy_freshness_time"] > 0


@pytest.mark.parametrize("tokens", ["1", "3"])
def test_a_push_that_skips_the_tensors_stops_the_run(tiny_qwen2, arith_files, tmp_path, monkeypatch, tokens):
    monkeypatch.setattr(EmbeddedEngine, "update_weights", skip_tensors)
    with pytest.raises(PolicyStale) as e:
        run(parse_config(_args(tiny_qwen2, arith_files[0], tmp_path / "run", "--policy-freshness-probe-tokens", tokens)),
            console=False)
    message = str(e.value)
    assert message.startswith("weight push 2 to the embedded engine (rlvr's engine in this process")
    assert "weights by memory" in message and "the push changed nothing" in message
    assert [r["rollout/step"] for r in _rollouts(tmp_path / "run")] == [0]  # stopped at the push after rollout 1


def test_a_version_that_did_not_advance_stops_the_run(tiny_qwen2, arith_files, tmp_path, monkeypatch):
    monkeypatch.setattr(EmbeddedEngine, "update_weights", keep_version(EmbeddedEngine.update_weights))
    with pytest.raises(PolicyStale, match=r"weight push 2 to the embedded engine .*answered the probe at weight "
                                          r"version\(s\) \[0\], not 2"):
        run(parse_config(_args(tiny_qwen2, arith_files[0], tmp_path / "run")), console=False)


def test_warn_logs_and_counts_every_failed_push(tiny_qwen2, arith_files, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(EmbeddedEngine, "update_weights", skip_tensors)
    run_dir = run(parse_config(_args(tiny_qwen2, arith_files[0], tmp_path / "run", "--policy-freshness-check", "warn")),
                  console=False)
    probed = [r for r in _rollouts(run_dir) if "rollout/policy_freshness_failures" in r]
    assert [r["rollout/policy_freshness_failures"] for r in probed] == [1.0, 2.0]
    assert sum("the push changed nothing" in m for m in caplog.messages) == 2


def test_off_runs_no_probe(tiny_qwen2, arith_files, tmp_path, monkeypatch):
    monkeypatch.setattr(EmbeddedEngine, "update_weights", skip_tensors)
    run_dir = run(parse_config(_args(tiny_qwen2, arith_files[0], tmp_path / "run", "--policy-freshness-check", "off")),
                  console=False)
    assert not any(k.startswith(("rollout/policy_", "perf/policy_")) for r in _rollouts(run_dir) for k in r)


def test_the_trainers_two_probe_sides_agree(tiny_qwen2, arith_files, tmp_path):
    """The next-token distribution (one-token probe, scored before the engine answers) gives each
    token the log-prob that scoring that token after the prompt gives (the probe of more tokens)."""
    cfg = parse_config(_args(tiny_qwen2, arith_files[0], tmp_path / "run", "--rollout-temperature", "0.7"))
    with build(cfg) as c:
        prompts = [[5, 6, 7], [9], [11, 12]]
        dist = c.trainer.probe_next_log_probs(prompts)
        assert dist.shape == (3, c.trainer.policy.model.config.vocab_size)
        assert torch.allclose(dist.exp().sum(-1), torch.ones(3), atol=1e-4)  # distributions, at T 0.7
        tokens = [3, 40, int(dist[2].argmax())]
        scored = c.trainer.probe_log_probs([(p, [t], None) for p, t in zip(prompts, tokens)])
        for i, t in enumerate(tokens):
            assert abs(scored[i][0] - float(dist[i, t])) < 1e-5
