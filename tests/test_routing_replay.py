"""R3, rollout routing replay: the engine records the experts, the trainer replays them."""

import json
from pathlib import Path

import pytest
import torch

from rlvr.entrypoints.cli import main
from rlvr.config import TrainConfig
from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.local.embedded import EmbeddedEngine
from rlvr.core.errors import ConfigError
from rlvr.runtime.configure import check_train
from rlvr.models.moe import RoutingRecorder, RoutingReplay
from rlvr.models.tiny import build_tiny_model
from rlvr.train import routing_replay
from rlvr.train.logprobs import response_log_probs
from rlvr.train.trainer import load_policy
from rlvr.core.types import Sample

from conftest import SMALL


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_moe"), arch="qwen3_moe", **SMALL,
                            num_experts=16, num_experts_per_tok=2)


def _rollout(model, dtype, n=8, new=24) -> list[Sample]:
    engine = EmbeddedEngine(model, pad_token_id=256, seed=0, return_routed_experts=True, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    reqs = [GenerateRequest(torch.randint(0, 250, (4 + i % 3,), generator=g).tolist(), SamplingParams(max_new_tokens=new))
            for i in range(n)]
    try:
        results = engine.generate_sync(reqs)
    finally:
        engine.close()
    return [Sample("", q.prompt_ids, response_ids=r.token_ids, rollout_log_probs=r.log_probs,
                   loss_mask=[1] * len(r.token_ids), rollout_routed_experts=r.routed_experts, index=i)
            for i, (q, r) in enumerate(zip(reqs, results))]


def test_replaying_the_models_own_choice_changes_nothing(tiny_moe):
    # The gate rule is the family's own: replaying what the router would choose anyway gives the
    # same logits bit for bit; replaying other experts changes them.
    model = load_policy(str(tiny_moe), False)
    ids = torch.randint(0, 250, (2, 7))
    recorder = RoutingRecorder(model)
    with torch.no_grad():
        own = model(ids).logits
    chosen = recorder.take()
    recorder.remove()
    assert chosen.shape == (14, 2, 2) and chosen.dtype == torch.uint8
    replay = RoutingReplay(model)
    replay.plan = chosen.long()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, own)
    assert replay.counts() == (28, 0)
    replay.plan = (chosen.long() + 1) % 16
    with torch.no_grad():
        assert (model(ids).logits - own).abs().max() > 1e-4


def test_gates_and_experts_receive_gradient_under_replay(tiny_moe):
    model = load_policy(str(tiny_moe), False)
    ids = torch.randint(0, 250, (1, 9))
    replay = RoutingReplay(model)
    replay.plan = torch.stack([torch.tensor([3, 11])] * 2).expand(9, 2, 2).clone()  # experts 3, 11 everywhere
    model(ids).logits.logsumexp(-1).sum().backward()
    for layer in model.model.layers:
        gate, experts = layer.mlp.gate.weight.grad, layer.mlp.experts.gate_up_proj.grad
        assert gate is not None and torch.isfinite(gate).all() and gate.abs().sum() > 0
        # only the replayed experts computed, so only they (and all router rows, via the softmax) get gradient
        used = experts.flatten(1).abs().sum(-1) > 0
        assert used.nonzero().flatten().tolist() == [3, 11]
        assert (gate.abs().sum(-1) > 0).all()


def test_engine_records_every_position_and_replay_removes_the_disagreement(tiny_moe):
    # Engine in bfloat16, trainer in float32: routers disagree on a few (token, layer) pairs
    # unless the trainer replays the engine's experts.
    model = load_policy(str(tiny_moe), False)
    samples = _rollout(model, torch.bfloat16)
    for s in samples:
        assert s.rollout_routed_experts.shape == (s.total_length - 1, 2, 2)
    assert routing_replay.storage_bytes(samples) == sum(s.total_length - 1 for s in samples) * 2 * 2
    width = max(s.response_length for s in samples)
    replay = routing_replay.install(model)[0]
    used = RoutingRecorder(model)  # after the replay hook: the experts the trainer really runs
    differ = {}
    for replay.replay in (False, True):
        with torch.no_grad():
            response_log_probs(model, samples, 1.0, width, False)
        replay.counts()
        got = used.take().long().sort(-1).values
        differ[replay.replay] = float((got != replay.plan.sort(-1).values).any(-1).float().mean())
    assert differ[False] > 0 and differ[True] == 0


def test_engine_in_the_same_precision_agrees_and_the_shared_prompt_matches(tiny_moe):
    model = load_policy(str(tiny_moe), False)
    samples = _rollout(model, None, n=4, new=8)
    replay = routing_replay.install(model)[0]
    replay.replay = False
    width = max(s.response_length for s in samples)
    for layout in (dict(), dict(packed=False)):
        with torch.no_grad():
            response_log_probs(model, samples, 1.0, width, False, **layout)
        pairs, differing = replay.counts()
        assert pairs > 0 and differing == 0


def test_dense_model_is_refused(tiny_qwen2, tiny_moe):
    with pytest.raises(ConfigError, match="--use-rollout-routing-replay.*dense"):
        check_train(TrainConfig(hf_checkpoint=str(tiny_qwen2), use_rollout_routing_replay=True))
    check_train(TrainConfig(hf_checkpoint=str(tiny_moe), use_rollout_routing_replay=True))
    with pytest.raises(ValueError, match="dense model"):
        RoutingReplay(load_policy(str(tiny_qwen2), False))
    with pytest.raises(ValueError, match="--enable-return-routed-experts.*dense"):
        EmbeddedEngine(str(tiny_qwen2), pad_token_id=256, return_routed_experts=True)


def test_sample_without_routing_is_refused_by_name(tiny_moe):
    model = load_policy(str(tiny_moe), False)
    routing_replay.install(model)
    s = Sample("", [1, 2, 3], response_ids=[4, 5], loss_mask=[1, 1], rollout_log_probs=[-1.0, -1.0], uid="7/0")
    with pytest.raises(ValueError, match="sample 7/0 carries routed experts None"):
        response_log_probs(model, [s], 1.0, 2, False)


def test_two_rollouts_with_routing_replay(tiny_moe, arith_files, tmp_path):
    out = tmp_path / "r3"
    code = main(["train", "--hf-checkpoint", str(tiny_moe), "--prompt-data", str(arith_files[0]),
                 "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "6",
                 "--num-rollout", "2", "--output-dir", str(out), "--no-use-tensorboard",
                 "--use-rollout-routing-replay", "--use-tis"])
    assert code == 0
    train = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"train/step"' in x]
    assert [r["train/step"] for r in train] == [1, 2]
    for r in train:  # same precision: the trainer's own routing agrees with the engine's
        assert r["train/routing_replay_differ_frac"] == 0.0 and r["train/routing_replay_bytes"] > 0


def test_routed_experts_over_http(tiny_moe):
    # rlvr serve's /generate returns them as SGLang does (base64 int32); HttpEngine carries them.
    # The same path carries score centering's sampler head (top_logprobs_num).
    import asyncio
    import socket
    import threading

    from aiohttp import web

    from rlvr.data.tokenizer import load_tokenizer
    from rlvr.engine.remote.client import HttpEngine
    from rlvr.engine.serving.routes import Server

    tokenizer = load_tokenizer(str(tiny_moe))
    engine = EmbeddedEngine(str(tiny_moe), pad_token_id=256, return_routed_experts=True, tokenizer=tokenizer)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(Server(engine, tokenizer, "moe").app())

    async def start():
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    threading.Thread(target=loop.run_forever, daemon=True).start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        req = GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=5, seed=3))
        (res,) = asyncio.run(HttpEngine([f"127.0.0.1:{port}"], routed_experts_top_k=2).generate([req]))
        (direct,) = engine.generate_sync([req])
        assert res.token_ids == direct.token_ids
        assert res.routed_experts.shape == (3 + len(res.token_ids) - 1, 2, 2)
        assert torch.equal(res.routed_experts, direct.routed_experts)
        (plain,) = asyncio.run(HttpEngine([f"127.0.0.1:{port}"]).generate([req]))
        assert plain.routed_experts is None
        # score centering's head travels as SGLang's output_top_logprobs
        head = GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=4, seed=3, top_logprobs_num=3))
        (res,) = asyncio.run(HttpEngine([f"127.0.0.1:{port}"]).generate([head]))
        (direct,) = engine.generate_sync([head])
        assert res.top_token_ids == direct.top_token_ids and len(res.top_token_ids) == len(res.token_ids)
        torch.testing.assert_close(torch.tensor(res.top_log_probs), torch.tensor(direct.top_log_probs))
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        engine.close()


def test_sft_refuses_routing_replay(tiny_moe, arith_files, capsys):
    code = main(["sft", "--hf-checkpoint", str(tiny_moe), "--prompt-data", str(arith_files[0]),
                 "--use-rollout-routing-replay"])
    assert code == 2 and "--use-rollout-routing-replay" in capsys.readouterr().err


@pytest.mark.parametrize("model_type,extra", [
    ("qwen2_moe", dict(num_experts=8, num_experts_per_tok=2, shared_expert_intermediate_size=64)),
                                              ("mixtral", dict(num_local_experts=8, num_experts_per_tok=2)),
                                              ("olmoe", dict(num_experts=8, num_experts_per_tok=2))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_registered_gate_rule_is_the_familys_own(model_type, extra, dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, moe_intermediate_size=32, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    ids = torch.randint(0, 64, (2, 5))
    recorder = RoutingRecorder(model)
    with torch.no_grad():
        own = model(ids).logits
    replay = RoutingReplay(model)
    replay.plan = recorder.take().long()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, own)
