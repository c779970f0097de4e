"""End to end through the real CLI: `rlvr train` for 2 rollouts on two tiny architectures, with a
reward every response earns some of, so that the run has something to learn: the first update
moves the policy away from the reference and the checkpoint holds the moved weights."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlvr.models.tiny import build_tiny_model
from tests.conftest import SMALL, write_lines


def rlvr(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvr", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def even_tokens(sample) -> float:
    """The share of the response's token ids that are even: a tiny random model earns some of it
    and not all, so GRPO's advantages are not all zero (the arithmetic reward is 0 for every
    response of such a model: nothing to learn)."""
    ids = sample.response_ids
    return sum(t % 2 == 0 for t in ids) / max(1, len(ids))


def _train_args(ckpt, arith_files, out):
    train, test = arith_files
    return ["train", "--hf-checkpoint", str(ckpt), "--prompt-data", str(train),
            "--eval-prompt-data", "arith", str(test), "--eval-interval", "1",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "4",
            "--num-rollout", "2", "--lr", "1e-3", "--use-kl-loss", "--kl-loss-coef", "0.01",
            "--kl-loss-type", "low_var_kl", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "64",
            "--save-interval", "1", "--use-tensorboard", "--custom-rm-path", "tests.test_e2e:even_tokens",
            "--output-dir", str(out)]


def _check_run(out: Path, base: Path):
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/step"] for r in records if "rollout/step" in r] == [0, 1]
    assert [r["eval/step"] for r in records if "eval/step" in r] == [0, 1, 2]
    assert [r["train/step"] for r in records if "train/step" in r] == [1, 2]
    first, second = [r for r in records if "train/step" in r]
    for key in ("train/loss", "train/pg_loss", "train/kl_loss", "train/pg_clipfrac", "train/grad_norm"):
        assert key in first
    rewards = [r["rollout/raw_reward"] for r in records if "rollout/step" in r]
    assert all(0.0 < x < 1.0 for x in rewards), rewards  # some signal, not all of it
    # The policy is the KL reference until the first update moves it: the second step sees the move.
    assert first["train/grad_norm"] > 0 and first["train/kl_loss"] == 0.0 < second["train/kl_loss"]
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "config.yaml").is_file() and (out / "samples.jsonl").is_file()
    ckpt = out / "checkpoints" / "rollout_000002"
    assert (ckpt / "trainer_state.pt").is_file()
    AutoModelForCausalLM.from_pretrained(ckpt)  # a plain HF checkpoint
    before, after = load_file(base / "model.safetensors"), load_file(ckpt / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before.keys() & after.keys())  # trained weights


@pytest.mark.slow
def test_train_two_rollouts_qwen2(tiny_qwen2, arith_files, tmp_path):
    r = rlvr(*_train_args(tiny_qwen2, arith_files, tmp_path / "run"))
    assert r.returncode == 0, r.stderr[-3000:]
    _check_run(tmp_path / "run", tiny_qwen2)
    assert "rollout 1 |" in r.stdout


@pytest.mark.slow
def test_train_two_rollouts_on_a_second_architecture(arith_files, tmp_path):
    llama = build_tiny_model(tmp_path / "tiny_llama", arch="llama", **SMALL)
    assert json.loads((llama / "config.json").read_text())["model_type"] == "llama"
    r = rlvr(*_train_args(llama, arith_files, tmp_path / "run"))
    assert r.returncode == 0, r.stderr[-3000:]
    _check_run(tmp_path / "run", llama)


def test_cli_errors_name_the_line_key_and_valid_values(tiny_qwen2, tmp_path):
    bad = write_lines(tmp_path / "bad.jsonl", [{"prompt": "1+1=", "label": "2"}, '{"prompt": oops}'])
    r = rlvr("train", "--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(bad))
    assert r.returncode == 2 and f"{bad}:2: not valid JSON" in r.stderr
    nolabel = write_lines(tmp_path / "nolabel.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    r = rlvr("train", "--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(nolabel))
    assert r.returncode == 2 and "nolabel.jsonl:1: missing label field 'label' (--label-key)" in r.stderr
    r = rlvr("train", "--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(nolabel), "--rm-type", "nope")
    assert r.returncode == 2 and "--rm-type: unknown reward 'nope'; valid: " in r.stderr and " math," in r.stderr


def test_second_run_in_the_same_directory_archives_the_first(tiny_qwen2, arith_files, tmp_path):
    from rlvr.entrypoints.cli import main

    args = ["train", "--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0]),
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "3",
            "--num-rollout", "1", "--output-dir", str(tmp_path / "run")]
    assert main(args) == 0 and main(args) == 0
    archived = list((tmp_path / "run" / "archive").glob("*/metrics.jsonl"))
    assert len(archived) == 1
    current = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line).get("rollout/step") for line in current].count(0) == 1


def test_eval_command_prints_a_table(tiny_qwen2, arith_files, capsys):
    from rlvr.entrypoints.cli import main

    assert main(["eval", "--hf-checkpoint", str(tiny_qwen2), "--eval-prompt-data", "arith", str(arith_files[1]),
                 "--rollout-max-response-len", "3"]) == 0
    out = capsys.readouterr().out
    assert "eval/arith/score" in out and "eval/arith/truncated_ratio" in out
    assert main(["eval", "--hf-checkpoint", str(tiny_qwen2)]) == 2
