"""A run with poisoned rollouts (NaN injected into the loss through ``rlvr.core.testing``'s trainer seam) through
the real loop."""

import json

import pytest
import torch

import rlvr.runtime.loop as loop
from rlvr.runtime.configure import parse_config
from rlvr.core.errors import ConfigError, TrainingStopped
from rlvr.core.testing import override_trainer


def _cfg(ckpt, arith_files, out, *extra):
    train, _ = arith_files
    return parse_config(["--hf-checkpoint", str(ckpt), "--prompt-data", str(train), "--rollout-batch-size", "2",
                         "--n-samples-per-prompt", "4", "--rollout-max-response-len", "4", "--lr", "1e-2",
                         "--output-dir", str(out), *extra])


def _poison(rollouts):
    # Every sample runs its forward: the tiny model's rollouts often score 0 throughout (no
    # advantage anywhere), and a rollout with no micro-batch has no loss to poison.
    return override_trainer(loss_hook=lambda rid, loss: loss * float("nan") if rid in rollouts else loss,
                            skip_silent_samples=False)


def _keep_trainer(monkeypatch, seen):
    real_build = loop.build

    def build(cfg):
        c = real_build(cfg)
        seen["trainer"] = c.trainer
        return c

    monkeypatch.setattr(loop, "build", build)


@pytest.mark.slow
def test_a_poisoned_rollout_is_skipped_and_the_run_continues(tiny_qwen2, arith_files, tmp_path, monkeypatch):
    seen = {}
    _keep_trainer(monkeypatch, seen)
    with _poison({1}):
        run_dir = loop.run(_cfg(tiny_qwen2, arith_files, tmp_path / "run", "--num-rollout", "3"), console=False)
    train = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if "train/step" in x]
    assert [r["train/skipped_steps"] for r in train] == [0, 1, 0]
    assert train[1]["train/loss"] is None  # NaN is logged as null
    assert (run_dir / "skipped_rollouts" / "rollout_000001.pt").is_file()
    assert all(torch.isfinite(p).all() for p in seen["trainer"].model.parameters())


@pytest.mark.slow
def test_k_poisoned_rollouts_in_a_row_stop_the_run(tiny_qwen2, arith_files, tmp_path):
    cfg = _cfg(tiny_qwen2, arith_files, tmp_path / "run", "--num-rollout", "5", "--max-consecutive-skipped-steps", "2")
    with _poison({1, 2, 3}), pytest.raises(TrainingStopped,
                                           match=r"began at rollout 1 .*skipped_rollouts/rollout_000001\.pt"):
        loop.run(cfg, console=False)
    train = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if "train/step" in x]
    assert len(train) == 3  # rollouts 0, 1, 2 logged; stopped before rollout 3


def test_ref_flags_without_kl_and_a_prompt_over_the_cap_fail_at_config_time(tiny_qwen2, arith_files, tmp_path):
    with pytest.raises(ConfigError, match="--ref-update-interval: does nothing without a KL term"):
        _cfg(tiny_qwen2, arith_files, tmp_path, "--ref-update-interval", "2")
    cfg = _cfg(tiny_qwen2, arith_files, tmp_path, "--use-dynamic-batch-size", "--max-tokens-per-gpu", "8")
    with pytest.raises(ConfigError, match=r"--max-tokens-per-gpu: 8 cannot hold the longest prompt .* raise it to at least"):
        loop.build(cfg)
