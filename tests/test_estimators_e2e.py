"""Every advantage estimator through the real CLI entry point with the demo's config (2 rollouts)."""

import json
from pathlib import Path

import pytest

from rlvr.entrypoints.cli import main
from rlvr.data.arith import make_splits, write_jsonl

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "arith" / "grpo.yaml")


SMALL_EVAL_ROWS = 16  # the small_eval fixture (conftest.py)


def _run(tiny_qwen2, arith_files, small_eval, out: Path, *extra: str) -> list[dict]:
    code = main(["train", "--config", EXAMPLE, "--hf-checkpoint", str(tiny_qwen2),
                 "--prompt-data", str(arith_files[0]), "--eval-prompt-data", "arith", str(small_eval),
                 "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
                 "--num-rollout", "2", "--output-dir", str(out), "--no-use-tensorboard", *extra])
    assert code == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


ESTIMATORS = ["grpo", "gspo", "cispo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_estimator_runs_two_rollouts(estimator, tiny_qwen2, arith_files, small_eval, tmp_path):
    extra = ["--advantage-estimator", estimator]
    if estimator.startswith("reinforce_plus_plus") or estimator == "ppo":
        extra += ["--no-use-kl-loss", "--kl-loss-coef", "0", "--kl-coef", "0.01"]  # PPO-style KL in reward
    records = _run(tiny_qwen2, arith_files, small_eval, tmp_path / estimator, *extra)
    train = [r for r in records if "train/step" in r]
    assert [r["train/step"] for r in train] == [1, 2]
    for r in train:
        assert all(v is not None for v in r.values()), r  # no NaN / inf anywhere
    if estimator == "ppo":
        assert "train/value_loss" in train[0] and "train/explained_variance" in train[0]
        assert (tmp_path / estimator / "checkpoints" / "rollout_000002" / "critic" / "value_head.pt").is_file()


@pytest.mark.slow
def test_dcpo_with_a_confidence_task(tiny_qwen2, tmp_path, small_eval):
    # Prompts ask for an answer and a confidence; the tiny model rarely writes one, so the labels
    # are checked by the confidence reward and the dcpo post-process handles both cases.
    train = [{"prompt": r["prompt"] + " (answer, then confidence: p)", "label": r["label"]}
             for r in make_splits(n_test=200)[0][:64]]
    data = write_jsonl(train, tmp_path / "conf.jsonl")
    # slime's DCPO command line as written: --rm-type dcpo is rlvr's math_confidence,
    # slime's post-process path is rlvr's registered dcpo post-process.
    records = _run(tiny_qwen2, (data, None), small_eval, tmp_path / "dcpo", "--advantage-estimator", "dcpo",
                   "--rm-type", "dcpo", "--custom-reward-post-process-path",
                   "slime.rollout.rm_hub.dcpo_reward_post_process.dcpo_reward_post_process")
    assert [r["train/step"] for r in records if "train/step" in r] == [1, 2]
    rollout = [r for r in records if "rollout/step" in r][0]
    for key in ("rollout/dcpo/confidence", "rollout/dcpo/has_confidence", "rollout/dcpo/calibration_error",
                "rollout/dcpo/brier", "rollout/dcpo_confidence"):  # DCPO's metrics, both sides' prefixes
        assert key in rollout, key
    assert rollout["rollout/dcpo/confidence"] == pytest.approx(rollout["rollout/dcpo_confidence"])
    assert "eval/arith/dcpo/calibration_error" in [r for r in records if "eval/step" in r][-1]


@pytest.mark.slow
def test_dynamic_sampling_filter_and_tis(tiny_qwen2, arith_files, small_eval, tmp_path):
    records = _run(tiny_qwen2, arith_files, small_eval, tmp_path / "dapo",
                   "--dynamic-sampling-filter-path", "nonzero_std", "--dynamic-sampling-max-rounds", "2",
                   "--overlong-buffer-len", "2", "--use-tis", "--use-opsm")
    rollout = [r for r in records if "rollout/step" in r]
    # An untrained model gets every answer wrong: a group passes only when the overlong penalty
    # tells its lengths apart (a sample hit EOS early), which depends on the draws; the rest are
    # dropped, then reused and counted.
    assert rollout[0]["rollout/dynamic_filter/rounds"] == 2
    unfilled = rollout[0]["rollout/dynamic_filter/unfilled_groups"]
    assert 1 <= unfilled <= 4 and rollout[0]["rollout/dynamic_filter/dropped_groups"] >= unfilled
    train = [r for r in records if "train/step" in r][0]
    assert "train/tis" in train and "train/tis_clipfrac" in train and "train/opsm_clipfrac" in train


def test_dcpo_without_post_process_is_refused(tiny_qwen2, arith_files, capsys):
    code = main(["train", "--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0]),
                 "--advantage-estimator", "dcpo"])
    assert code == 2 and "--custom-reward-post-process-path dcpo" in capsys.readouterr().err
