"""rlvr.observe: JSONL/TensorBoard sinks, console summary lines, the plot dashboard."""

import io
import json
import math

import numpy as np
import pytest
import torch
from rich.console import Console

from rlvr.core.errors import DataError
from rlvr.observe import (ConsoleProgress, MetricsLogger, compute_statistics, format_summary,
                          plot_runs, read_metrics)


def test_jsonl_round_trip_with_step_keys(tmp_path):
    with MetricsLogger(tmp_path) as log:
        log.log({"rollout/raw_reward": torch.tensor(0.25), "rollout/response_len/mean": np.float32(12.0)},
                "rollout/step", 0)
        log.log({"train/pg_loss": 1.5, "train/kl_loss": float("nan"), "train/grad_norm": float("inf")},
                "train/step", 3)
        log.log({"eval/gsm8k": 0.5, "eval/step": 1}, "eval/step", 1)  # slime puts the step in the dict too
    records = read_metrics(tmp_path)
    assert [r.get("rollout/step", r.get("train/step", r.get("eval/step"))) for r in records] == [0, 3, 1]
    assert records[0]["rollout/step"] == 0 and records[0]["rollout/raw_reward"] == 0.25
    assert records[0]["rollout/response_len/mean"] == 12.0
    assert records[1]["train/pg_loss"] == 1.5
    assert records[1]["train/kl_loss"] is None and records[1]["train/grad_norm"] is None  # non-finite -> null
    assert records[2] == {"eval/step": 1, "eval/gsm8k": 0.5, "time": records[2]["time"]}
    assert all(isinstance(r["time"], float) for r in records)
    # Every line is standard JSON (no NaN/Infinity tokens).
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def test_log_is_flushed_before_close(tmp_path):
    log = MetricsLogger(tmp_path)
    log.log({"rollout/raw_reward": 1.0}, "rollout/step", 7)
    assert read_metrics(tmp_path)[0]["rollout/step"] == 7  # a killed run keeps what it logged
    log.close()


def test_bad_step_key_and_values_fail_clearly(tmp_path):
    with MetricsLogger(tmp_path) as log:
        with pytest.raises(ValueError, match="rollout/step, train/step, eval/step"):
            log.log({"x": 1.0}, "step", 0)
        with pytest.raises(TypeError, match="train/name"):
            log.log({"train/name": "abc"}, "train/step", 0)
        with pytest.raises(TypeError, match="shape"):
            log.log({"train/loss": torch.ones(3)}, "train/step", 0)
        with pytest.raises(ValueError, match="rollout/step=5"):
            log.log({"rollout/step": 5}, "train/step", 0)
    assert read_metrics(tmp_path) == []


def test_tensorboard_scalar_readable(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, use_tensorboard=True) as log:
        log.log({"train/pg_loss": 0.75}, "train/step", 2)
        log.log({"train/pg_loss": 0.5, "train/kl_loss": None}, "train/step", 3)
    tb_dir = tmp_path / "tensorboard"
    assert any(p.name.startswith("events.out.tfevents") for p in tb_dir.iterdir())
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    assert "train/kl_loss" not in acc.Tags()["scalars"]
    events = acc.Scalars("train/pg_loss")
    assert [(e.step, e.value) for e in events] == [(2, 0.75), (3, 0.5)]


def test_tensorboard_custom_dir(tmp_path):
    with MetricsLogger(tmp_path / "run", use_tensorboard=True, tb_dir=tmp_path / "tb") as log:
        log.log({"perf/step_time": 1.0}, "rollout/step", 0)
    assert list((tmp_path / "tb").glob("events.out.tfevents*"))
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_truncated_final_line_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"rollout/step": 0, "rollout/raw_reward": 0.5}\n{"rollout/step": 1, "rollout/ra')
    with pytest.warns(UserWarning, match="truncated"):
        records = read_metrics(tmp_path)
    assert records == [{"rollout/step": 0, "rollout/raw_reward": 0.5}]


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"rollout/step": 0}\n{oops\n{"rollout/step": 1}\n')
    with pytest.raises(DataError, match=r"metrics\.jsonl:2: not valid JSON"):
        read_metrics(tmp_path)


def test_missing_metrics_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        read_metrics(tmp_path)


def test_compute_statistics():
    assert compute_statistics([4, 1, 3, 2]) == {"mean": 2.5, "median": 2.5, "max": 4.0, "min": 1.0}
    assert compute_statistics([]) == {}


def test_format_summary_contents():
    line = format_summary(5, {
        "rollout/rewards": 0.625, "rollout/accuracy": 0.5, "rollout/response_len/mean": 37.04,
        "train/ppo_kl": 0.0031, "eval/math/score": 0.75, "eval/math-truncated_ratio": 0.1,
        "eval/step": 5, "perf/step_time": 12.34, "train/pg_loss": 9.0,
    })
    assert line == "rollout 5 | reward 0.625 | acc 0.500 | len 37.0 | ppo_kl 0.003 | eval math 0.750 | 12.3s"
    # raw_reward wins over rewards; missing keys are omitted; tiny KL is still readable.
    line = format_summary(0, {"rollout/raw_reward": 1.0, "rollout/rewards": 0.0, "train/kl_loss": 2e-5})
    assert line == "rollout 0 | reward 1.000 | kl 2.00e-05"
    assert format_summary(1, {}) == "rollout 1"
    assert "nan" in format_summary(2, {"rollout/raw_reward": math.nan})


def test_console_progress_non_tty_prints_plain_lines():
    buf = io.StringIO()
    console = Console(file=buf, width=40)  # not a terminal, narrower than a summary line
    metrics = {"rollout/raw_reward": 0.5, "rollout/response_len/mean": 100.0,
               "train/kl_loss": 0.01, "eval/gsm8k": 0.25, "perf/step_time": 3.0}
    with ConsoleProgress(total_rollouts=3, start=1, console=console) as progress:
        progress.advance(1, metrics)
        progress.advance(2, {"rollout/raw_reward": 0.75})
    out = buf.getvalue()
    assert "\x1b" not in out and "\r" not in out
    assert out.splitlines() == [format_summary(1, metrics), "rollout 2 | reward 0.750"]


def test_console_progress_disabled_prints_nothing():
    buf = io.StringIO()
    with ConsoleProgress(2, enabled=False, console=Console(file=buf, force_terminal=True)) as progress:
        progress.advance(0, {"rollout/raw_reward": 1.0})
    assert buf.getvalue() == ""


def test_console_progress_terminal_shows_lines_and_bar():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with ConsoleProgress(2, console=console) as progress:
        progress.advance(0, {"rollout/raw_reward": 0.5})
        progress.advance(1, {"rollout/raw_reward": 0.6})
    out = buf.getvalue()
    assert "rollout 0 | reward 0.500" in out and "rollout 1 | reward 0.600" in out
    assert "2/2" in out


def _write_run(run_dir, n, full):
    with MetricsLogger(run_dir) as log:
        for i in range(n):
            rollout = {"rollout/raw_reward": 0.1 * i, "rollout/response_len/mean": 20 + i,
                       "perf/rollout_time": 1.0, "perf/train_time": 0.5}
            if full:
                rollout.update({"perf/update_weights_time": 0.1, "perf/eval_time": 0.2})
            log.log(rollout, "rollout/step", i)
            log.log({"train/kl_loss": 0.01 * i, "train/entropy_loss": 1.0 - 0.1 * i}, "train/step", i)
            if full and i % 2 == 0:
                log.log({"eval/gsm8k": 0.2 + 0.1 * i, "eval/gsm8k-truncated_ratio": 0.0}, "eval/step", i)


def test_plot_two_runs_one_missing_metrics(tmp_path):
    _write_run(tmp_path / "full", 4, full=True)
    _write_run(tmp_path / "partial", 3, full=False)  # no eval, fewer perf keys
    out = plot_runs([tmp_path / "full", tmp_path / "partial"])
    assert out == tmp_path / "full" / "curves.png"
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    from PIL import Image

    with Image.open(out) as img:
        img.verify()  # a complete, valid PNG
    with Image.open(out) as img:
        assert img.size == (1600, 900)
        panels = dict(p.split(": ", 1) for p in img.text["Description"].split(" | "))
    assert list(panels) == ["reward", "eval score", "KL", "entropy", "response length (mean)", "time split (s)"]
    assert panels["reward"] == "full, partial" and panels["entropy"] == "full, partial"
    assert panels["eval score"] == "full"  # the partial run has no eval
    assert "full: perf/train_time" in panels["time split (s)"] and "partial: perf/rollout_time" in panels["time split (s)"]


def test_plot_empty_panels_and_custom_out(tmp_path):
    with MetricsLogger(tmp_path / "run") as log:
        log.log({"rollout/raw_reward": 0.5}, "rollout/step", 0)  # every other panel: "no data"
    out = plot_runs([tmp_path / "run"], out=tmp_path / "plots" / "x.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_plot_missing_metrics_file(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty: no metrics.jsonl"):
        plot_runs([tmp_path / "empty"])
