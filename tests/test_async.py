"""Fully asynchronous training: the staleness bound, on-policy at K=0, the behaviour
log-probs of stale samples, and the config rules. Real engine, real trainer, tiny model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlvr.config import RolloutConfig

from rlvr.runtime.configure import parse_config
from rlvr.data.dataset import DataSource, PromptRecord
from rlvr.engine.local.embedded import EmbeddedEngine
from rlvr.core.errors import ConfigError
from rlvr.core.testing import RUN_SILENT_ENV
from rlvr.runtime.build import load_tokenizer
from rlvr.runtime.loop import run
from rlvr.core.types import RolloutBatch
from rlvr.observe import read_metrics
from rlvr.rewards import Grader, RewardConfig
from rlvr.rollout.pipeline import PipelinedProducer
from rlvr.rollout.producer import AsyncProducer, RolloutFunctionProducer
from rlvr.rollout.rollout import Rollout
from tests.support import check_exactly_once, read_ledger


def _args(tiny_qwen2, arith_files, out, *extra) -> list[str]:
    train, _ = arith_files
    return ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(train), "--rm-type", "math",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "16",
            "--num-rollout", "6", "--lr", "1e-3", "--output-dir", str(out), *extra]


@pytest.mark.slow
def test_max_staleness_1_bounds_every_trained_sample(tiny_qwen2, arith_files, tmp_path):
    dump = tmp_path / "dump" / "r{rollout_id}.pt"
    cfg = parse_config(_args(tiny_qwen2, arith_files, tmp_path / "run", "--async", "--max-staleness", "1",
                             "--rollout-concurrency", "8", "--save-debug-rollout-data", str(dump)))
    run_dir = run(cfg, console=False)
    rows = read_ledger(run_dir)
    trained = [r for r in rows if r["trained"]]
    # --save-debug-rollout-data keeps what the async producer made: each rollout's trained samples,
    # every token with the version that sampled it, in the order it was sampled
    for rollout_id in range(6):
        batch = RolloutBatch.load(str(dump).format(rollout_id=rollout_id))
        assert sorted(s.uid for s in batch.samples) == sorted(r["uid"] for r in trained if r["rollout_id"] == rollout_id)
        for s in batch.samples:
            assert len(s.weight_versions) == len(s.response_ids) and s.weight_versions == sorted(s.weight_versions)
    staleness = [r["rollout_id"] - r["version_min"] for r in trained]
    assert max(staleness) == 1  # the producer did run ahead (the bound is what holds it at 1) ...
    assert all(0 <= s <= 1 for s in staleness)  # ... and no trained sample is older than K
    assert all(r["staleness"] == s for r, s in zip(trained, staleness))
    check_exactly_once(rows, n=2, batch=4)
    rollouts = [r for r in read_metrics(run_dir) if "rollout/step" in r]
    assert len(rollouts) == 6 and max(r["rollout/staleness_max"] for r in rollouts) == 1
    assert all("rollout/staleness_mean" in r for r in rollouts)


LORA = ["--lora-rank", "4", "--lora-alpha", "8", "--lr", "1e-2", "--use-kl-loss", "--kl-loss-coef", "0.001"]


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_max_staleness_0_is_exactly_on_policy(tiny_qwen2, arith_files, tmp_path, lora, monkeypatch):
    """With LoRA the engine gets only the adapters after each step; on-policy its
    log-probs still equal the trainer's while the adapter has moved the policy off the base."""
    # the tiny model's rollouts may have no reward variance at all: run every sample's forward, whose numbers this checks
    monkeypatch.setenv(RUN_SILENT_ENV, "1")
    cfg = parse_config(_args(tiny_qwen2, arith_files, tmp_path / "run", "--async", "--max-staleness", "0",
                             "--rollout-concurrency", "8", *(LORA if lora else [])))
    run_dir = run(cfg, console=False)
    rows = read_ledger(run_dir)
    trained = [r for r in rows if r["trained"]]
    # every token of every trained sample was sampled by the weights being trained
    assert all(r["version_min"] == r["version_max"] == r["rollout_id"] for r in trained)
    check_exactly_once(rows, n=2, batch=4)
    records = read_metrics(run_dir)
    assert all(r["rollout/staleness_max"] == 0 for r in records if "rollout/step" in r)
    # on-policy: the trainer's p0 is the engine's q (up to float error), as in sync mode
    diffs = [r["train/train_rollout_logprob_abs_diff"] for r in records if "train/step" in r]
    assert len(diffs) == 6 and max(diffs) < 1e-3
    if lora:  # the policy moved: an engine left on the base would differ by ~sqrt(2 KL) per token
        kl = [r["train/kl_loss"] for r in records if "train/step" in r]
        print(f"async LoRA: last KL to the base {kl[-1]:.2e}, engine vs trainer |diff| {diffs[-1]:.2e}")
        assert (2 * kl[-1]) ** 0.5 > 20 * max(diffs)


@pytest.mark.slow
def test_finish_mode_samples_come_from_one_version(tiny_qwen2, arith_files, tmp_path):
    cfg = parse_config(_args(tiny_qwen2, arith_files, tmp_path / "run", "--async", "--max-staleness", "2",
                             "--rollout-concurrency", "8", "--weight-update-inflight", "finish"))
    run_dir = run(cfg, console=False)
    trained = [r for r in read_ledger(run_dir) if r["trained"]]
    assert all(r["version_min"] == r["version_max"] for r in trained)  # finished on the old weights
    assert all(r["rollout_id"] - r["version_min"] <= 2 for r in trained)


def test_stale_samples_carry_the_log_probs_of_the_weights_that_sampled_them(tiny_qwen2):
    """What the off-policy corrections (TIS/ICE-POP/OPSM) read as q: after a push, a batch trained
    at version 1 holds samples of version 0 (staleness 1); every token's log-prob equals the one
    recomputed under the weights of the version it is tagged with."""
    tok = load_tokenizer(str(tiny_qwen2))
    model0 = AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()
    model1 = AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()
    with torch.no_grad():
        for p in model1.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine = EmbeddedEngine(model0, pad_token_id=tok.pad_token_id, seed=5, max_batch_size=4)
    records = [PromptRecord(prompt=f"{i}+{i}=", label=str(2 * i), metadata={}, index=i) for i in range(64)]
    cfg = RolloutConfig(rollout_batch_size=2, n_samples_per_prompt=2, rollout_max_response_len=40)
    rollout = Rollout(cfg, engine, tok, DataSource(records, shuffle=False), Grader(RewardConfig()))
    with AsyncProducer(rollout, concurrency=4, max_staleness=1, inflight="abort") as producer:
        producer.next_batch(0)
        producer.update_weights(dict(model1.named_parameters()), version=1)
        batch = producer.next_batch(1)
        producer.update_weights(dict(model1.named_parameters()), version=2)
        later = producer.next_batch(2)
    assert batch.metrics["rollout/staleness_max"] == 1.0
    models = {0: model0, 1: model1, 2: model1}
    assert all(2 - min(s.weight_versions) <= 1 for s in later.samples)
    for s in batch.samples + later.samples:
        assert len(s.weight_versions) == len(s.rollout_log_probs) == s.response_length
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        p = len(s.prompt_ids)
        for version in set(s.weight_versions):
            with torch.no_grad():
                logp = models[version](input_ids=ids).logits[0, :-1].float().log_softmax(-1)
            ref = logp[p - 1:].gather(-1, ids[0, p:, None]).squeeze(-1)
            at = [t for t, v in enumerate(s.weight_versions) if v == version]
            torch.testing.assert_close(torch.tensor(s.rollout_log_probs)[at], ref[at], atol=2e-4, rtol=0)


def test_async_config_rules(tiny_qwen2, arith_files, tmp_path):
    base = _args(tiny_qwen2, arith_files, tmp_path / "run")
    with pytest.raises(ConfigError, match="--max-staleness"):
        parse_config(base + ["--async", "--max-staleness", "0", "--update-weights-interval", "2"])
    with pytest.raises(ConfigError, match="--async"):
        parse_config(base + ["--async", "--debug-rollout-only"])
    with pytest.raises(ConfigError, match="--use-fault-tolerance"):
        parse_config(base + ["--use-fault-tolerance", "--rollout-external-engine-addrs", "127.0.0.1:1"])
    with pytest.raises(ConfigError, match="--rollout-concurrency"):
        parse_config(base + ["--rollout-concurrency", "0"])
    with pytest.raises(ConfigError, match="--rollout-health-check-timeout"):
        parse_config(base + ["--rollout-health-check-timeout", "0"])
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("async: true\nmax-staleness: 2\n")
    cfg = parse_config(base + ["--config", str(yaml_file)])
    assert cfg.asynchronous.async_train and cfg.asynchronous.max_staleness == 2


@pytest.mark.slow
def test_async_checkpoint_keeps_untrained_groups_and_resume_trains_each_once(tiny_qwen2, arith_files, tmp_path):
    """An async checkpoint puts the groups in flight or ready back in the data source's buffer;
    a run resumed from it (the later rollouts logged by the first run are cut) re-generates them,
    and over the whole history every drawn group is trained exactly once."""
    from rlvr.runtime.checkpoint import find_checkpoint, read_run_state

    out = tmp_path / "run"
    # --max-staleness 2 admits rollout 2's groups (landing version 2) at engine version 0, so they
    # are drawn as soon as rollout 0's first group frees a slot, before the checkpoint after
    # rollout 1 whatever the machine's load. Under 1 they wait for version 1 to reach the engine,
    # which may come after that checkpoint.
    flags = ["--async", "--max-staleness", "2", "--rollout-concurrency", "8", "--save-interval", "2"]
    run(parse_config(_args(tiny_qwen2, arith_files, out, *flags, "--num-rollout", "3")), console=False)
    ckpt = out / "checkpoints" / "rollout_000002"
    buffered = {g[0]["uid"].split("/")[0] for g in read_run_state(ckpt)["data_source"]["buffer"]}
    trained_before = {r["uid"].split("/")[0] for r in read_ledger(out) if r["trained"] and r["rollout_id"] < 2}
    assert buffered and not buffered & trained_before  # pending at the checkpoint, not yet trained
    (out / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")  # as if rollout 2 crashed
    assert find_checkpoint(out / "checkpoints") == ckpt
    run(parse_config(_args(tiny_qwen2, arith_files, out, *flags, "--num-rollout", "5", "--load",
                           str(out / "checkpoints"))), console=False)
    rows = read_ledger(out)
    assert sorted({r["rollout_id"] for r in rows if r["trained"]}) == [0, 1, 2, 3, 4]
    check_exactly_once(rows, n=2, batch=4)
    assert buffered <= {r["uid"].split("/")[0] for r in rows if r["trained"] and r["rollout_id"] >= 2} | \
        {r["uid"].split("/")[0] for r in rows if not r["trained"]}


class _BrokenRollout:
    """A rollout whose every way of making samples raises, as a user's bug would."""

    cfg = SimpleNamespace(rollout_batch_size=1)

    def sampling_params(self):
        raise ZeroDivisionError("my bug")

    def generate(self, rollout_id):
        raise ZeroDivisionError("my bug")


@pytest.mark.parametrize("make,what", [
    (lambda r: AsyncProducer(r, concurrency=1, max_staleness=0), "the rollout producer failed"),
    (lambda r: RolloutFunctionProducer(r, max_staleness=0), "the rollout function failed"),
    (lambda r: PipelinedProducer(r, r.generate, max_staleness=0), "the rollout producer failed"),
], ids=["groups", "rollout-function", "pipelined"])
def test_a_producer_thread_that_fails_fails_the_trainers_next_call(make, what):
    with make(_BrokenRollout()) as source:
        with pytest.raises(RuntimeError, match=what) as raised:
            source.next_batch(0)
        assert isinstance(raised.value.__cause__, ZeroDivisionError)
        assert source.pending_groups() == []  # the failed thread is not waited for
