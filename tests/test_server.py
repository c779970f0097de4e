"""``rlvr serve`` over real HTTP (a subprocess on 127.0.0.1) and the ``HttpEngine`` client."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.remote.client import HttpEngine
from tests.support import free_port, post, served
from rlvr.core.testing import RUN_SILENT_ENV

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_qwen2):
    with served(tiny_qwen2) as (port, _):
        yield port


@pytest.fixture(scope="module")
def local(tiny_qwen2):
    return AutoTokenizer.from_pretrained(tiny_qwen2), AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()


def _forward_log_probs(model, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    return logits[len(prompt) - 1 : -1].log_softmax(-1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1)


def test_generate_returns_tokens_with_exact_log_probs(server, local):
    tok, model = local
    prompt = tok("12+34=", add_special_tokens=False)["input_ids"]
    code, out = post(server, "/generate", {
        "input_ids": prompt, "return_logprob": True, "rid": "abc",
        "sampling_params": {"temperature": 0.7, "max_new_tokens": 12, "ignore_eos": True, "sampling_seed": 3},
    })
    assert code == 200
    meta = out["meta_info"]
    assert meta["id"] == "abc" and meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["completion_tokens"] == 12 and meta["prompt_tokens"] == len(prompt)
    tokens = [t for _, t, _ in meta["output_token_logprobs"]]
    assert tokens == out["output_ids"] and out["text"] == tok.decode(tokens, skip_special_tokens=True)
    ref = _forward_log_probs(model, prompt, tokens, 0.7)
    torch.testing.assert_close(torch.tensor([lp for lp, _, _ in meta["output_token_logprobs"]]), ref,
                               atol=1e-4, rtol=0)
    # a batch of prompts gives a list, in order; the same seed gives the same tokens
    code, outs = post(server, "/generate", {
        "input_ids": [prompt, prompt[:3]], "sampling_params": {"max_new_tokens": 12, "ignore_eos": True,
                                                               "temperature": 0.7, "sampling_seed": 3}})
    assert code == 200 and len(outs) == 2 and outs[0]["output_ids"] == tokens


def test_bad_payload_is_a_400_naming_the_field(server):
    code, out = post(server, "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}})
    assert code == 400 and "max_new_tokens" in out["error"]["message"]
    code, out = post(server, "/generate", {"sampling_params": {}})
    assert code == 400 and "input_ids" in out["error"]["message"]
    code, out = post(server, "/v1/chat/completions", {"messages": "hi"})
    assert code == 400 and "messages" in out["error"]["message"]


def test_health_and_flush_cache(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server}/health", timeout=5) as r:
        assert r.status == 200
    code, _ = post(server, "/flush_cache", {})
    assert code == 200


def test_update_weights_from_disk_changes_the_next_samples(server, local, tiny_qwen2, tmp_path):
    tok, model = local
    prompt = tok("7-3=", add_special_tokens=False)["input_ids"]
    greedy = {"input_ids": prompt, "return_logprob": True,
              "sampling_params": {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}}
    _, before = post(server, "/generate", greedy)
    other = AutoModelForCausalLM.from_pretrained(tiny_qwen2)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    other.save_pretrained(tmp_path / "new")
    code, out = post(server, "/update_weights_from_disk", {"model_path": str(tmp_path / "new"), "weight_version": 5})
    assert code == 200 and out["success"] and out["weight_version"] == "5"
    _, after = post(server, "/generate", greedy)
    expected = other.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8, eos_token_id=None,
                              pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
    assert after["output_ids"] == expected != before["output_ids"]
    assert after["meta_info"]["weight_version"] == "5"
    code, out = post(server, "/update_weights_from_disk", {"model_path": str(tmp_path / "missing")})
    assert code == 400 and not out["success"] and "safetensors" in out["message"]
    code, out = post(server, "/update_weights_from_disk", {"model_path": str(tiny_qwen2), "weight_version": 0})
    assert code == 200  # back to the original weights for the other tests
    _, restored = post(server, "/generate", greedy)
    assert restored["output_ids"] == before["output_ids"]


def _load(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_load", timeout=5) as r:
        [load] = json.loads(r.read())
    return load


def test_client_keeps_only_the_newest_weights_on_disk(server, local, tiny_qwen2, tmp_path):
    """``HttpEngine.update_weights``: after every server loaded a version, the older folders are
    gone (one model on disk, however many rollouts); ``close`` deletes the last, and the folder
    when the client made it, but never a ``weights_dir`` the caller gave."""
    _, model = local
    weights = dict(model.named_parameters())  # as the trainer sends them: a tied head once
    try:
        for given in (None, tmp_path / "given"):
            engine = HttpEngine([f"127.0.0.1:{server}"], timeout=60, weights_dir=given and str(given))
            for version in (1, 2, 3):
                engine.update_weights(weights, version)
                assert [p.name for p in engine.weights_dir.iterdir()] == [f"v{version}"]
            engine.close()
            assert engine.weights_dir.exists() == (given is not None)
            assert given is None or list(given.iterdir()) == []
    finally:
        post(server, "/update_weights_from_disk", {"model_path": str(tiny_qwen2), "weight_version": 0})


def test_abort_request_returns_the_tokens_so_far(server, local):
    tok, _ = local
    prompt = tok("1+1=", add_special_tokens=False)["input_ids"]
    box = {}
    # 4 x 4000 tokens take far longer than the few decode steps before the abort
    payload = {"input_ids": [prompt] * 4, "return_logprob": True,
               "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
    t = threading.Thread(target=lambda: box.setdefault("r", post(server, "/generate", payload)))
    t.start()
    # Abort once the four rows are decoding (not after a fixed sleep, which a loaded machine can outrun).
    start = _load(server)["decode_steps"]
    deadline = time.monotonic() + 60
    while not (_load(server)["num_reqs"] == 4 and _load(server)["decode_steps"] >= start + 5):
        assert time.monotonic() < deadline, f"the request never started decoding: {_load(server)}"
        time.sleep(0.01)
    code, _ = post(server, "/abort_request", {"abort_all": True})
    t.join(60)
    assert code == 200 and box["r"][0] == 200
    outs = box["r"][1]
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in outs)
    assert all(0 < len(o["output_ids"]) < 4000 for o in outs)
    assert all(len(o["meta_info"]["output_token_logprobs"]) == len(o["output_ids"]) for o in outs)


def test_openai_chat_completion_applies_the_chat_template(server, local):
    tok, _ = local
    messages = [{"role": "user", "content": "What is 2+3?"}]
    code, chat = post(server, "/v1/chat/completions", {"model": "m", "messages": messages, "max_tokens": 10,
                                                       "temperature": 0.9, "seed": 11, "n": 2})
    assert code == 200 and chat["object"] == "chat.completion" and len(chat["choices"]) == 2
    templated = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert templated.startswith("<|im_start|>user\n")
    assert chat["usage"]["prompt_tokens"] == 2 * len(tok(templated, add_special_tokens=False)["input_ids"])
    # the same prompt through /v1/completions with the same seed gives the same text
    code, comp = post(server, "/v1/completions", {"model": "m", "prompt": templated, "max_tokens": 10,
                                                  "temperature": 0.9, "seed": 11, "logprobs": 1})
    assert code == 200 and comp["object"] == "text_completion"
    choice = chat["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"] == comp["choices"][0]["text"]
    assert choice["finish_reason"] in ("stop", "length")
    assert len(comp["choices"][0]["logprobs"]["token_logprobs"]) == comp["usage"]["completion_tokens"]


def test_client_survives_a_server_killed_mid_rollout(server, local, tiny_qwen2):
    """Two servers at once, one SIGKILLed mid-rollout: every request is answered exactly once."""
    tok, model = local
    with served(tiny_qwen2) as (port_b, proc_b):
        engine = HttpEngine([f"127.0.0.1:{server}", f"127.0.0.1:{port_b}"], timeout=120, retries=2, cooldown=60)
        prompts = [tok(f"{a}+{a}=", add_special_tokens=False)["input_ids"] for a in range(16)]
        reqs = [GenerateRequest(p, SamplingParams(temperature=1.0, max_new_tokens=400), rid=f"r{i}")
                for i, p in enumerate(prompts * 2)]
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("res", asyncio.run(engine.generate(reqs))))
        t.start()
        deadline = time.monotonic() + 30
        while min(engine.outstanding.values()) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert min(engine.outstanding.values()) >= 8  # both servers busy
        time.sleep(0.05)
        proc_b.kill()  # mid-rollout: 16 rows x 400 tokens take well over a second
        t.join(180)
        res = box["res"]
        assert [r.rid for r in res] == [r.rid for r in reqs]  # exactly one answer per request, in order
        assert all(r.finish_reason == "length" and len(r.token_ids) == 400 == len(r.log_probs) for r in res)
        assert engine.failures >= 8  # the killed server's requests were retried ...
        assert engine.served[f"http://127.0.0.1:{server}"] >= 24  # ... on the survivor
        assert engine.healthy() == [f"http://127.0.0.1:{server}"] and engine.health()
        r = res[0]  # and the answers are real samples: log-probs of the tokens under the model
        ref = _forward_log_probs(model, reqs[0].prompt_ids, r.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(r.log_probs), ref, atol=1e-4, rtol=0)


def test_client_returns_an_error_result_when_no_server_answers():
    engine = HttpEngine([f"127.0.0.1:{free_port()}"], timeout=5, retries=1)
    res = asyncio.run(engine.generate([GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=2), rid="x")]))
    assert len(res) == 1 and res[0].rid == "x" and res[0].finish_reason == "error" and "error" in res[0].meta
    assert not engine.health()


def test_rlvr_train_samples_on_an_external_server(server, tiny_qwen2, arith_files, tmp_path, monkeypatch):
    """`rlvr train --rollout-external-engine-addrs`: rollouts over HTTP, weights pushed from disk,
    and the trainer's recomputed log-probs match the server's (on-policy, same weights). The
    command line is a GPU user's with a real SGLang server (docs/scaling.md), `rlvr serve`
    standing in: the trainer on `--device`, ICE-POP correcting the engine/trainer mismatch."""
    # the tiny model's rollouts may have no reward variance at all: run every sample's forward, whose numbers this checks
    monkeypatch.setenv(RUN_SILENT_ENV, "1")
    train, _ = arith_files
    out, tmp = tmp_path / "run", tmp_path / "tmp"
    tmp.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "rlvr", "train", "--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(train),
         "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
         "--num-rollout", "2", "--lr", "1e-3", "--rollout-external-engine-addrs", f"127.0.0.1:{server}",
         "--device", "cpu", "--use-tis", "--tis-mode", "icepop", "--output-dir", str(out)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp)),
    )
    try:
        assert r.returncode == 0, r.stderr[-3000:]
        assert list(tmp.glob("rlvr-weights-*")) == []  # the weights pushed to the server, deleted at the end
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        rollouts = [x for x in records if "rollout/step" in x]
        trains = [x for x in records if "train/step" in x]
        assert len(rollouts) == 2 and all(x["perf/rollout_tokens_per_s"] > 0 for x in rollouts)
        assert all(x["train/train_rollout_logprob_abs_diff"] < 1e-4 for x in trains)
        assert all(abs(x["train/tis"] - 1.0) < 1e-3 for x in trains)  # same numerics here: weights ~1
        with urllib.request.urlopen(f"http://127.0.0.1:{server}/get_model_info", timeout=5) as resp:
            assert json.loads(resp.read())["weight_version"] == "2"  # the trainer's weights after 2 steps
    finally:
        post(server, "/update_weights_from_disk", {"model_path": str(tiny_qwen2), "weight_version": 0})


def test_client_timeout_aborts_on_the_server_and_reports_an_error(server, local):
    tok, _ = local
    engine = HttpEngine([f"127.0.0.1:{server}"], timeout=0.5, retries=0)
    req = GenerateRequest(tok("9+9=", add_special_tokens=False)["input_ids"], SamplingParams(max_new_tokens=4000),
                          rid="slow")
    t0 = time.monotonic()
    res = asyncio.run(engine.generate([req]))[0]
    assert res.finish_reason == "error" and "TimeoutError" in res.meta["error"] and engine.failures == 1
    assert time.monotonic() - t0 < 10  # the client gave up on time; the server was told to abort "slow"
    code, out = post(server, "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})
    assert code == 200 and out["meta_info"]["completion_tokens"] <= 2


def test_openai_client_streams_a_chat_completion(server):
    """``stream: true`` through the official ``openai`` client: the chunks rebuild the same
    message a plain call returns (same seed)."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="x", max_retries=0)
    kw = dict(model="m", messages=[{"role": "user", "content": "2+3?"}], max_tokens=12, temperature=0.9, seed=5)
    plain = client.chat.completions.create(**kw)
    text, finish, pieces = "", None, 0
    for chunk in client.chat.completions.create(stream=True, **kw):
        text += chunk.choices[0].delta.content or ""
        pieces += bool(chunk.choices[0].delta.content)
        finish = chunk.choices[0].finish_reason or finish
    assert text == plain.choices[0].message.content and finish == plain.choices[0].finish_reason
    assert pieces >= 4  # token by token, not one chunk at the end


def test_openai_client_streams_a_completion_token_by_token(server):
    """``/v1/completions`` with ``stream: true`` (n=2, a stop string): the chunks of each choice
    rebuild the plain answer, cut before the stop string."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="x", max_retries=0)
    kw = dict(model="m", prompt="12+34=", max_tokens=16, temperature=0.9, seed=3, n=2, stop=["5"])
    plain = client.completions.create(**kw)
    texts, finish, pieces = ["", ""], [None, None], 0
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] += c.text
            pieces += bool(c.text)
            finish[c.index] = c.finish_reason or finish[c.index]
    assert sorted(texts) == sorted(c.text for c in plain.choices) and all("5" not in t for t in texts)
    assert sorted(finish) == sorted(c.finish_reason for c in plain.choices) and pieces >= 4


def test_client_keeps_a_sessions_turns_on_one_server(server):
    """Session affinity over real HTTP: two addresses of the one server count as two engines; a
    session's later turns go where its first went even when the other looks less loaded."""
    engine = HttpEngine([f"127.0.0.1:{server}", f"localhost:{server}"], timeout=60)
    first, second = engine.urls

    def turn(session: str, i: int) -> None:
        req = GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=2), rid=f"{session}#{i}", session=session)
        assert asyncio.run(engine.generate([req]))[0].finish_reason in ("stop", "length")

    turn("s", 1)
    assert engine.served == {first: 1, second: 0}  # both idle: the first
    engine.outstanding[first] += 5  # the first looks loaded: least-outstanding alone would pick the second
    try:
        turn("s", 2)
        turn("t", 1)
    finally:
        engine.outstanding[first] -= 5
    assert engine.served == {first: 2, second: 1}  # s stayed; the new session t went to the idle one
