"""Devices on this CPU-only machine: what ``--device`` resolves to, slime's GPU launch
flags parsed as written and refused at start for lack of GPUs, every combination that cannot work
refused with its flag, the engine's KV budget (``--sglang-mem-fraction-static``), and the local
loop through the device code with ``--device cpu --colocate --offload-train``."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.entrypoints.cli import main
from rlvr.runtime.configure import parse_config
from rlvr.core.device import resolve
from rlvr.engine.local import kv
from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.local.embedded import EmbeddedEngine, kv_budget_from_fraction
from rlvr.core.errors import ConfigError

SERIAL_GROUP = "ray"  # one xdist worker for the group's modules (tests/conftest.py)

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine's messages")


def base(tiny_qwen2, arith_files) -> list[str]:
    return ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0]),
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "4"]


SEED_000_GPU_FLAGS = ["--actor-num-gpus-per-node", "4", "--rollout-num-gpus-per-engine", "1", "--colocate",
                      "--sglang-mem-fraction-static", "0.7"]


def test_seed_000_gpu_flags_parse_as_written_and_mean_ray(tiny_qwen2, arith_files):
    cfg = parse_config(base(tiny_qwen2, arith_files) + SEED_000_GPU_FLAGS)
    c = cfg.cluster
    assert c.ray and c.colocate  # slime's GPU counts imply a Ray cluster
    assert (c.train_world_size, c.num_engines(cfg.engine.rollout_num_engines)) == (4, 4)
    assert cfg.engine.sglang_mem_fraction_static == 0.7


@no_cuda
def test_seed_000_gpu_flags_on_a_machine_without_gpus_say_so(tiny_qwen2, arith_files, capsys, tmp_path):
    pytest.importorskip("ray")
    argv = ["train", *base(tiny_qwen2, arith_files), *SEED_000_GPU_FLAGS, "--output-dir", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert ("--actor-num-gpus-per-node: --actor-num-gpus-per-node 4 x --actor-num-nodes 1 (4 training ranks, "
            "engines colocated on their GPUs) asks for 4 GPUs; this machine has 0") in err, err
    import ray

    assert not ray.is_initialized()  # refused before any cluster started


@no_cuda
def test_device_resolution_on_cpu():
    assert resolve("cpu") == resolve("auto") == torch.device("cpu")
    for spec in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError, match=f"--device: {spec}: this machine has no CUDA device"):
            resolve(spec)


IMPOSSIBLE = [
    (["--device", "gpu"], "--device", "not a device"),
    (["--offload-train"], "--offload-train", "add --colocate"),
    (["--ray", "--colocate", "--offload-train", "--train-backend", "fsdp"], "--offload-train", "FSDP2"),
    (["--ray", "--rollout-num-gpus", "2", "--rollout-num-gpus-per-engine", "2"], "--rollout-num-gpus-per-engine",
     "tensor-parallel engines are out of scope"),
    (["--actor-num-gpus-per-node", "2", "--device", "cpu"], "--device", "every actor computes on its bundle's device"),
    (["--ray", "--device", "cuda"], "--device", "every actor computes on its bundle's device"),
    (["--actor-num-gpus-per-node", "2", "--colocate", "--rollout-num-gpus", "4"], "--rollout-num-gpus",
     "share the training ranks' 2 GPU bundles"),
    (["--ray", "--colocate", "--rollout-num-gpus", "2"], "--rollout-num-gpus", "share the training ranks' 1 CPU bundles"),
    (["--colocate", "--rollout-external-engine-addrs", "127.0.0.1:30000"], "--rollout-external-engine-addrs",
     "keeps its own memory"),
    (["--colocate", "--rollout-num-engines", "2"], "--rollout-num-engines", "keep their own memory"),
    (["--colocate", "--async"], "--async", "cannot time-share the device"),
    (["--colocate", "--update-weights-interval", "2"], "--update-weights-interval", "reloaded after every step"),
    (["--colocate", "--debug-rollout-only"], "--debug-rollout-only", "nothing to time-share"),
    (["--sglang-mem-fraction-static", "0.5", "--rollout-external-engine-addrs", "127.0.0.1:30000"],
     "--sglang-mem-fraction-static", "set it on those servers"),
    (["--sglang-mem-fraction-static", "1.5"], "--sglang-mem-fraction-static", "must be in (0, 1]"),
]


@pytest.mark.parametrize("extra,flag,text", IMPOSSIBLE, ids=[" ".join(c[0]) for c in IMPOSSIBLE])
def test_impossible_combinations_are_refused(tiny_qwen2, arith_files, extra, flag, text):
    with pytest.raises(ConfigError) as info:
        parse_config(base(tiny_qwen2, arith_files) + extra)
    assert info.value.flag == flag and text in str(info.value), str(info.value)


# ---- the engine's KV budget ----------------------------------------------------------------
@pytest.fixture(scope="module")
def model_and_tok(tiny_qwen2):
    return AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval(), AutoTokenizer.from_pretrained(tiny_qwen2)


def _requests(n: int, max_new: int = 6) -> list[GenerateRequest]:
    return [GenerateRequest([5, 6, 7, 8], SamplingParams(temperature=1.0, max_new_tokens=max_new, stop_token_ids=()),
                            rid=f"r{i}") for i in range(n)]


def test_kv_budget_limits_the_rows_running_together(model_and_tok):
    model, tok = model_and_tok
    per_token = kv.bytes_per_token(model, torch.device("cpu"))
    # 2 (layers) x (k + v) x 1 kv head x 32 head dim x 4 bytes: the SMALL tiny model
    assert per_token == 2 * 2 * 1 * 32 * 4
    width = 4 + 6  # prompt + max new tokens
    budget = kv.footprint([width] * 3, per_token)  # room for exactly 3 rows
    eng = EmbeddedEngine(model, pad_token_id=tok.pad_token_id, seed=0, max_batch_size=8, kv_budget_bytes=budget)
    free = EmbeddedEngine(model, pad_token_id=tok.pad_token_id, seed=0, max_batch_size=8)
    try:
        out = eng.generate_sync(_requests(8))
        assert [r.finish_reason for r in out] == ["length"] * 8
        assert eng.peak_running == 3
        free.generate_sync(_requests(8))
        assert free.peak_running == 8
    finally:
        eng.close()
        free.close()


def test_a_request_over_the_kv_budget_ends_with_an_error_others_go_on(model_and_tok):
    model, tok = model_and_tok
    per_token = kv.bytes_per_token(model, torch.device("cpu"))
    eng = EmbeddedEngine(model, pad_token_id=tok.pad_token_id, seed=0, kv_budget_bytes=kv.footprint([10], per_token))
    try:
        big, small = _requests(1, max_new=50)[0], _requests(1, max_new=6)[0]
        small.rid = "small"
        out = eng.generate_sync([big, small])
        assert out[0].finish_reason == "error" and "raise --sglang-mem-fraction-static" in out[0].meta["error"]
        assert out[1].finish_reason == "length" and len(out[1].token_ids) == 6
    finally:
        eng.close()


def test_mem_fraction_is_of_host_memory_on_cpu(model_and_tok):
    model, _ = model_and_tok
    from rlvr.core.device import module_bytes, total_memory_bytes

    total = total_memory_bytes(torch.device("cpu"))
    assert kv_budget_from_fraction(0.5, model, torch.device("cpu")) == int(0.5 * total) - module_bytes(model)
    with pytest.raises(ValueError, match="--sglang-mem-fraction-static 1e-12: .* cannot hold the engine's weights"):
        kv_budget_from_fraction(1e-12, model, torch.device("cpu"))


# ---- the local loop through the device code ----------------------------------------------------
def test_local_loop_on_device_cpu_colocated_with_offload(tiny_qwen2, arith_files, tmp_path):
    out = tmp_path / "run"
    argv = ["train", *base(tiny_qwen2, arith_files), "--num-rollout", "2", "--lr", "1e-3", "--device", "cpu",
            "--colocate", "--offload-train", "--sglang-mem-fraction-static", "0.5", "--bf16",
            "--eval-prompt-data", "t", str(arith_files[1]), "--n-samples-per-eval-prompt", "1",
            "--output-dir", str(out)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/step" in r]
    assert [r["rollout/step"] for r in steps] == [0, 1]
    for r in steps:  # each phase's peak, measured on the device (here: the process's resident set)
        assert r["perf/rollout_peak_memory_gb"] > 0 and r["perf/peak_memory_gb"] > 0
    assert [r["eval/step"] for r in rows if "eval/step" in r] == [0, 2]


def test_every_tensor_of_the_engine_and_trainer_names_its_device(tiny_qwen2):
    """Device discipline without a GPU: with the default device set to ``meta`` (in this thread
    and in the engine's worker), any tensor made without an explicit device would be a meta
    tensor and the run would fail on its first use. Sampling, a training step with a KL term
    (reference model), weight sync and sleep/wake all run: every tensor is made on the run's
    device or, on purpose, on the host."""
    from rlvr.algo import AlgoConfig
    from rlvr.config import TrainConfig
    from rlvr.train.trainer import Trainer
    from rlvr.core.types import Sample

    tr = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), bf16=True), AlgoConfig(use_kl_loss=True, kl_loss_coef=0.01),
                 n_samples_per_prompt=4, global_batch_size=4, device="cpu")
    eng = EmbeddedEngine(tr.model, pad_token_id=0, seed=0, kv_budget_bytes=1 << 24)
    worker = eng._run
    eng._run = lambda: (torch.set_default_device("meta"), worker())  # the worker thread's default too
    reqs = [GenerateRequest([5, 6, 7], SamplingParams(temperature=1.0, top_p=0.9, top_k=5, max_new_tokens=5,
                                                      stop_token_ids=()), rid=str(i)) for i in range(8)]
    torch.set_default_device("meta")
    try:
        out = eng.generate_sync(reqs)
        assert [r.finish_reason for r in out] == ["length"] * 8, out[0].meta
        samples = [Sample("", [5, 6, 7], response_ids=r.token_ids, loss_mask=[1] * 5, rollout_log_probs=r.log_probs,
                          reward=float(i % 2), index=i) for i, r in enumerate(out)]
        metrics = tr.train(0, samples)
        assert metrics["train/grad_norm"] > 0
        eng.sleep()
        eng.wake()
        eng.update_weights(tr.weights(), 1)
        assert [r.finish_reason for r in eng.generate_sync(reqs[:2])] == ["length"] * 2
    finally:
        torch.set_default_device(None)
        eng.close()


def test_colocated_hands_the_device_back_and_forth(tiny_qwen2):
    """Local --colocate's hand-offs: training puts the engine to sleep; handing the weights over
    frees the trainer's gradients, moves AdamW's state to the host and wakes the engine."""
    from rlvr.algo import AlgoConfig
    from rlvr.runtime.colocate import Colocated
    from rlvr.config import TrainConfig
    from rlvr.train.trainer import Trainer
    from rlvr.core.types import Sample

    tr = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), lr=1e-2), AlgoConfig(), n_samples_per_prompt=4,
                 device="cpu")
    eng = EmbeddedEngine(tr.model, pad_token_id=0, seed=0)
    both = Colocated(tr, eng, offload_optimizer=True)
    try:
        out = eng.generate_sync(_requests(4))
        samples = [Sample("", [5, 6, 7, 8], response_ids=r.token_ids, loss_mask=[1] * 6, rollout_log_probs=r.log_probs,
                          reward=float(i % 2), index=i) for i, r in enumerate(out)]
        metrics = both.train(0, samples)
        assert not eng.health()  # asleep while the trainer stepped
        assert metrics["perf/rollout_peak_memory_gb"] > 0 and both.step == tr.step == 1
        assert any(p.grad is not None for p in tr.model.parameters())
        weights = both.weights()
        assert eng.health() and all(p.grad is None for p in tr.model.parameters())
        assert tr.optimizer.adamw.state and all(v.device.type == "cpu" for st in tr.optimizer.adamw.state.values()
                                          for v in st.values() if isinstance(v, torch.Tensor))
        eng.update_weights(weights, 1)
        assert [r.finish_reason for r in eng.generate_sync(_requests(2))] == ["length"] * 2
        assert all(torch.equal(weights[n], p) for n, p in eng.model.named_parameters())
    finally:
        eng.close()
