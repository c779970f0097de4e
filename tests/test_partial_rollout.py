"""Abort at the end of a rollout, the partial-rollout buffer, and off-policy masking."""

from __future__ import annotations

import threading
import time

import torch

from rlvr.config import RolloutConfig
from rlvr.data.dataset import DataSource, PromptRecord
from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.local.embedded import EmbeddedEngine
from rlvr.runtime.build import load_tokenizer
from rlvr.rewards import Grader, RewardConfig
from rlvr.rollout.rollout import Rollout
from rlvr.core.types import Sample, Status
from transformers import AutoModelForCausalLM


def _rollout(tiny_qwen2, engine, n_records=8, **cfg_kw):
    tok = load_tokenizer(str(tiny_qwen2))
    records = [PromptRecord(prompt=f"{i}+{i}=", label=str(2 * i), metadata={}, index=i) for i in range(n_records)]
    cfg = RolloutConfig(n_samples_per_prompt=2, **cfg_kw)
    return Rollout(cfg, engine, tok, DataSource(records, shuffle=False), Grader(RewardConfig())), tok


def _aborted_group(rollout, engine, record_text: str, max_len: int) -> list[Sample]:
    """A group of 2 samples aborted by the real engine after >= 5 decode steps."""
    tok = rollout.tokenizer
    ids = tok(record_text, add_special_tokens=False)["input_ids"]
    box = {}
    reqs = [GenerateRequest(ids, SamplingParams(max_new_tokens=max_len))] * 2
    t = threading.Thread(target=lambda: box.setdefault("r", engine.generate_sync(reqs)))
    t.start()
    while engine.steps < 5:
        time.sleep(0.001)
    engine.abort()
    t.join(30)
    group = [Sample(prompt=record_text, prompt_ids=list(ids), label="x", index=j) for j in range(2)]
    for s, r in zip(group, box["r"]):
        rollout._fill(s, r)
    assert all(s.status == Status.ABORTED and 0 < s.response_length < max_len for s in group)
    return group


def test_partial_samples_resume_next_rollout_with_older_tokens_masked(tiny_qwen2):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()
    engine = EmbeddedEngine(model, pad_token_id=0, seed=1)
    rollout, tok = _rollout(tiny_qwen2, engine, rollout_batch_size=2, rollout_max_response_len=300,
                            partial_rollout=True, mask_offpolicy_in_partial_rollout=True)
    group = _aborted_group(rollout, engine, "40+2=", max_len=300)
    old = [(list(s.response_ids), list(s.rollout_log_probs)) for s in group]
    rollout.data_source.add_partial([group])

    new_model = AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()  # the policy moves on
    with torch.no_grad():
        for p in new_model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    rollout.update_weights(dict(new_model.named_parameters()), version=1)
    batch = rollout.generate(1)

    resumed = batch.samples[:2]  # buffered groups come first
    assert batch.metrics["rollout/partial_rollout/resumed"] == 2.0 and not rollout.data_source.buffer
    for s, (old_ids, old_lp) in zip(resumed, old):
        k = len(old_ids)
        assert s.prompt == "40+2=" and s.response_ids[:k] == old_ids and s.rollout_log_probs[:k] == old_lp
        assert s.response_length > k and s.status in (Status.COMPLETED, Status.TRUNCATED)
        assert s.loss_mask == [0] * k + [1] * (s.response_length - k)  # older policy's tokens masked
        assert s.weight_versions == [0] * k + [1] * (s.response_length - k)
        assert s.response_length <= 300 and s.reward is not None
        # the continuation was sampled by the new policy, conditioned on the old prefix
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        with torch.no_grad():
            logp = new_model(input_ids=ids).logits[0, :-1].log_softmax(-1)
        p = len(s.prompt_ids)
        ref = logp[p + k - 1 :].gather(-1, ids[0, p + k :, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(s.rollout_log_probs[k:]), ref, atol=1e-4, rtol=0)
    assert all(s.loss_mask == [1] * s.response_length for s in batch.samples[2:])  # fresh samples


def test_without_masking_resumed_tokens_are_all_trained(tiny_qwen2):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()
    engine = EmbeddedEngine(model, pad_token_id=0, seed=2)
    rollout, _ = _rollout(tiny_qwen2, engine, rollout_batch_size=1, rollout_max_response_len=300, partial_rollout=True)
    group = _aborted_group(rollout, engine, "3+4=", max_len=300)
    rollout.data_source.add_partial([group])
    s = rollout.generate(0).samples[0]
    assert s.loss_mask == [1] * s.response_length and s.metadata["partial_rollout_resumes"] == 1


def test_groups_in_flight_are_aborted_once_enough_are_kept_and_buffered(tiny_qwen2):
    """Over-sampling: 4 groups submitted for 2 kept; the engine runs 2 groups at a time, so the
    other 2 are still in flight when the batch is full: they are aborted and go to the buffer."""
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()
    engine = EmbeddedEngine(model, pad_token_id=0, seed=3, max_batch_size=4)
    rollout, _ = _rollout(tiny_qwen2, engine, rollout_batch_size=2, over_sampling_batch_size=4,
                          rollout_max_response_len=40, partial_rollout=True)
    batch = rollout.generate(0)
    assert len(batch.samples) == 4 and all(s.status != Status.ABORTED for s in batch.samples)
    buffered = rollout.data_source.buffer
    n_aborted = sum(s.status == Status.ABORTED for g in buffered for s in g)
    assert len(buffered) == 2 and batch.metrics["rollout/aborted"] == n_aborted >= 2
    assert all(any(s.status == Status.ABORTED for s in g) for g in buffered)  # (a sample may have hit EOS)
    assert all(s.reward is None for g in buffered for s in g)  # unfinished groups are not graded
    assert {g[0].prompt for g in buffered}.isdisjoint({s.prompt for s in batch.samples})
    # the buffer is part of the data source's checkpoint state
    import io

    import torch

    from rlvr.data.dataset import DataSource

    saved = io.BytesIO()
    torch.save(rollout.data_source.state_dict(), saved)
    restored = DataSource(rollout.data_source.records)
    restored.load_state_dict(torch.load(io.BytesIO(saved.getvalue()), weights_only=True))
    assert restored.buffer == buffered and restored.offset == rollout.data_source.offset
    # next rollout continues them first, and again aborts what is left in flight
    prompts = [g[0].prompt for g in buffered]
    batch = rollout.generate(1)
    assert batch.metrics["rollout/partial_rollout/resumed"] == n_aborted
    later = {s.prompt for s in batch.samples} | {g[0].prompt for g in rollout.data_source.buffer}
    assert set(prompts) <= later  # each resumed group is in the batch or back in the buffer, never lost
    assert all(s.status != Status.ABORTED and s.reward is not None for s in batch.samples)


def test_without_partial_rollout_aborted_groups_are_dropped(tiny_qwen2):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()
    engine = EmbeddedEngine(model, pad_token_id=0, seed=3, max_batch_size=4)
    rollout, _ = _rollout(tiny_qwen2, engine, rollout_batch_size=2, over_sampling_batch_size=4,
                          rollout_max_response_len=40)
    batch = rollout.generate(0)
    assert len(batch.samples) == 4 and not rollout.data_source.buffer and batch.metrics["rollout/aborted"] >= 2
