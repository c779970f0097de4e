"""GPU placement on a real Ray cluster with 4 *logical* GPUs (this machine has none): which actor
gets which bundle and GPU id, colocated engines sharing their rank's GPU, the process-group
backend, a GPU shortage refused naming the flags, and the whole loop through GPU bundles. The
test-only seam ``RLVR_TEST_LOGICAL_GPUS`` (``rlvr.core.testing.logical_gpus``) keeps the compute on
CPU (gloo); with real GPUs the same actors compute on ``cuda`` with NCCL
(``rlvr.core.device.for_actor`` / ``process_group_backend``)."""

from __future__ import annotations

import json
import os

import pytest

from rlvr.entrypoints.cli import main
from rlvr.runtime.configure import parse_config
from rlvr.core.errors import ConfigError
from rlvr.core.testing import LOGICAL_GPUS_ENV

SERIAL_GROUP = "ray"  # one xdist worker for the group's modules (tests/conftest.py)

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def logical_gpus():
    from rlvr.distributed.placement import ACTOR_ENV, LOCAL_RAY_SYSTEM_CONFIG

    os.environ[LOGICAL_GPUS_ENV] = "4"
    ray.init(num_cpus=6, num_gpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": dict(ACTOR_ENV) | {LOGICAL_GPUS_ENV: "4"}},
             _system_config=dict(LOCAL_RAY_SYSTEM_CONFIG))
    yield
    ray.shutdown()
    del os.environ[LOGICAL_GPUS_ENV]


def _args(tiny_qwen2, arith_files, *extra: str) -> list[str]:
    return ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0]), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--rollout-max-response-len", "4", "--num-rollout", "2", "--lr", "1e-3",
            *extra]


def _placements(cfg, with_engines: bool = True) -> tuple[list[dict], list[dict]]:
    """Start the training ranks (no process group: the loop test forms one) and the engine actors
    of ``cfg`` in their bundles; where each went."""
    from ray.util.placement_group import remove_placement_group

    from rlvr.distributed.placement import placement_group, plan, start
    from rlvr.distributed.engines import make_engine_actor
    from rlvr.distributed.train_group import RayTrainer

    p = plan(cfg.cluster, cfg.cluster.num_engines(cfg.engine.rollout_num_engines))
    assert start(cfg.cluster, p) is False  # the module's cluster, checked for GPUs
    pg = placement_group(p)
    trainer = RayTrainer(cfg, pg, p, os.getcwd())
    engines = [make_engine_actor(cfg, pg, p, os.getcwd(), i) for i in range(len(p.engine_bundles) * with_engines)]
    try:
        ranks = ray.get([w.placement.remote() for w in trainer.workers])
        return ranks, ray.get([e.placement.remote() for e in engines])
    finally:
        for a in [*trainer.workers, *engines]:
            ray.kill(a)
        remove_placement_group(pg)


def test_colocated_engines_share_their_ranks_gpus(logical_gpus, tiny_qwen2, arith_files):
    cfg = parse_config(_args(tiny_qwen2, arith_files, "--actor-num-gpus-per-node", "2", "--colocate"))
    ranks, engines = _placements(cfg)
    gpus = [r["gpu_ids"] for r in ranks]
    assert all(len(g) == 1 for g in gpus) and gpus[0] != gpus[1]  # one GPU per rank, different ones
    assert [e["gpu_ids"] for e in engines] == gpus  # engine i on rank i's GPU
    for a in ranks + engines:
        assert a["cuda_visible_devices"] == a["gpu_ids"][0]  # Ray pinned the process to it
        assert a["device"] == "cpu"  # the logical-GPU seam: compute forced to CPU
    assert {r["backend"] for r in ranks} == {"gloo"}  # with the compute on CPU; NCCL on real GPUs


def test_disaggregated_engines_get_gpus_of_their_own(logical_gpus, tiny_qwen2, arith_files):
    """Engine actors load a model (slow to start here): the ranks are started, and the engines'
    GPUs are read off the placement group's reservation."""
    from rlvr.distributed.placement import plan

    cfg = parse_config(_args(tiny_qwen2, arith_files, "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2"))
    p = plan(cfg.cluster, cfg.cluster.num_engines(1))
    assert [p.engine_gpus(i) for i in range(2)] == [1.0, 1.0] and p.num_gpus == 4
    ranks, _ = _placements(cfg, with_engines=False)
    assert all(len(a["gpu_ids"]) == 1 for a in ranks) and len({a["gpu_ids"][0] for a in ranks}) == 2
    assert all(r["backend"] == "gloo" and r["device"] == "cpu" for r in ranks)


def test_more_gpus_than_the_cluster_has_is_refused(logical_gpus, tiny_qwen2, arith_files):
    from rlvr.distributed.placement import plan, start

    cfg = parse_config(_args(tiny_qwen2, arith_files, "--actor-num-gpus-per-node", "8", "--global-batch-size", "8"))
    with pytest.raises(ConfigError, match=r"asks for 8 GPUs; the Ray cluster has 4"):
        start(cfg.cluster, plan(cfg.cluster, 1))


def test_the_loop_runs_through_gpu_bundles_colocated(logical_gpus, tiny_qwen2, arith_files, tmp_path):
    out = tmp_path / "run"
    argv = _args(tiny_qwen2, arith_files, "--actor-num-gpus-per-node", "2", "--colocate", "--offload-train",
                 "--check-weight-update-equal", "--output-dir", str(out))
    assert main(["train", *argv]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/step"] for r in rows if "rollout/step" in r] == [0, 1]
    assert ray.available_resources().get("GPU") == 4  # every bundle given back
