"""Model-family matrix: every tiny architecture of ``rlvr make-tiny-model`` trains exactly.

For each family (README, "Model families"): the trainer's packed log-probs equal the model's own
forward (transformers' default attention for it, unpacked, one sample at a time) to float32
rounding, max |diff| <= 1e-5; packed gradients equal the right-padded layout's; the embedded
engine's sampled log-probs equal the trainer's (mean |diff| <= 1e-5, max <= 1e-3, as for Qwen2 in
test_engine.py) and its greedy tokens equal HF ``generate``'s (with HF's own sliding-window
caches); and ``rlvr train`` runs 2 rollouts. Sequences are longer than the tiny sliding window
(8), and the family-specific features are checked to bite: without them the numbers move.

Weights are initialised 10x larger than transformers' default (``initializer_range=0.2``) so that
attention is far from uniform and soft-capping changes the scores; at the default scale a
forgotten attention soft-cap would move log-probs by ~6e-5 only.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlvr.entrypoints.cli import main
from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.local.embedded import EmbeddedEngine
from rlvr.models.tiny import ARCHITECTURES, TINY_WINDOW, build_tiny_model, build_tokenizer
from rlvr.train import attention
from rlvr.train.logprobs import response_log_probs
from rlvr.train.trainer import load_policy
from rlvr.core.types import Sample
from tests.conftest import SMALL, write_lines

# name -> (tiny architecture, config overrides, config fields whose removal must change log-probs)
NO_WINDOW = {"sliding_window": 10**6}
CASES = {
    "llama": ("llama", {}, {}),
    "qwen2": ("qwen2", {}, {}),
    # Qwen2 as Qwen2.5 long-context configs mix it: full layers below max_window_layers, sliding above.
    "qwen2_sliding": ("qwen2", dict(use_sliding_window=True, sliding_window=TINY_WINDOW, max_window_layers=1),
                      {"window": NO_WINDOW}),
    "qwen3": ("qwen3", {}, {}),
    "qwen3_moe": ("qwen3_moe", {}, {}),
    "mistral": ("mistral", {}, {"window": NO_WINDOW}),
    "gemma2": ("gemma2", {}, {"window": NO_WINDOW, "attn_softcap": {"attn_logit_softcapping": None},
                              "final_softcap": {"final_logit_softcapping": None}}),
    "gemma3": ("gemma3", {}, {"window": NO_WINDOW}),
    "phi3": ("phi3", {}, {}),
    "gpt_neox": ("gpt_neox", {}, {}),
    "cohere": ("cohere", {}, {"logit_scale": {"logit_scale": 1.0}}),
}
assert {arch for arch, _, _ in CASES.values()} == set(ARCHITECTURES)  # every buildable family is in the matrix


@pytest.fixture(scope="module", params=list(CASES))
def family(request, tmp_path_factory):
    arch, overrides, knobs = CASES[request.param]
    path = build_tiny_model(tmp_path_factory.mktemp(request.param), arch=arch, **SMALL, initializer_range=0.2,
                            **overrides)
    return path, load_policy(str(path), bf16=False), knobs


def _samples(seed: int = 0) -> list[Sample]:
    """Two GRPO-like groups of 3 and two lone samples: prompts 6-12 tokens, responses 2-14, so
    most sequences are longer than the sliding window."""
    rng = random.Random(seed)
    out = []
    for size in (3, 1, 3, 1):
        prompt = [rng.randrange(256) for _ in range(rng.randint(6, 12))]
        out += [Sample("", prompt, response_ids=[rng.randrange(256) for _ in range(rng.randint(2, 14))])
                for _ in range(size)]
    return out


def _alone(model, samples: list[Sample], temperature: float, width: int) -> torch.Tensor:
    """Log-probs [b, width] from the model's own forward, each sample alone, unpacked."""
    rows = torch.zeros(len(samples), width)
    for i, s in enumerate(samples):
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        with torch.no_grad():
            logp = (model(input_ids=ids).logits[0].float() / temperature).log_softmax(-1)
        p = len(s.prompt_ids)
        rows[i, : s.response_length] = logp[p - 1 : -1].gather(-1, ids[0, p:, None]).squeeze(-1)
    return rows


def test_packed_log_probs_equal_the_models_own_forward(family, monkeypatch):
    path, policy, knobs = family
    samples = _samples()
    width = max(s.response_length for s in samples)
    assert max(s.total_length for s in samples) > 2 * TINY_WINDOW
    reference = AutoModelForCausalLM.from_pretrained(path).eval()  # its default attention (eager for Gemma 2)
    alone = _alone(reference, samples, 0.7, width)
    masks = []  # a packed forward builds no [N, N] mask, not even for sliding-window layers
    monkeypatch.setattr(attention, "sdpa_mask", lambda *a, **k: masks.append(k["kv_length"]))
    for small_group in (attention.SMALL_GROUP, 0):  # 0: prompts and responses attend in separate calls
        monkeypatch.setattr(attention, "SMALL_GROUP", small_group)
        with torch.no_grad():
            packed, _ = response_log_probs(policy, samples, 0.7, width, False)
        assert (packed - alone).abs().max() <= 1e-5, (small_group, (packed - alone).abs().max())
    assert masks == []
    for feature, off in knobs.items():  # the test can fail: each feature changes these numbers
        without = _alone(AutoModelForCausalLM.from_pretrained(path, **off).eval(), samples, 0.7, width)
        assert (without - alone).abs().max() > 1e-2, feature


# Families with a sliding window or soft-capping; plain causal attention takes the packed path
# whose gradients tests/test_packing.py checks on Qwen2 and Llama.
FEATURED = [name for name, (_, _, knobs) in CASES.items() if knobs]


@pytest.mark.parametrize("family", FEATURED, indirect=True)
def test_packed_gradients_equal_the_padded_layouts(family):
    _, policy, _ = family
    samples = _samples(seed=1)
    width = max(s.response_length for s in samples)

    def grad(packed: bool) -> torch.Tensor:
        policy.zero_grad(set_to_none=True)
        lp, ent = response_log_probs(policy, samples, 0.9, width, True, packed=packed)
        (lp.sum() + 0.1 * ent.sum()).backward()
        return torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])

    reference = grad(False)
    assert (grad(True) - reference).abs().max() / reference.norm() <= 1e-5
    policy.zero_grad(set_to_none=True)


def test_engine_samples_with_the_trainers_log_probs(family):
    path, policy, _ = family
    tok = build_tokenizer()
    temp, rng = 0.8, torch.Generator().manual_seed(0)
    engine = EmbeddedEngine(policy, pad_token_id=tok.pad_token_id, seed=5, max_batch_size=8)
    prompts = [tok(f"{a}+{a * 7 % 100}=", add_special_tokens=False)["input_ids"] for a in range(10, 14)]
    prompts[0] = prompts[0] * 3  # prompts of different lengths: left padding in the shared prefill
    lengths = torch.randint(4, 24, (16,), generator=rng).tolist()
    reqs = [GenerateRequest(p, SamplingParams(temperature=temp, max_new_tokens=lengths[i * 4 + j]))
            for i, p in enumerate(prompts) for j in range(4)]  # 16 rows in 8 slots: rows leave and join mid-run
    try:
        results = engine.generate_sync(reqs)
        greedy = engine.generate_sync([GenerateRequest(p, SamplingParams(temperature=0, max_new_tokens=8))
                                       for p in prompts[:2]])  # the first is longer than the window
    finally:
        engine.close()
    hf = AutoModelForCausalLM.from_pretrained(path).eval()  # HF generate: its own (sliding-window) caches
    for p, r in zip(prompts, greedy):
        out = hf.generate(torch.tensor([p]), do_sample=False, max_new_tokens=8, eos_token_id=None,
                          pad_token_id=tok.pad_token_id)
        assert r.token_ids == out[0, len(p):].tolist()
    samples = [Sample("", r.prompt_ids, response_ids=res.token_ids) for r, res in zip(reqs, results)]
    assert max(s.total_length for s in samples) > 2 * TINY_WINDOW
    width = max(s.response_length for s in samples)
    with torch.no_grad():
        ref, _ = response_log_probs(policy, samples, temp, width, with_entropy=False)
    diffs = torch.cat([(torch.tensor(res.log_probs) - ref[i, : len(res.log_probs)]).abs()
                       for i, res in enumerate(results)])
    assert [len(r.token_ids) for r in results] == [r.params.max_new_tokens for r in reqs]
    assert diffs.mean() <= 1e-5 and diffs.max() <= 1e-3, (diffs.mean(), diffs.max())


def test_two_rollouts_through_the_cli(family, tmp_path, monkeypatch):
    path, _, _ = family
    monkeypatch.setattr("rlvr.runtime.loop.plot_runs", lambda *a, **k: None)  # curves.png: ~4 s of matplotlib per run
    data = write_lines(tmp_path / "train.jsonl", [{"prompt": f"{a}+{a}=", "label": str(2 * a)} for a in range(8)])
    out = tmp_path / "run"
    code = main(["train", "--hf-checkpoint", str(path), "--prompt-data", str(data), "--rollout-batch-size", "2",
                 "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4", "--num-rollout", "2",
                 "--lr", "1e-3", "--use-kl-loss", "--kl-loss-coef", "0.01", "--output-dir", str(out)])
    assert code == 0
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "train/step" in r]
    assert [r["train/step"] for r in train] == [1, 2]
    assert all(v is not None for r in train for v in r.values()), train  # no NaN / inf


def test_an_unsupported_logit_transform_is_refused(tiny_qwen2):
    policy = load_policy(str(tiny_qwen2), bf16=False)
    policy.config.logits_scaling = 2.0  # Granite divides its logits by it; the trainer does not
    with pytest.raises(NotImplementedError, match="logits_scaling is not supported by the trainer's log-probs"):
        response_log_probs(policy, _samples()[:1], 1.0, 16, False)
