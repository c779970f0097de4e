"""The trainer and engine on a real pretrained model: SmolLM2-135M-Instruct (``make smollm2``).

The tiny random models of the other tests share SmolLM2's architecture (Llama) but not its
scale (30 layers, vocabulary 49,152), its trained weights (peaked next-token distributions), its
tied embeddings at that size, or its chat template, whose end-of-turn token ``<|im_end|>`` is
both eos and pad. These tests check on it: packed log-probs against one sample at a time, the
engine's sampled log-probs against the trainer's, stopping at ``<|im_end|>`` as HF ``generate``
does, embeddings and output head still one tensor after a weight sync, and the README's quick
start as printed (one rollout of ``rlvr train``, then ``rlvr plot``). They skip, saying so, when
the converted checkpoint is absent (``make test`` builds it first).

Tolerances are float32's on a 30-layer model: summation order differs between a packed forward
and one sample alone, and between the engine's cached decoding and one full forward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.local.embedded import EmbeddedEngine
from rlvr.core.types import Sample

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path(os.environ.get("RLVR_SMOLLM2", "models/smollm2-135m-instruct"))
pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(not (MODEL / "model.safetensors").is_file(),
                       reason=f"{MODEL} is missing: run `make smollm2` (or set RLVR_SMOLLM2 to a converted copy)"),
]
QUESTIONS = ["What is 2 + 3?", "Compute 47 + 85. Reply with just the result.", "Name a colour."]


@pytest.fixture(scope="module")
def smol():
    from transformers import AutoTokenizer

    from rlvr.train.trainer import load_policy

    tok = AutoTokenizer.from_pretrained(MODEL)
    return load_policy(str(MODEL), bf16=False).eval(), tok


def _chat_ids(tok, question: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def _engine(policy, tok, **kw) -> EmbeddedEngine:
    return EmbeddedEngine(policy, pad_token_id=tok.pad_token_id, seed=3, max_batch_size=8, tokenizer=tok, **kw)


def _sampled(policy, tok, temperature: float, max_new: int = 12) -> tuple[list[Sample], list]:
    """Chat prompts of different lengths, 3 samples each: samples with the engine's log-probs."""
    engine = _engine(policy, tok)
    reqs = [GenerateRequest(_chat_ids(tok, q), SamplingParams(temperature=temperature, max_new_tokens=max_new))
            for q in QUESTIONS for _ in range(3)]
    try:
        results = engine.generate_sync(reqs)
    finally:
        engine.close()
    return [Sample("", r.prompt_ids, response_ids=res.token_ids) for r, res in zip(reqs, results)], results


def test_packed_log_probs_equal_one_sample_at_a_time(smol):
    from rlvr.train.logprobs import response_log_probs

    policy, tok = smol
    samples, _ = _sampled(policy, tok, 1.0)
    width = max(s.response_length for s in samples)
    alone = torch.zeros(len(samples), width)
    with torch.no_grad():
        packed, _ = response_log_probs(policy, samples, 0.8, width, False)
        for i, s in enumerate(samples):
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            logp = (policy(input_ids=ids).logits[0].float() / 0.8).log_softmax(-1)
            p = len(s.prompt_ids)
            alone[i, : s.response_length] = logp[p - 1 : -1].gather(-1, ids[0, p:, None]).squeeze(-1)
    assert len({len(s.prompt_ids) for s in samples}) == len(QUESTIONS)  # packing mixes lengths
    assert (packed - alone).abs().max() <= 2e-4, (packed - alone).abs().max()


def test_engine_log_probs_equal_the_trainers(smol):
    from rlvr.train.logprobs import response_log_probs

    policy, tok = smol
    samples, results = _sampled(policy, tok, 0.9)
    width = max(s.response_length for s in samples)
    with torch.no_grad():
        ref, _ = response_log_probs(policy, samples, 0.9, width, False)
    diffs = torch.cat([(torch.tensor(res.log_probs) - ref[i, : len(res.log_probs)]).abs()
                       for i, res in enumerate(results)])
    assert diffs.numel() > 3 * len(QUESTIONS)
    assert diffs.mean() <= 1e-4 and diffs.max() <= 2e-3, (diffs.mean(), diffs.max())


def test_greedy_stops_at_im_end_like_hf_generate(smol):
    """``<|im_end|>`` is eos and pad (id 2): prompts left-padded with it in one batch still stop
    where HF ``generate`` stops on each alone, the stop token kept as the response's last token."""
    policy, tok = smol
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == tok.eos_token_id
    prompts = [_chat_ids(tok, q) for q in QUESTIONS]
    engine = _engine(policy, tok)
    params = SamplingParams(temperature=0, max_new_tokens=40, stop_token_ids=(tok.eos_token_id,))
    try:
        results = engine.generate_sync([GenerateRequest(p, params) for p in prompts])
    finally:
        engine.close()
    for p, r in zip(prompts, results):
        with torch.no_grad():
            out = policy.generate(torch.tensor([p]), do_sample=False, max_new_tokens=40,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        assert r.token_ids == out[0, len(p):].tolist()
        assert r.finish_reason == "stop" and r.token_ids[-1] == tok.eos_token_id
        assert tok.eos_token_id not in r.token_ids[:-1]
        assert "<|im_end|>" not in tok.decode(r.token_ids, skip_special_tokens=True)


def test_tied_embeddings_stay_tied_after_a_weight_sync(smol):
    from transformers import AutoModelForCausalLM

    policy, tok = smol
    engine = _engine(AutoModelForCausalLM.from_pretrained(MODEL), tok)
    try:
        model = engine.model
        assert model.lm_head.weight is model.model.embed_tokens.weight
        before = model.model.embed_tokens.weight.detach().clone()
        # What Trainer.weights() sends (named_parameters): the tied tensor once, by its embedding name.
        weights = {n: p.detach().clone() for n, p in policy.named_parameters()}
        assert "lm_head.weight" not in weights
        weights["model.embed_tokens.weight"] += 0.01  # a trained step's change
        engine.update_weights(weights.items(), version=1)
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert torch.equal(model.lm_head.weight, before + 0.01)
        greedy = engine.generate_sync([GenerateRequest(_chat_ids(tok, QUESTIONS[0]),
                                                       SamplingParams(temperature=0, max_new_tokens=4))])[0]
        assert greedy.weight_version == 1
    finally:
        engine.close()


def readme_quick_start() -> str:
    """The shell block of the README's "Quick start on a real model", as printed."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start on a real model"):]
    start = section.index("```bash\n") + len("```bash\n")
    return section[start:section.index("\n```", start)]


@pytest.mark.slow
def test_the_readme_quick_start_runs_as_printed(tmp_path):
    """The README's quick start in a fresh directory, as printed but for: `make smollm2` (this
    module runs only where its checkpoint is), the venv's `rlvr` (this interpreter's), the model's
    path (absolute) and 1 rollout instead of 10 (its 16 samples are most of what the test costs). One
    optimizer step, evaluations before and after it on the eval file the block writes, sampled
    responses kept, and the plot written."""
    block = readme_quick_start()
    edits = {"make smollm2 ": "# make smollm2 ", ".venv/bin/rlvr ": f"{sys.executable} -m rlvr ",
             "models/smollm2-135m-instruct ": f"{MODEL.resolve()} ", "--num-rollout 10 ": "--num-rollout 1 "}
    for old, new in edits.items():
        assert old in block, f"the README's quick start no longer has {old!r}: update this test with it"
        block = block.replace(old, new)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=840)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "runs" / "mine"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/step" in r]
    assert [r["train/step"] for r in train] == [1]
    assert all(v is not None for r in train for v in r.values()), train  # no NaN / inf
    evals = [r for r in records if "eval/step" in r]
    assert [r["eval/step"] for r in evals] == [0, 1] and all(0 <= r["eval/my_eval/score"] <= 1 for r in evals)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {s["rollout_id"] for s in samples} == {0}  # a few responses of the rollout are kept
    assert all(s["response"] and "<|im_end|>" not in s["response"] for s in samples)
    assert (out / "curves.png").stat().st_size > 10_000  # rlvr plot's dashboard
