"""A real `rlvr train` run writes TensorBoard events and an offline W&B run; both are read back
(TensorBoard's event reader; the W&B transaction log with wandb's own protobuf records)."""

import json
import struct
from pathlib import Path

import pytest

from rlvr.entrypoints.cli import main
from rlvr.observe import read_metrics


def wandb_history(run_file: Path) -> list[dict]:
    """The ``history`` records of an offline W&B run file (``run-<id>.wandb``).

    The file is a 7-byte W&B header, then LevelDB's log format: 32 KiB blocks of chunks, each
    with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last); each whole
    record is a ``wandb_internal_pb2.Record``. (wandb >= 0.19 no longer ships a Python reader.)
    """
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, buf, out = run_file.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (kind == 0 and length == 0):  # block trailer / zero padding
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            if record.WhichOneof("record_type") == "history":
                out.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return out


@pytest.mark.slow
def test_tensorboard_and_offline_wandb_from_a_real_run(tiny_qwen2, arith_files, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    assert main(["train", "--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0]),
                 "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "3",
                 "--num-rollout", "2", "--output-dir", str(out), "--use-tensorboard", "--tb-project-name", "proj",
                 "--tb-experiment-name", "exp", "--use-wandb", "--wandb-project", "proj",
                 "--wandb-mode", "offline"]) == 0
    jsonl = read_metrics(out)
    rollout_rewards = [r["rollout/raw_reward"] for r in jsonl if "rollout/step" in r]
    train_losses = [(r["train/step"], r["train/loss"]) for r in jsonl if "train/step" in r]

    acc = EventAccumulator(str(out / "tensorboard" / "proj" / "exp"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("rollout/raw_reward")] == [
        (i, pytest.approx(v)) for i, v in enumerate(rollout_rewards)]
    assert [(e.step, pytest.approx(e.value)) for e in acc.Scalars("train/loss")] == train_losses
    assert "perf/rollout_time" in acc.Tags()["scalars"]

    (run_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    history = wandb_history(run_file)
    # Each record carries its step key (W&B also fills in rollout/step for perf/* keys, whose x
    # axis it is, as slime defines them).
    assert [(h["rollout/step"], h["rollout/raw_reward"]) for h in history if "rollout/raw_reward" in h] == [
        (i, pytest.approx(v)) for i, v in enumerate(rollout_rewards)]
    assert [(h["train/step"], h["train/loss"]) for h in history if "train/loss" in h] == [
        (s, pytest.approx(v)) for s, v in train_losses]
