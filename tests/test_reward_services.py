"""remote_rm and judge against real HTTP servers on 127.0.0.1: healthy, flaky, hanging,
garbage-returning and dying servers. Failures must become values, never crashes or losses."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlvr.rewards import RewardConfig, grade
from rlvr.rewards.grader import Grader
from rlvr.core.types import Sample


class Server:
    """A real HTTP server in a thread; ``behaviour(path, body) -> (status, text)`` or sleeps."""

    def __init__(self, behaviour):
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                status, text = behaviour(self.path, body, len(outer.requests))
                data = text.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on a hanging request

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def kill(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(request):
    servers = []

    def start(behaviour):
        servers.append(Server(behaviour))
        return servers[-1]

    yield start
    for s in servers:
        try:
            s.kill()
        except Exception:
            pass


def rm_reply(path, body, count):
    """A reward model: 1.0 when the response equals the label; logs the response length."""
    rewards = [{"score": float(s["response"] == s["label"]), "length": len(s["response"])} for s in body["samples"]]
    return 200, json.dumps({"rewards": rewards})


def samples(k, right=True):
    return [Sample(prompt=f"q{i}", prompt_ids=[], label=str(i), response=str(i) if right or i % 2 else "x", index=i)
            for i in range(k)]


def cfg(**kw):
    base = dict(rm_type="remote_rm", rm_retries=2, rm_deadline=3.0, reward_timeout=10.0, rm_batch_size=4)
    return RewardConfig(**(base | kw))


def test_remote_rm_scores_in_batches_with_extra_fields(server):
    s = server(rm_reply)
    group = samples(10, right=False)
    Grader(cfg(rm_url=s.url)).grade_sync(group)
    assert [g.reward["score"] for g in group] == [float(i % 2) for i in range(10)]
    assert all(g.reward["length"] == len(g.response) for g in group)
    assert all("reward_error" not in g.metadata for g in group)
    sizes = [len(r["samples"]) for r in s.requests]
    assert sum(sizes) == 10 and max(sizes) <= 4 and len(sizes) == 3  # batched, nothing sent twice


def test_remote_rm_retries_a_flaky_server(server):
    s = server(lambda p, b, n: (503, "busy") if n == 1 else rm_reply(p, b, n))
    group = samples(3)
    Grader(cfg(rm_url=s.url)).grade_sync(group)
    assert [g.reward["score"] for g in group] == [1.0, 1.0, 1.0]
    assert len(s.requests) == 2


class Hang:
    """A server behaviour that holds every request until ``release`` is set (or 120 s pass) and
    records the ones it answered: a client that gave up at its own deadline returns while
    ``answered`` is still empty; one that waited for the server does not."""

    def __init__(self):
        self.release, self.answered = threading.Event(), []

    def __call__(self, path, body, n):
        self.release.wait(120)
        self.answered.append(n)
        return 200, "{}"


@pytest.fixture
def hang():
    h = Hang()
    yield h
    h.release.set()


def test_remote_rm_hanging_server_fails_soft_within_the_deadline(server, hang):
    s = server(hang)
    group = samples(3)
    Grader(cfg(rm_url=s.url, rm_deadline=1.0, rm_retries=1, reward_failure_value=-1.0)).grade_sync(group)
    assert hang.answered == [] and len(s.requests) == 2  # 2 attempts, each given up at the 1 s deadline
    assert [g.reward for g in group] == [-1.0, -1.0, -1.0]
    assert all("no usable reply after 2 attempts" in g.metadata["reward_error"] for g in group)


def test_remote_rm_garbage_replies_fail_soft(server):
    replies = iter([(200, "<html>oops</html>"), (200, json.dumps({"rewards": [1.0]})),
                    (200, json.dumps({"rewards": ["a", None, float("nan")]}))])
    s = server(lambda p, b, n: next(replies))
    group = samples(3)
    Grader(cfg(rm_url=s.url, rm_retries=1)).grade_sync(group)  # attempt 1 not JSON, attempt 2 wrong length
    assert [g.reward for g in group] == [0.0, 0.0, 0.0]
    assert all("expected a list of 3 rewards, got 1" in g.metadata["reward_error"] for g in group)
    group = samples(3)
    Grader(cfg(rm_url=s.url, rm_retries=0)).grade_sync(group)  # well-formed list, bad values
    errors = [g.metadata["reward_error"] for g in group]
    assert "must be a number" in errors[0] and "must be a number" in errors[1] and "non-finite" in errors[2]


def test_remote_rm_server_dying_mid_run_loses_nothing(server):
    s = server(rm_reply)
    grader = Grader(cfg(rm_url=s.url, rm_retries=1, rm_deadline=1.0))
    first, second = samples(4), samples(4)
    grader.grade_sync(first)
    s.kill()
    grader.grade_sync(second)
    assert [g.reward["score"] for g in first] == [1.0] * 4
    assert [g.reward for g in second] == [0.0] * 4
    assert all("reward_error" in g.metadata for g in second)
    assert sum(len(r["samples"]) for r in s.requests) == 4


# ---- judge ----------------------------------------------------------------------------------
def judge_reply(path, body, count):
    """An OpenAI-compatible judge: 'Score: 9' when the reference answer appears in the response."""
    assert path == "/v1/chat/completions"
    text = body["messages"][0]["content"]
    response = text.split("Response:\n", 1)[1].split("\n\nJudge", 1)[0]
    label = text.split("Reference answer:\n", 1)[1].split("\n\nResponse", 1)[0]
    verdict = "Score: 9" if label in response else "It is wrong.\nScore: 1"
    return 200, json.dumps({"id": "x", "object": "chat.completion", "model": body["model"],
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": verdict},
                                         "finish_reason": "stop"}]})


def judge_cfg(url, **kw):
    return replace(cfg(rm_type="judge", judge_url=url), **kw)


def test_judge_scores_through_an_openai_endpoint(server):
    s = server(judge_reply)
    right = grade("judge", "so the capital is Paris", "Paris", config=judge_cfg(s.url), prompt="Capital of France?")
    wrong = grade("judge", "Lyon", "Paris", config=judge_cfg(s.url), prompt="Capital of France?")
    assert (right.score, right.error) == (pytest.approx(0.9), None)
    assert wrong.score == pytest.approx(0.1)
    assert "Capital of France?" in s.requests[0]["messages"][0]["content"]


def test_judge_custom_template_and_bad_replies(server, tmp_path):
    template = tmp_path / "judge.txt"
    template.write_text("Q: {prompt}\nGold: {label}\nAnswer: {response}\nRate 0-5 as [[N]].")
    s = server(lambda p, b, n: (200, json.dumps({"choices": [{"message": {"content": "[[4]]"}}]})))
    out = grade("judge", "r", "g", config=judge_cfg(s.url, judge_prompt_path=str(template), judge_max_score=5.0))
    assert out.score == pytest.approx(0.8) and s.requests[0]["messages"][0]["content"].startswith("Q: ")

    garbage = server(lambda p, b, n: (200, json.dumps({"choices": [{"message": {"content": "no idea"}}]})))
    out = grade("judge", "r", "g", config=judge_cfg(garbage.url))
    assert out.score == 0.0 and "judge reply has no score" in out.error
    empty = server(lambda p, b, n: (200, json.dumps({"choices": []})))
    out = grade("judge", "r", "g", config=judge_cfg(empty.url, rm_retries=0))
    assert out.score == 0.0 and "malformed reply" in out.error


def test_judge_hanging_and_dead_servers(server, hang):
    s = server(hang)
    out = grade("judge", "r", "g", config=judge_cfg(s.url, rm_deadline=0.8, rm_retries=1))
    assert hang.answered == [] and out.score == 0.0 and "no usable reply" in out.error  # gave up, did not wait
    dead = server(judge_reply)
    dead.kill()
    out = grade("judge", "r", "g", config=judge_cfg(dead.url, rm_deadline=1.0))
    assert out.score == 0.0 and "no usable reply after 3 attempts" in out.error
