"""The grader: custom rewards (sync, async, per group), composites, and failure as a value."""

from __future__ import annotations

import sys
import textwrap
import threading
import time

import pytest

from rlvr.runtime.configure import parse_config
from rlvr.core.errors import ConfigError
from rlvr.rewards import RewardConfig, grade, score
from rlvr.rewards.grader import Grader
from rlvr.observe.rollout_metrics import rollout_metrics
from rlvr.core.types import Sample

CUSTOM = textwrap.dedent('''
    import asyncio, math, threading

    RELEASE = threading.Event()  # "slow" graders block until the test sets it

    def exact(sample):
        return float(sample.response.strip() == str(sample.label))

    async def async_len(sample):
        await asyncio.sleep(0.01)
        return {"score": len(sample.response) / 10, "chars": len(sample.response)}

    def picky(sample):
        r = sample.response
        if r == "raise":
            raise RuntimeError("grader bug")
        if r == "nan":
            return math.nan
        if r == "dict":
            return {"acc": 1.0}
        if r == "text":
            return "1.0"
        if r == "slow":  # until the test releases it: a grader that waited for it never returns
            RELEASE.wait()
        return 1.0

    async def async_slow(sample):
        while not RELEASE.is_set():
            await asyncio.sleep(0.05)
        return 1.0

    def rank_in_group(samples):
        order = sorted(range(len(samples)), key=lambda i: len(samples[i].response))
        out = [0.0] * len(samples)
        for rank, i in enumerate(order):
            out[i] = rank / (len(samples) - 1)
        return out

    def group_wrong_length(samples):
        return [1.0]
''')


@pytest.fixture
def custom(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(CUSTOM)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)  # this test's copy (its RELEASE unset)

    def make(fn, **kw):
        return Grader(RewardConfig(custom_rm_path=f"my_rewards:{fn}", **kw))

    return make


def group(*responses, label="4"):
    return [Sample(prompt="2+2=", prompt_ids=[], label=label, response=r, index=i) for i, r in enumerate(responses)]


def test_custom_sync_and_async_rewards(custom):
    g = group("4", " 4 ", "5")
    custom("exact").grade_sync(g)
    assert [s.reward for s in g] == [1.0, 1.0, 0.0]
    g = group("abc", "abcdefghij")
    custom("async_len").grade_sync(g)
    assert [s.reward for s in g] == [{"score": 0.3, "chars": 3}, {"score": 1.0, "chars": 10}]
    assert rollout_metrics(g, 2, "rollout/")["rollout/reward/chars"] == 6.5


def test_group_reward_sees_the_whole_group(custom):
    g = group("aaa", "a", "aa")
    custom("rank_in_group", group_rm=True).grade_sync(g)
    assert [s.reward for s in g] == [1.0, 0.0, 0.5]
    g = group("a", "b")
    custom("group_wrong_length", group_rm=True, reward_failure_value=-0.5).grade_sync(g)
    assert [s.reward for s in g] == [-0.5, -0.5]
    assert all("returned 1 rewards for a group of 2" in s.metadata["reward_error"] for s in g)


def returns_while_blocked(grade, deadline: float = 120.0) -> None:
    """Run ``grade()`` in a thread: it must return (within ``deadline`` s, a hang's bound) while
    the "slow" graders are still blocked, i.e. without waiting for them; then release them."""

    done = threading.Event()
    worker = threading.Thread(target=lambda: (grade(), done.set()), daemon=True)
    worker.start()
    try:
        assert done.wait(deadline), f"grading did not return in {deadline} s: it waits for the blocked grader"
    finally:
        sys.modules["my_rewards"].RELEASE.set()
    worker.join(deadline)


def test_every_kind_of_failure_is_a_value_with_a_reason(custom):
    g = group("ok", "raise", "nan", "dict", "text", "slow")
    # the slow one blocks until released: it is abandoned at the 0.5 s timeout
    returns_while_blocked(lambda: custom("picky", reward_timeout=0.5, reward_failure_value=-1.0).grade_sync(g))
    assert [s.reward for s in g] == [1.0, -1.0, -1.0, -1.0, -1.0, -1.0]
    errors = [s.metadata.get("reward_error", "") for s in g]
    assert errors[0] == ""
    assert "RuntimeError: grader bug" in errors[1]
    assert "non-finite reward nan" in errors[2]
    assert "no 'score' key" in errors[3]
    assert "must be a number" in errors[4]
    assert "timeout after 0.5 s (--reward-timeout)" in errors[5]
    for s in g:
        s.metadata["score"] = s.scalar_reward()
    assert rollout_metrics(g, 6, "rollout/")["rollout/reward_errors"] == 5.0


def test_async_timeout(custom):
    g = group("x", "y")
    returns_while_blocked(lambda: custom("async_slow", reward_timeout=0.3).grade_sync(g))  # abandoned at 0.3 s
    assert all("timeout" in s.metadata["reward_error"] for s in g)


def test_composite_parts_are_weighted_and_logged():
    ok = "<think>2+2 is 4</think> <answer>\\boxed{4}</answer>"
    g = group(ok, "<answer>4</answer>", "<think>hm</think><answer>5</answer>")
    Grader(RewardConfig(rm_type="math=0.9,format=0.1")).grade_sync(g)
    assert [s.scalar_reward() for s in g] == pytest.approx([1.0, 0.9, 0.1])
    m = rollout_metrics(g, 3, "rollout/")
    assert m["rollout/reward/math"] == pytest.approx(2 / 3) and m["rollout/reward/format"] == pytest.approx(2 / 3)


def test_qa_rewards():
    assert score("exact_match", "The answer is the Eiffel Tower.", "Eiffel tower") == 1.0
    assert score("exact_match", "Eiffel", "Eiffel Tower") == 0.0
    assert score("f1", "Eiffel", "Eiffel Tower") == pytest.approx(2 / 3)
    assert score("f1", "<answer>Paris</answer>", ["Lyon", "Paris"]) == 1.0
    assert grade("f1", "x", None).error == ("ValueError: QA reward needs a label: the reference answer or a list of them "
                                            "(--label-key)")


def test_score_returns_the_failure_value_and_grade_says_why():
    assert score("math", "so 4", None) == 0.0
    assert "math reward needs a non-empty label" in grade("math", "so 4", None).error


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--rm-type", "math=x"], "--rm-type: weight of 'math' must be a number"),
        (["--rm-type", "math,math"], "--rm-type: reward 'math' appears twice"),
        (["--rm-type", "remote_rm"], "--rm-url: is required by --rm-type remote_rm"),
        (["--rm-type", "judge"], "--judge-url: is required by --rm-type judge"),
        (["--group-rm"], "--group-rm: grades with --custom-rm-path"),
        (["--custom-rm-path", "no_such_module:fn"], "--custom-rm-path: cannot import module 'no_such_module'"),
        (["--reward-timeout", "0"], "--reward-timeout: must be > 0"),
        (["--judge-prompt-path", "/nonexistent.txt"], "--judge-prompt-path: file not found"),
    ],
)
def test_reward_flags_are_validated(base_args, flags, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(base_args + flags)


@pytest.fixture
def base_args(tiny_qwen2, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "1+1=", "label": "2"}\n')
    return ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data)]


# ---- in the rollout -------------------------------------------------------------------------
class SlowTail:
    """A real embedded engine whose group with prompt index 1 comes back only once group 0 has
    been graded (a long tail): a rollout that graded after every group returned would wait here
    until the 60 s deadline, and group 0's grading would then come after group 1's return."""

    def __init__(self, engine, graded: dict):
        self.engine, self.graded, self.returned = engine, graded, {}

    async def generate(self, requests):
        import asyncio

        results = await self.engine.generate(requests)
        if requests[0].rid == "1/0":  # second group (request ids are sample uids: draw/j)
            deadline = time.monotonic() + 60
            while 0 not in self.graded and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        self.returned[requests[0].rid] = time.monotonic()
        return results

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_rollout_grades_each_group_as_it_finishes_and_counts_failures(tiny_qwen2, tmp_path, monkeypatch):
    from rlvr.config import RolloutConfig
    from rlvr.data.dataset import DataSource, PromptRecord
    from rlvr.engine.local.embedded import EmbeddedEngine
    from rlvr.runtime.build import load_tokenizer

    (tmp_path / "timed_rewards.py").write_text(textwrap.dedent('''
        import time
        GRADED = {}
        def reward(sample):
            GRADED.setdefault(sample.group_index, time.monotonic())
            if sample.group_index == 0 and sample.index == 1:
                raise ValueError("bad sample")
            return {"score": 1.0, "len": float(len(sample.response_ids))}
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    import timed_rewards

    graded = timed_rewards.GRADED
    tok = load_tokenizer(str(tiny_qwen2))
    engine = SlowTail(EmbeddedEngine(str(tiny_qwen2), pad_token_id=tok.pad_token_id, seed=0), graded)
    records = [PromptRecord(prompt=f"{i}+1=", label=str(i + 1), metadata={}, index=i) for i in range(2)]
    from rlvr.rollout.rollout import Rollout

    cfg = RolloutConfig(rollout_batch_size=2, n_samples_per_prompt=2, rollout_max_response_len=4)
    rollout = Rollout(cfg, engine, tok, DataSource(records, shuffle=False),
                      Grader(RewardConfig(custom_rm_path="timed_rewards:reward")))
    batch = rollout.generate(0)
    assert graded[0] < engine.returned["1/0"]  # group 0 graded while group 1 was still out
    assert [s.scalar_reward() for s in batch.samples] == [1.0, 0.0, 1.0, 1.0]
    assert "bad sample" in batch.samples[1].metadata["reward_error"]
    assert batch.metrics["rollout/reward_errors"] == 1.0
    assert batch.metrics["rollout/reward/len"] == 4.0  # the failed sample has no fields
