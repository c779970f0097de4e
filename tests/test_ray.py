"""Ray mode on a real local Ray cluster (one per module, started here): the loop runs unchanged
with 2 training ranks and 2 embedded engines, disaggregated (DDP), colocated, and with FSDP2;
each run finishes, the engines verifiably hold the trainer's weights after every sync
(``--check-weight-update-equal``), and the first optimizer step's gradient of a 2-rank group
equals the single-process trainer's on the same global batch (the batch the Ray run trained on,
saved with ``--save-debug-rollout-data``)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from rlvr.entrypoints.cli import main
from rlvr.runtime.configure import parse_config
from rlvr.core.errors import ConfigError
from rlvr.core.types import RolloutBatch

SERIAL_GROUP = "ray"  # one xdist worker for the group's modules (tests/conftest.py)

ray = pytest.importorskip("ray")


def ray_args(ckpt, train, test, out) -> list[str]:
    return ["--hf-checkpoint", str(ckpt), "--prompt-data", str(train), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--rollout-max-response-len", "5", "--num-rollout", "2", "--lr", "1e-3",
            "--use-kl-loss", "--kl-loss-coef", "0.01", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "30",
            "--eval-prompt-data", "t", str(test), "--output-dir", str(out),
            "--ray", "--actor-num-cpu-workers-per-node", "2", "--rollout-num-engines", "2",
            "--balance-data", "--check-weight-update-equal"]


def records(run_dir: Path, key: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if key in r]


def assert_finished(out: Path, rollouts: int = 2) -> None:
    assert [r["rollout/step"] for r in records(out, "rollout/step")] == list(range(rollouts))
    assert [r["train/step"] for r in records(out, "train/step")] == list(range(1, rollouts + 1))
    assert all(r["perf/update_weights_time"] > 0 for r in records(out, "rollout/step"))
    assert records(out, "eval/step")[-1]["eval/step"] == rollouts
    assert (out / "checkpoints" / f"rollout_{rollouts:06d}" / "model.safetensors").is_file()


def gradient_error(argv: list[str], samples) -> float:
    """Largest per-tensor relative error ||g_ray - g_1|| / ||g_1|| of the first optimizer step's
    gradient: a 2-rank Ray training group vs the single-process trainer, on ``samples``."""
    from ray.util.placement_group import remove_placement_group

    from rlvr.distributed.placement import placement_group, plan
    from rlvr.distributed.train_group import RayTrainer
    from rlvr.runtime.build import make_trainer

    cfg = parse_config(argv)
    p = plan(cfg.cluster, 0)
    pg = placement_group(p)
    group = RayTrainer(cfg, pg, p, os.getcwd())
    try:
        group.setup()
        group.train(0, samples)
        ray_grads = group.gradients()
    finally:
        group.close()
        remove_placement_group(pg)
    local = make_trainer(cfg)
    local.train(0, samples)
    grads = {n: p.grad for n, p in local.model.named_parameters() if p.grad is not None}  # LoRA: adapters only
    assert set(ray_grads) == set(grads)
    # a zero gradient (LoRA's A at the first step, while B = 0) must be zero there too
    error = max(float((ray_grads[n] - g).norm() / g.norm()) if g.norm() > 0 else float(ray_grads[n].norm())
                for n, g in grads.items())
    print(f"{cfg.cluster.train_backend}: first-step gradient, 2 ranks vs 1 process: max relative error {error:.2e}")
    return error


@pytest.mark.slow
def test_ddp_disaggregated(ray_cluster, tiny_qwen2, arith_files, small_eval, tmp_path):
    out, dump = tmp_path / "run", str(tmp_path / "dump" / "rollout_{rollout_id}.pt")
    argv = ray_args(tiny_qwen2, arith_files[0], small_eval, out)
    assert main(["train", *argv, "--save-debug-rollout-data", dump]) == 0
    assert_finished(out)
    batch = RolloutBatch.load(dump.format(rollout_id=0))
    assert gradient_error(argv, batch.samples) < 1e-5


@pytest.mark.slow
def test_async_on_ray_bounds_staleness_and_trains_each_group_once(ray_cluster, tiny_qwen2, arith_files, small_eval,
                                                                  tmp_path):
    """``--async`` under ``--ray``: the producer runs on the rollout manager beside 2 engine actors;
    with ``--max-staleness 1`` no trained sample is older than one version, and the ledger shows
    every drawn group trained exactly once or still pending at the end."""
    from tests.support import check_exactly_once, read_ledger

    out = tmp_path / "run"
    argv = [a for a in ray_args(tiny_qwen2, arith_files[0], small_eval, out) if a != "--check-weight-update-equal"]
    argv += ["--async", "--max-staleness", "1", "--rollout-concurrency", "4", "--num-rollout", "4"]
    assert main(["train", *argv]) == 0
    assert_finished(out, rollouts=4)
    rows = read_ledger(out)
    trained = [r for r in rows if r["trained"]]
    assert all(0 <= r["rollout_id"] - r["version_min"] <= 1 for r in trained)
    check_exactly_once(rows, n=4, batch=2)
    assert max(r["rollout/staleness_max"] for r in records(out, "rollout/step")) <= 1


@pytest.mark.slow
def test_colocated_with_resume(ray_cluster, tiny_qwen2, arith_files, small_eval, tmp_path):
    """Engines sleep while the ranks train and wake with the new weights (checksummed); a
    checkpoint written under Ray resumes under Ray."""
    out = tmp_path / "run"
    argv = ray_args(tiny_qwen2, arith_files[0], small_eval, out) + ["--colocate"]
    assert main(["train", *argv]) == 0
    assert_finished(out)
    assert main(["train", *argv, "--num-rollout", "3", "--load", str(out / "checkpoints")]) == 0
    assert_finished(out, rollouts=3)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
def test_lora_colocated_adapter_sync_resume_and_exact_gradients(ray_cluster, tiny_qwen2, arith_files, small_eval,
                                                                tmp_path, backend):
    """LoRA under --ray: engine actors hold the LoRA-wrapped model and receive only the adapters
    (checksummed, through colocated sleep/wake; FSDP2 gathers the sharded adapters), adapter
    checkpoints resume under Ray, and the 2-rank gradient of the adapters equals one process's."""
    out, dump = tmp_path / "run", str(tmp_path / "dump" / "rollout_{rollout_id}.pt")
    argv = ray_args(tiny_qwen2, arith_files[0], small_eval, out) + ["--colocate", "--lora-rank", "4",
                                                                    "--train-backend", backend]
    assert main(["train", *argv, "--save-debug-rollout-data", dump]) == 0
    assert [r["train/step"] for r in records(out, "train/step")] == [1, 2]
    assert (out / "checkpoints" / "rollout_000002" / "adapter_model.safetensors").is_file()
    assert main(["train", *argv, "--num-rollout", "3", "--load", str(out / "checkpoints")]) == 0
    assert [r["rollout/step"] for r in records(out, "rollout/step")] == [0, 1, 2]
    # the resumed run's first step starts from the loaded adapter, not from B = 0 (policy == base: KL 0)
    assert records(out, "train/step")[-1]["train/step"] == 3 and records(out, "train/step")[-1]["train/kl_loss"] > 0
    batch = RolloutBatch.load(dump.format(rollout_id=0))
    assert gradient_error([a for a in argv if a != "--colocate"], batch.samples) < 1e-5  # the helper places no engines


@pytest.mark.slow
def test_colocated_engines_sleep_while_training_and_restart(ray_cluster, tiny_qwen2, arith_files, small_eval, tmp_path):
    """Driven through the components the loop uses: engines are asleep (no weights) once a
    rollout is sampled, awake with the trainer's exact weights after the sync; an engine
    re-created by ``restart_engine`` (the seam) gets the current weights and samples."""
    from rlvr.runtime.loop import build

    cfg = parse_config(ray_args(tiny_qwen2, arith_files[0], small_eval, tmp_path / "run") + ["--colocate"])
    with build(cfg) as c:
        assert c.rollout.health() == [True, True]
        batch = c.rollout.generate(0)
        assert c.rollout.health() == [False, False]  # asleep while the ranks train
        c.trainer.train(0, batch.samples)
        c.rollout.update_weights(c.trainer.weights(), version=1)
        assert c.rollout.health() == [True, True]
        assert len(set(c.rollout.last_checksums)) == 1 and None not in c.rollout.last_checksums
        c.rollout.restart_engine(1)
        assert c.rollout.health() == [True, True]
        assert {v for s in c.rollout.generate(1).samples for v in s.weight_versions} == {1}


@pytest.mark.slow
def test_broadcast_weight_sync_streams_buckets_to_every_engine(ray_cluster, tiny_qwen2, arith_files, small_eval,
                                                               tmp_path):
    """--weight-sync broadcast (gloo here, NCCL between GPUs): rank 0 and both engines form their own
    group; every push arrives bucket by bucket (4 KiB buckets: many) and every engine's checksum
    equals the trainer's (--check-weight-update-equal, else the run stops); a re-created engine
    could not join, so restarting one is refused."""
    from rlvr.runtime.loop import build

    out = tmp_path / "run"
    argv = ray_args(tiny_qwen2, arith_files[0], small_eval, out) + ["--weight-sync", "broadcast",
                                                                    "--update-weight-buffer-size", "4096"]
    assert main(["train", *argv]) == 0
    assert_finished(out)
    cfg = parse_config(argv)
    with build(cfg) as c:
        batch = c.rollout.generate(0)
        c.trainer.train(0, batch.samples)
        c.rollout.update_weights(c.trainer.weights(), version=1)
        sums = c.rollout.last_checksums
        assert len(sums) == 2 and len(set(sums)) == 1 and None not in sums
        assert {v for s in c.rollout.generate(1).samples for v in s.weight_versions} == {1}
        with pytest.raises(Exception, match="cannot join the broadcast group"):
            c.rollout.restart_engine(0)


@pytest.mark.slow
def test_fsdp(ray_cluster, tiny_qwen2, arith_files, small_eval, tmp_path):
    out, dump = tmp_path / "run", str(tmp_path / "dump" / "rollout_{rollout_id}.pt")
    argv = ray_args(tiny_qwen2, arith_files[0], small_eval, out) + ["--train-backend", "fsdp"]
    assert main(["train", *argv, "--save-debug-rollout-data", dump]) == 0
    assert_finished(out)
    batch = RolloutBatch.load(dump.format(rollout_id=0))
    assert gradient_error(argv, batch.samples) < 1e-5


@pytest.mark.slow
def test_actor_failure_stops_the_run_with_its_traceback(ray_cluster, tiny_qwen2, arith_files, small_eval, tmp_path):
    """A checkpoint the driver can read (config, tokenizer) but the actors cannot (corrupt
    weights): the run stops with the actor's error, and its actors are gone."""
    broken = tmp_path / "broken"
    shutil.copytree(tiny_qwen2, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(Exception) as info:
        from rlvr.runtime.loop import run

        run(parse_config(ray_args(broken, arith_files[0], small_eval, tmp_path / "run")), console=False)
    assert "safetensors" in str(info.value).lower() or "header" in str(info.value).lower()
    for _ in range(50):  # ray.kill is asynchronous: the bundles come back within moments
        if ray.available_resources().get("CPU") == ray.cluster_resources()["CPU"]:
            break
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == ray.cluster_resources()["CPU"]  # actors and bundles released


def test_ray_flags_validated(tiny_qwen2, arith_files):
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0]),
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "3"]
    cases = [
        (["--train-backend", "fsdp"], "--train-backend", "only acts with --ray"),
        (["--ray", "--actor-num-cpu-workers-per-node", "4"], "--global-batch-size", "split evenly across 4"),
        (["--ray", "--advantage-estimator", "ppo", "--n-samples-per-prompt", "2"], "--advantage-estimator", "critic"),
        (["--ray", "--rollout-external-engine-addrs", "127.0.0.1:30000"], "--rollout-external-engine-addrs", "local mode"),
        (["--ray", "--debug-rollout-only", "--colocate"], "--debug-rollout-only", "--colocate"),
        (["--ray", "--colocate", "--weight-sync", "broadcast"], "--weight-sync", "--colocate does not allow"),
        (["--ray", "--async", "--weight-sync", "broadcast"], "--weight-sync", "--async does not allow"),
        (["--weight-sync", "broadcast"], "--weight-sync", "only acts with --ray"),
        (["--update-weight-buffer-size", "1024"], "--update-weight-buffer-size", "only acts with --ray"),
        (["--ray", "--actor-num-cpu-workers-per-node", "1", "--train-backend", "fsdp", "--lora-rank", "4",
          "--use-kl-loss", "--kl-loss-type", "token_level_kl"], "--kl-loss-type", "keeps sharded"),
    ]
    for extra, flag, text in cases:
        with pytest.raises(ConfigError) as info:
            parse_config(base + extra)
        assert info.value.flag == flag and text in str(info.value), (extra, str(info.value))
    # auto: the object store for CPU engines (broadcast for disaggregated GPU engines)
    assert parse_config(base + ["--ray", "--rollout-num-engines", "1"]).cluster.weight_sync == "object_store"
    gpu = parse_config(base + ["--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "1"])
    assert gpu.cluster.weight_sync == "broadcast"
    assert parse_config(base + ["--actor-num-gpus-per-node", "1", "--colocate"]).cluster.weight_sync == "object_store"


def test_weight_checksum_is_bit_exact():
    from rlvr.distributed.weight_sync import checksum

    w = {"a": torch.randn(3, 4), "b": torch.arange(5)}
    assert checksum(w) == checksum({k: v.clone() for k, v in w.items()})
    w2 = dict(w, a=w["a"].clone())
    w2["a"][1, 2] = torch.nextafter(w2["a"][1, 2], torch.tensor(1e9))
    assert checksum(w) != checksum(w2)


def test_a_local_cluster_runs_its_actors_at_the_drivers_priority(tiny_qwen2, arith_files, tmp_path):
    """The cluster ``rlvr.distributed.placement.start`` starts (in a fresh process: this module's
    Ray is already up) runs its workers at the driver's niceness, not 15 above it (Ray's default),
    at which any other busy process on the machine takes the CPU from the trainer and the engines."""
    import subprocess
    import sys

    code = ("import os, sys, ray\n"
            "from rlvr.runtime.configure import parse_config\n"
            "from rlvr.distributed.placement import plan, start\n"
            "cfg = parse_config(sys.argv[1:])\n"
            "assert start(cfg.cluster, plan(cfg.cluster, 1)), 'start did not start a local cluster'\n"
            "niceness = ray.get(ray.remote(lambda: os.nice(0)).remote())\n"
            "ray.shutdown()\n"
            "print('worker niceness', niceness)\n")
    argv = ray_args(tiny_qwen2, *arith_files, tmp_path / "run")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == f"worker niceness {os.nice(0)}"
