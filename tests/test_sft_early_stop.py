"""``rlvr sft`` early stopping on a validation metric (``--sft-stop-score``, ``--eval-interval``):
it stops at the first evaluation at or above the target, and the bootstrap of the demo reads its
validation split, never the test split whose accuracy the demo reports."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from rlvr.runtime.configure import parse_config
from rlvr.data.arith import make_splits, split_validation, write_jsonl
from rlvr.observe import read_metrics
from rlvr.entrypoints.sft import SftEvaluator, reached_target, run_sft

_OPENED: list[str] | None = None  # paths opened while a test records them (an audit hook cannot be removed)


def _record_opens(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, Path)):
        _OPENED.append(str(Path(str(args[0], "utf-8") if isinstance(args[0], bytes) else args[0]).resolve()))


sys.addaudithook(_record_opens)


def _task(tmp_path: Path) -> tuple[Path, Path, Path]:
    train, test = make_splits(n_test=40)
    train, val = split_validation(train[:400], 24)
    return (write_jsonl(train, tmp_path / "train.jsonl"), write_jsonl(val, tmp_path / "val.jsonl"),
            write_jsonl(test, tmp_path / "test.jsonl"))


def _cfg(model: Path, train: Path, val: Path, out: Path, *flags: str):
    return parse_config(["--hf-checkpoint", str(model), "--prompt-data", str(train), "--rm-type", "math",
                         "--rollout-batch-size", "8", "--n-samples-per-prompt", "1", "--rollout-max-response-len", "4",
                         "--lr", "1e-3", "--eval-prompt-data", "val", str(val), "--output-dir", str(out), *flags],
                        rl=False)


def test_reached_target_is_at_or_above():
    assert [reached_target(s, 0.3) for s in (0.0, 0.299, 0.3, 0.31, 1.0)] == [False, False, True, True, True]
    assert not reached_target(1.0, None)


def test_stops_at_first_eval_at_or_above_target(tiny_qwen2, tmp_path, monkeypatch):
    """Scores 0.10, 0.25, 0.30, 0.90 at steps 2, 4, 6, 8 with target 0.30: the run stops after step 6
    (0.30 is *at* the target), evaluating 3 times and training 6 steps, not the 10 asked for."""
    scores = iter([0.10, 0.25, 0.30, 0.90, 0.95])
    monkeypatch.setattr(SftEvaluator, "__call__", lambda self, step: {"eval/val/score": next(scores)})
    train, val, _ = _task(tmp_path)
    run_dir = tmp_path / "run"
    cfg = _cfg(tiny_qwen2, train, val, run_dir, "--num-rollout", "10", "--eval-interval", "2",
               "--sft-stop-score", "0.3")
    out = run_sft(cfg, tmp_path / "model", console=False)
    records = read_metrics(run_dir)
    assert [r["train/step"] for r in records if "train/step" in r] == [1, 2, 3, 4, 5, 6]
    assert [(r["eval/step"], r["eval/val/score"]) for r in records if "eval/step" in r] == [(2, 0.10), (4, 0.25),
                                                                                             (6, 0.30)]
    assert (out / "config.json").is_file()


def test_no_target_runs_every_step(tiny_qwen2, tmp_path, monkeypatch):
    monkeypatch.setattr(SftEvaluator, "__call__", lambda self, step: {"eval/val/score": 1.0})
    train, val, _ = _task(tmp_path)
    cfg = _cfg(tiny_qwen2, train, val, tmp_path / "run", "--num-rollout", "5", "--eval-interval", "2")
    run_sft(cfg, tmp_path / "model", console=False)
    assert sum("train/step" in r for r in read_metrics(tmp_path / "run")) == 5


def test_real_evaluation_stops_and_never_opens_the_test_split(tiny_qwen2, tmp_path):
    """A real greedy evaluation on the validation split (score >= 0 always, so target 0 stops at
    the first evaluation); the test split lies next to it and is never opened."""
    global _OPENED
    train, val, test = _task(tmp_path)
    cfg = _cfg(tiny_qwen2, train, val, tmp_path / "run", "--num-rollout", "6", "--eval-interval", "3",
               "--sft-stop-score", "0")
    _OPENED = []
    try:
        run_sft(cfg, tmp_path / "model", console=False)
        opened = set(_OPENED)
    finally:
        _OPENED = None
    assert str(val.resolve()) in opened and str(train.resolve()) in opened  # the hook does see data reads
    assert str(test.resolve()) not in opened
    records = read_metrics(tmp_path / "run")
    assert [r["eval/step"] for r in records if "eval/step" in r] == [3]
    assert 0.0 <= records[-1]["eval/val/score"] <= 1.0


def test_demo_bootstrap_config_names_validation_not_test():
    """The demo's bootstrap (examples/arith/sft.yaml) stops on the validation split and names no
    test file anywhere."""
    raw = yaml.safe_load((Path(__file__).parents[1] / "examples/arith/sft.yaml").read_text())
    assert "test" not in " ".join(str(v) for v in raw.values())
    assert [Path(p).name for p in raw["eval-prompt-data"][1::2]] == ["val.jsonl"]
    assert raw["sft-stop-score"] > 0 and raw["eval-interval"] >= 1
