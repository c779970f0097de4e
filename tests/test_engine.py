"""The embedded engine: exact log-probs, greedy == HF generate, stops, weight updates."""

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.embedded import EmbeddedEngine, filter_logits


@pytest.fixture(scope="module")
def setup(tiny_qwen2):
    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()
    return tok, model


def _prompts(tok):
    return [tok("12+34=", add_special_tokens=False)["input_ids"], tok("7-3=", add_special_tokens=False)["input_ids"]]


def test_log_probs_equal_a_full_forward_pass(setup):
    tok, model = setup
    eng = EmbeddedEngine(model, pad_token_id=tok.pad_token_id, seed=0)
    temp = 0.7
    reqs = [GenerateRequest(p, SamplingParams(temperature=temp, max_new_tokens=6)) for p in _prompts(tok)]
    for req, res in zip(reqs, eng.generate_sync(reqs)):
        ids = torch.tensor([req.prompt_ids + res.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float() / temp
        p = len(req.prompt_ids)
        ref = logits[p - 1 : -1].log_softmax(-1).gather(-1, ids[0, p:].unsqueeze(-1)).squeeze(-1)
        assert len(res.log_probs) == len(res.token_ids) == 6 and res.finish_reason == "length"
        torch.testing.assert_close(torch.tensor(res.log_probs), ref, atol=1e-5, rtol=0)


def test_greedy_matches_hf_generate(setup):
    tok, model = setup
    eng = EmbeddedEngine(model, pad_token_id=tok.pad_token_id)
    prompts = _prompts(tok)
    res = eng.generate_sync([GenerateRequest(p, SamplingParams(temperature=0, max_new_tokens=5)) for p in prompts])
    for p, r in zip(prompts, res):
        out = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=5, eos_token_id=None,
                             pad_token_id=tok.pad_token_id)
        assert r.token_ids == out[0, len(p):].tolist()


def test_stop_token_and_top_k_one(setup):
    tok, model = setup
    eng = EmbeddedEngine(model, pad_token_id=tok.pad_token_id, seed=1)
    p = _prompts(tok)[0]
    greedy = eng.generate_sync([GenerateRequest(p, SamplingParams(temperature=0, max_new_tokens=4))])[0]
    topk1 = eng.generate_sync([GenerateRequest(p, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=4))])[0]
    assert topk1.token_ids == greedy.token_ids
    stop = greedy.token_ids[1]
    r = eng.generate_sync([GenerateRequest(p, SamplingParams(temperature=0, max_new_tokens=4, stop_token_ids=(stop,)))])[0]
    first = greedy.token_ids.index(stop)
    assert r.token_ids == greedy.token_ids[: first + 1] and r.finish_reason == "stop"


def test_filter_logits_top_p_and_top_k():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda out: torch.isfinite(out[0]).tolist()  # noqa: E731
    assert kept(filter_logits(logits, torch.tensor([-1]), torch.tensor([0.8]))) == [True, True, False, False]
    assert kept(filter_logits(logits, torch.tensor([-1]), torch.tensor([0.81]))) == [True, True, True, False]
    assert kept(filter_logits(logits, torch.tensor([3]), torch.tensor([1.0]))) == [True, True, True, False]
    assert kept(filter_logits(logits, torch.tensor([-1]), torch.tensor([0.1]))) == [True, False, False, False]


def test_update_weights_changes_policy_and_version(setup, tiny_qwen2):
    tok, model = setup
    eng = EmbeddedEngine(model, pad_token_id=tok.pad_token_id)
    p = _prompts(tok)[0]
    before = asyncio.run(eng.generate([GenerateRequest(p, SamplingParams(temperature=0, max_new_tokens=3))]))[0]
    other = AutoModelForCausalLM.from_pretrained(tiny_qwen2)
    with torch.no_grad():
        for param in other.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    eng.update_weights(dict(other.named_parameters()), version=7)
    after = eng.generate_sync([GenerateRequest(p, SamplingParams(temperature=0, max_new_tokens=3))])[0]
    assert after.weight_version == 7 and before.weight_version == 0
    assert after.log_probs != before.log_probs
    with pytest.raises(KeyError, match="no parameter 'bogus'"):
        eng.update_weights({"bogus": torch.zeros(1)}, version=8)
