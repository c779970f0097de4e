"""Exact resume: a run killed (SIGKILL) mid-rollout and resumed with --load logs the same values as
an uninterrupted run, bit for bit, with --deterministic-mode and a busy process beside it; a SIGKILL
mid-save leaves the previous checkpoint loadable. Real processes through the real CLI;
``RLVR_TEST_SIGKILL_AT`` makes the kill land at a chosen point."""

import json
import signal

import pytest

from rlvr.runtime.checkpoint import LATEST_FILE, list_checkpoints, read_latest
from tests.support import logged_values, resume_args, run_rlvr


SMALL_EVAL_ROWS = 6  # the small_eval fixture (conftest.py)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("--lora-rank", "4", "--lr", "1e-2"), ("--async", "--max-staleness", "1"),
                                   ("--compile-layers",)], ids=["full", "lora", "async", "compiled"])
def test_sigkill_mid_rollout_then_resume_matches_uninterrupted_run(tiny_qwen2, arith_files, small_eval, tmp_path,
                                                                  extra, busy_cpu):
    """Every value the resumed process logs equals the uninterrupted run's exactly. A busy process
    runs beside both, so requests reach the engine in a different order in each run: only the
    batch-invariant engine and index-keyed seeds of --deterministic-mode make the values equal."""
    train = arith_files[0]
    extra = ("--deterministic-mode", *extra)
    full = run_rlvr(*resume_args(tiny_qwen2, train, small_eval, tmp_path / "full", *extra))
    assert full.returncode == 0, full.stderr[-3000:]
    killed = run_rlvr(*resume_args(tiny_qwen2, train, small_eval, tmp_path / "resumed", *extra), kill_at="rollout:4")
    assert killed.returncode == -signal.SIGKILL
    assert read_latest(tmp_path / "resumed" / "ckpt") == 4
    resumed = run_rlvr(*resume_args(tiny_qwen2, train, small_eval, tmp_path / "resumed", *extra))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "rollout 4" in resumed.stderr
    if "--compile-layers" in extra:
        assert "decoder layers compiled" in full.stderr and "decoder layers compiled" in resumed.stderr
    assert "differ from the checkpoint" not in resumed.stderr

    a, b = logged_values(tmp_path / "full"), logged_values(tmp_path / "resumed")
    assert a.keys() == b.keys()  # same steps, none lost, none twice
    # Rollouts 5-6 (the trainer logs one record per rollout, at its last optimizer step; 2 per
    # rollout here) and the final eval were logged only by the resumed process.
    late = [k for k in a if (k[0] == "rollout/step" and k[1] >= 4) or (k[0] == "train/step" and k[1] > 8)
            or (k[0] == "eval/step" and k[1] == 6)]
    assert sorted(late) == [("eval/step", 6), ("rollout/step", 4), ("rollout/step", 5),
                            ("train/step", 10), ("train/step", 12)]
    # Not trivially equal: the values move from rollout to rollout.
    assert a[("train/step", 10)]["train/entropy_loss"] != a[("train/step", 12)]["train/entropy_loss"]
    assert a[("train/step", 12)]["train/kl_loss"] > 0
    compared = 0
    for k in a:
        assert a[k].keys() == b[k].keys(), k
        for name, x in a[k].items():
            assert x == b[k][name], (k, name, x, b[k][name])  # bit for bit
            compared += k in late
    print(f"resume: {compared} values logged after the kill, all equal to the uninterrupted run's")
    # The metric streams are one run's: samples.jsonl has each rollout once, config kept.
    rollouts = [json.loads(line)["rollout_id"] for line in (tmp_path / "resumed" / "samples.jsonl").open()]
    assert sorted(set(rollouts)) == list(range(6)) and rollouts == sorted(rollouts)


@pytest.mark.slow
def test_sigkill_mid_save_leaves_previous_checkpoint_loadable(tiny_qwen2, arith_files, small_eval, tmp_path):
    from transformers import AutoTokenizer

    from rlvr.runtime.checkpoint import find_checkpoint, read_run_state, save_checkpoint
    from rlvr.runtime.configure import parse_config
    from rlvr.train.trainer import Trainer

    out = tmp_path / "run"
    argv = resume_args(tiny_qwen2, arith_files[0], small_eval, out, "--num-rollout", "4")
    killed = run_rlvr(*argv, kill_at="save:4")
    assert killed.returncode == -signal.SIGKILL
    ckpt = out / "ckpt"
    assert (ckpt / "rollout_000004.tmp" / "model.safetensors").is_file()  # the half-written one
    assert (ckpt / LATEST_FILE).read_text().strip() == "2"
    assert [rid for rid, _ in list_checkpoints(ckpt)] == [2]

    # What --load would pick is the previous, complete checkpoint, and it loads.
    cfg = parse_config(argv[1:])
    path = find_checkpoint(ckpt)
    assert path.name == "rollout_000002"
    trainer = Trainer(cfg.train, cfg.algo, global_batch_size=4, n_samples_per_prompt=4)
    assert trainer.load(path)["rollout_id"] == 2 and trainer.step == 4
    state = read_run_state(path)
    assert state["rollout_id"] == 2 and state["data_source"]["offset"] == 4 and "engine" in state["rng"]

    # The next save replaces the leftover and, with keep-last-k 1, prunes rollout 2.
    save_checkpoint(ckpt, 3, trainer, AutoTokenizer.from_pretrained(tiny_qwen2), state, "x: 1\n", keep_last_k=1)
    save_checkpoint(ckpt, 4, trainer, AutoTokenizer.from_pretrained(tiny_qwen2), state, "x: 1\n", keep_last_k=1)
    assert [rid for rid, _ in list_checkpoints(ckpt)] == [4] and read_latest(ckpt) == 4
    assert not (ckpt / "rollout_000004.tmp").exists()


def test_resume_cuts_records_logged_after_the_checkpoint(tmp_path):
    """A crash between a checkpoint and the next one leaves records (and maybe a half-written
    line) that the resumed run will log again: they are cut, the rest is kept as it was."""
    from rlvr.observe.run_files import truncate_streams

    rows = [{"eval/step": 0, "eval/a/score": 0.1}, {"train/step": 2, "train/loss": 1.0},
            {"rollout/step": 0, "rollout/raw_reward": 0.5}, {"train/step": 4, "train/loss": 0.9},
            {"eval/step": 2, "eval/a/score": 0.2}, {"rollout/step": 1, "rollout/raw_reward": 0.6},
            {"train/step": 6, "train/loss": 0.8}, {"rollout/step": 2, "rollout/raw_reward": 0.7}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"train/st')
    samples = [{"rollout_id": i, "response": "x"} for i in (0, 1, 2)]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    truncate_streams(tmp_path, rollout_id=2, train_step=4)  # checkpoint after 2 rollouts, 4 steps
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == rows[:6]
    assert [json.loads(line)["rollout_id"] for line in (tmp_path / "samples.jsonl").open()] == [0, 1]


def test_load_from_an_empty_directory_starts_fresh(tmp_path, tiny_qwen2, arith_files, caplog):
    from rlvr.runtime.configure import parse_config
    from rlvr.core.errors import ConfigError
    from rlvr.runtime.loop import resume_point

    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0]),
                        "--load", str(tmp_path / "ckpt")])
    assert resume_point(cfg) == (None, None) and "no checkpoint there yet" in caplog.text
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / LATEST_FILE).write_text("7\n")  # names a checkpoint that is not there
    with pytest.raises(ConfigError, match="--load: .* names rollout_000007, which is missing or incomplete"):
        resume_point(cfg)


def test_trainer_checkpoint_keeps_bf16_masters_and_a_moved_reference(tiny_qwen2, arith_files, tmp_path):
    """The HF weights are not all of the trainer's state: --bf16's float32 masters and a reference
    model moved by --ref-update-interval come back from a checkpoint too."""
    import torch

    from rlvr.runtime.configure import parse_config
    from rlvr.train.trainer import Trainer

    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0]), "--bf16",
                        "--use-kl-loss", "--ref-update-interval", "1"])
    a = Trainer(cfg.train, cfg.algo)
    with torch.no_grad():
        for m in a.optimizer.master:
            m.add_(1e-4)  # a float32 change too small to show in bfloat16
        for p in a.reference.model.parameters():
            p.mul_(0.5)
    a.step = 3
    a.save(tmp_path / "ck")
    b = Trainer(cfg.train, cfg.algo)
    b.load(tmp_path / "ck")
    assert b.step == 3
    assert all(torch.equal(x, y) for x, y in zip(a.optimizer.master, b.optimizer.master))
    assert all(torch.equal(x, y) for x, y in zip(a.reference.model.parameters(), b.reference.model.parameters()))
