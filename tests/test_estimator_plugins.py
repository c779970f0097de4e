"""Estimators are records with traits (rlvr.algo.register_estimator): the traits, not name checks,
decide validation and the trainer; a user's estimator registered from outside the package trains
through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlvr.algo import ADVANTAGES, AlgoConfig, estimator_of, policy_loss_name, register_estimator
from rlvr.algo.advantages import estimator_name
from rlvr.entrypoints.cli import main
from rlvr.runtime.configure import check_algo, parse_config
from rlvr.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

# Written down by hand from the papers, not read from the registry: these compare the samples
# of one prompt (group mean / leave-one-out baselines), so one sample per prompt gives them nothing.
GROUP_RELATIVE = {"grpo", "gspo", "cispo", "rloo", "reinforce_plus_plus_baseline", "dcpo"}


def _args(ckpt, train, out, *extra) -> list[str]:
    return ["--hf-checkpoint", str(ckpt), "--prompt-data", str(train), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4", "--num-rollout", "2",
            "--lr", "1e-3", "--output-dir", str(out), *extra]


def test_traits_of_the_builtins():
    assert {n for n in ADVANTAGES if ADVANTAGES[n].group_relative} == GROUP_RELATIVE
    assert [n for n in ADVANTAGES if ADVANTAGES[n].needs_critic] == ["ppo"]
    assert [n for n in ADVANTAGES if ADVANTAGES[n].side_inputs] == ["dcpo"]
    assert {n: policy_loss_name(AlgoConfig(advantage_estimator=n)) for n in ("grpo", "gspo", "cispo", "dcpo")} == {
        "grpo": "ppo", "gspo": "gspo", "cispo": "cispo", "dcpo": "ppo"}


@pytest.mark.parametrize("name", sorted(GROUP_RELATIVE))
def test_group_relative_estimators_refuse_one_sample_per_prompt(name, tiny_qwen2, arith_files, tmp_path):
    with pytest.raises(ConfigError) as e:
        parse_config(_args(tiny_qwen2, arith_files[0], tmp_path, "--advantage-estimator", name,
                           "--n-samples-per-prompt", "1"))
    assert e.value.flag == "--n-samples-per-prompt" and name in str(e.value)


def test_unknown_estimator_lists_the_registered_ones(tiny_qwen2, arith_files, tmp_path):
    with pytest.raises(ConfigError, match="--advantage-estimator: unknown value 'grpo2'; valid: cispo, dcpo, grpo"):
        parse_config(_args(tiny_qwen2, arith_files[0], tmp_path, "--advantage-estimator", "grpo2"))


@pytest.mark.slow
def test_estimator_registered_in_a_test_file_trains_through_the_cli(tiny_qwen2, arith_files, tmp_path):
    """``rlvr train --advantage-estimator <name>`` accepts a name registered after import, and the
    trainer calls that function with the rollout's rewards."""
    calls = []

    def centered_reward(inp, cfg):  # reward minus 0.5 on every response token
        calls.append(inp.rewards.clone())
        adv = (inp.rewards.float()[:, None] - 0.5) * inp.loss_mask
        return adv, adv.clone()

    register_estimator("test_centered_reward")(centered_reward)
    try:
        assert main(["train", *_args(tiny_qwen2, arith_files[0], tmp_path, "--advantage-estimator",
                                     "test_centered_reward", "--n-samples-per-prompt", "1")]) == 0
    finally:
        ADVANTAGES.unregister("test_centered_reward")
    assert len(calls) == 2 and all(c.shape == (2,) for c in calls)  # one call per rollout, 2 samples each
    train = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"train/step"' in x]
    assert [r["train/step"] for r in train] == [1, 2]


PLUGIN = '''
from rlvr.algo import register_estimator

@register_estimator("plugin_group_centered", group_relative=True)
def group_centered(inp, cfg):
    groups = inp.rewards.float().view(-1, inp.n_samples_per_prompt)
    adv = (groups - groups.mean(1, keepdim=True)).reshape(-1)[:, None] * inp.loss_mask
    return adv, adv.clone()
'''


@pytest.mark.slow
def test_custom_advantage_function_path_in_a_fresh_process(tiny_qwen2, arith_files, tmp_path):
    """``--custom-advantage-function-path`` imports the user's module in the process that trains
    (so Ray actors and subprocesses get it too); the traits it registered are honoured."""
    (tmp_path / "my_estimators.py").write_text(textwrap.dedent(PLUGIN))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    cmd = [sys.executable, "-m", "rlvr", "train",
           *_args(tiny_qwen2, arith_files[0], tmp_path / "run", "--custom-advantage-function-path",
                  "my_estimators:group_centered")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "custom_advantage_function_path: my_estimators:group_centered" in saved  # the config is not rewritten
    refused = subprocess.run(cmd + ["--n-samples-per-prompt", "1"], env=env, capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode == 2 and "--n-samples-per-prompt: 1: plugin_group_centered compares" in refused.stderr


def test_a_plain_function_gets_the_default_traits(tmp_path, monkeypatch):
    (tmp_path / "plain_est.py").write_text("def signed(inp, cfg):\n    a = inp.rewards[:, None] * inp.loss_mask\n"
                                          "    return a, a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = AlgoConfig(custom_advantage_function_path="plain_est:signed")
    try:
        est = estimator_of(cfg)
        assert estimator_name(cfg) == "plain_est:signed" and cfg.advantage_estimator == "grpo"  # not rewritten
        assert (est.group_relative, est.needs_critic, est.policy_loss) == (False, False, "ppo")
        assert cfg.validate() is cfg
        check_algo(cfg)
        from rlvr.algo import AdvantageInputs

        adv, _ = est(AdvantageInputs(torch.tensor([1.0, 0.0]), torch.ones(2, 3), 1), cfg)
        assert adv.tolist() == [[1.0] * 3, [0.0] * 3]
    finally:
        ADVANTAGES.unregister("plain_est:signed")
