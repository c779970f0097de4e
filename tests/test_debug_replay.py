"""slime's debug split: rollouts saved by a live run and replayed with --load-debug-rollout-data
--debug-train-only train to the same metrics; --debug-rollout-only samples without training;
--save-hf and `rlvr export` write plain HF checkpoints."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlvr.entrypoints.cli import main
from rlvr.core.errors import ConfigError
from rlvr.core.types import RolloutBatch


def records(run_dir: Path, step_key: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("perf/")} for r in rows if step_key in r]


def base(ckpt, train, out) -> list[str]:
    return ["train", "--hf-checkpoint", str(ckpt), "--prompt-data", str(train), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--rollout-max-response-len", "5", "--num-rollout", "2", "--lr", "1e-3",
            "--use-kl-loss", "--kl-loss-coef", "0.01", "--output-dir", str(out)]


@pytest.mark.slow
def test_replayed_rollouts_train_to_the_same_metrics(tiny_qwen2, arith_files, tmp_path):
    dump = str(tmp_path / "dump" / "rollout_{rollout_id}.pt")
    live = tmp_path / "live"
    assert main(base(tiny_qwen2, arith_files[0], live) + ["--save-debug-rollout-data", dump,
                                                          "--save-hf", str(tmp_path / "hf")]) == 0
    assert RolloutBatch.load(dump.format(rollout_id=1)).rollout_id == 1
    replay = tmp_path / "replay"
    assert main(base(tiny_qwen2, arith_files[0], replay) + ["--load-debug-rollout-data", dump,
                                                            "--debug-train-only"]) == 0
    a, b = records(live, "train/step"), records(replay, "train/step")
    assert len(a) == 2 and a == b  # every train/* value, bit for bit
    assert records(live, "rollout/step") == records(replay, "rollout/step")

    # --save-hf wrote the final policy as a plain HF checkpoint; `rlvr export` gives the same weights.
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert main(["export", str(live / "checkpoints"), str(tmp_path / "exported")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    assert not (tmp_path / "exported" / "trainer_state.pt").exists()
    for (name, p), q in zip(hf.named_parameters(), exported.parameters()):
        assert torch.equal(p, q), name
    start = AutoModelForCausalLM.from_pretrained(tiny_qwen2)
    assert not all(torch.equal(p, q) for p, q in zip(start.parameters(), hf.parameters()))  # it trained


def test_debug_rollout_only_samples_without_training(tiny_qwen2, arith_files, tmp_path):
    out = tmp_path / "r"
    assert main(base(tiny_qwen2, arith_files[0], out) + ["--debug-rollout-only", "--num-rollout", "1"]) == 0
    assert records(out, "rollout/step") and not records(out, "train/step")
    assert not (out / "checkpoints").exists()


def test_debug_flags_validated(tiny_qwen2, arith_files, tmp_path):
    from rlvr.runtime.configure import parse_config

    common = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0])]
    with pytest.raises(ConfigError, match="--debug-train-only: needs --load-debug-rollout-data"):
        parse_config(common + ["--debug-train-only"])
    with pytest.raises(ConfigError, match=r"--save-debug-rollout-data: .*needs a \{rollout_id\} placeholder"):
        parse_config(common + ["--save-debug-rollout-data", "x.pt"])
    with pytest.raises(ConfigError, match="--debug-rollout-only: cannot be combined"):
        parse_config(common + ["--debug-rollout-only", "--load-debug-rollout-data", "d/{rollout_id}.pt"])
    assert parse_config(common + ["--load-debug-rollout-data", "d/{rollout_id}.pt"]).run.debug_train_only
    # A missing dump fails with the file it looked for.
    assert main(["train", *common, "--load-debug-rollout-data", str(tmp_path / "none_{rollout_id}.pt"),
                 "--num-rollout", "1", "--output-dir", str(tmp_path / "o")]) == 2


def test_eval_sampling_flags_reach_the_engine(tiny_qwen2, arith_files, tmp_path):
    """--eval-top-k 1 at temperature 1 draws the argmax: the same responses as greedy eval; and
    pass@k / truncated_ratio are reported per set."""
    from rlvr.config import build_config
    from rlvr.entrypoints.evaluate import run_eval

    small = tmp_path / "test.jsonl"
    small.write_text("".join(arith_files[1].read_text().splitlines(keepends=True)[:24]))

    def evaluate(**kw):
        cfg = build_config({"hf_checkpoint": str(tiny_qwen2), "eval_prompt_data": ["arith", str(small)],
                            "rollout_max_response_len": 4, **kw})
        return run_eval(cfg)

    greedy = evaluate()
    top1 = evaluate(eval_temperature=1.0, eval_top_k=1, n_samples_per_eval_prompt=2)
    assert top1["eval/arith/response_len/mean"] == greedy["eval/arith/response_len/mean"]
    assert top1["eval/arith/truncated_ratio"] == greedy["eval/arith/truncated_ratio"]
    assert "eval/arith/pass@2" in top1 and "eval/arith/pass@2" not in greedy
    # Sampling is not greedy: over 48 x 64 draws some response stops early at EOS (p ~ 1/259 a
    # draw on the random tiny model), which the argmax does not (4 tokens was a coin flip).
    greedy64 = evaluate(eval_max_response_len=64)
    sampled = evaluate(eval_temperature=1.0, eval_top_p=1.0, n_samples_per_eval_prompt=2, eval_max_response_len=64)
    assert sampled["eval/arith/response_len/mean"] != greedy64["eval/arith/response_len/mean"]
