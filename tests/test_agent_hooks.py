"""A user's hooks as a user gets them wrong: each mistake is one line naming the flag and what to
do, at start-up where it can be seen then; a hook that fails in the rollout fails its sample only
(logged with the traceback, counted), and the run goes on up to --agent-failure-limit.

The hooks are written in a temporary directory that is the working directory (not on sys.path),
as a user's module is: its import goes through ``rlvr.core.registry``'s working-directory lookup."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.core.errors import ConfigError, TrainingStopped
from rlvr.core.types import Sample, Status

ROOT = Path(__file__).resolve().parents[1]

USER_MODULE = '''
from rlvr.agents import context
from rlvr.core.types import Status

def two_args(args, sample):
    return sample

async def raises_on_the_second(args, sample, sampling_params):
    if sample.uid.endswith("/1"):
        raise ZeroDivisionError("my bug")
    return await appends(args, sample, sampling_params)

async def appends(args, sample, sampling_params):
    out = await context().engine.generate(sample.prompt_ids, sampling_params)
    sample.append_segment(out.token_ids, trainable=True, log_probs=out.log_probs, weight_versions=out.weight_versions)
    return sample

async def no_tokens(args, sample, sampling_params):
    sample.status = Status.COMPLETED
    return sample

async def returns_text(args, sample, sampling_params):
    return "an answer"

async def uses_turns(args, sample, sampling_params):
    context().turns
    return sample

async def long_observation(args, sample, sampling_params):
    ctx = context()
    out = await ctx.engine.generate(sample.prompt_ids, dict(sampling_params, max_new_tokens=4))
    sample.append_segment(out.token_ids, trainable=True, log_probs=out.log_probs, weight_versions=out.weight_versions)
    sample.append_segment([5] * sampling_params["max_new_tokens"], trainable=False)  # past the budget
    return sample

TOOL_DICT = {"f": len}

def make_env(extra):
    return None
'''


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "user_hooks.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("user_hooks", None)


def _base(tiny_qwen2, arith_files, *extra) -> list[str]:
    return ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0]), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "2", "--rollout-max-response-len", "16", *extra]


@pytest.mark.parametrize("flags,expect", [
    (["--custom-generate-function-path", "user_hooks:two_args"],
     "--custom-generate-function-path: user_hooks:two_args has the signature two_args(args, sample), which cannot "
     "take rlvr's call"),
    (["--apply-chat-template", "--environment-path", "user_hooks:make_env"],
     "write it as: def make_env() -> an object with reset(sample) and step(response)"),
    (["--apply-chat-template", "--tools", "user_hooks:TOOL_DICT"],
     "--tools: 'user_hooks:TOOL_DICT' is a dict: it must be a list of functions"),
    (["--apply-chat-template", "--tools", "user_hooks"],
     "--tools: 'user_hooks' is not 'pkg.module:name': give the module and the name in it, e.g. my_tools:TOOLS"),
    (["--custom-generate-function-path", "no_such_module:generate"],
     "cannot import module 'no_such_module' from 'no_such_module:generate': No module named 'no_such_module' "
     "(looked in the installed packages and in"),
    (["--max-turns", "3"], "--max-turns: bounds the built-in --tools / --environment-path loops"),
    (["--tool-timeout", "1"], "--tool-timeout: applies to the --tools loop; without --tools it does nothing"),
])
def test_each_bad_input_is_one_line_naming_the_flag(user_dir, tiny_qwen2, arith_files, capsys, flags, expect):
    from rlvr.entrypoints.cli import main

    assert main(["train", *_base(tiny_qwen2, arith_files, *flags)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("rlvr train: error: ") and expect in err, err
    assert "Traceback" not in err and "TypeError" not in err


def _rollout(tiny_qwen2, fn: str, template: bool = True, **agent_kw):
    from tests.support import agent_rollout

    rollout, engine, tok = agent_rollout(tiny_qwen2, ["408"], tools=None, custom_generate_function_path=f"user_hooks:{fn}",
                                  **agent_kw)
    if not template:  # prompts rendered as a run with the template renders them; no ChatTurns for the hook
        rollout.agent.turns = None
    return rollout, engine, tok


def test_a_raising_generate_function_fails_its_sample_only(user_dir, tiny_qwen2, caplog):
    from rlvr.observe.rollout_metrics import rollout_metrics

    rollout, _, _ = _rollout(tiny_qwen2, "raises_on_the_second")
    group = rollout.next_groups(1)[0]
    asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))
    ok, bad = group
    assert ok.status == Status.COMPLETED and ok.response_ids and "agent_error" not in ok.metadata
    assert bad.status == Status.FAILED and bad.response_ids == [] and bad.reward == 0.0
    assert bad.metadata["agent_error"] == "ZeroDivisionError: my bug"
    assert 'user_hooks.py", line' in bad.metadata["agent_traceback"]  # where in the user's code
    assert "ZeroDivisionError: my bug" in caplog.text and "Traceback" in caplog.text
    assert rollout_metrics(group, 2, "rollout/")["rollout/agent_errors"] == 1
    rollout.agent.check_failures(group, "rollout 0")  # 1 of 2 is not more than the default limit 0.5
    with pytest.raises(TrainingStopped, match=r"2 of 2 samples of rollout 0 failed in --custom-generate-function-path "
                                              r"user_hooks:raises_on_the_second \(more than --agent-failure-limit 0.5\); "
                                              r"the first: ZeroDivisionError: my bug"):
        rollout.agent.check_failures([bad, bad], "rollout 0")


@pytest.mark.parametrize("fn,expect", [
    ("no_tokens", "returned sample 0/0 with no response token: append the engine's tokens with sample.append_segment"),
    ("returns_text", "returned str, not a Sample: return the sample it was given"),
])
def test_a_bad_sample_fails_with_what_to_do(user_dir, tiny_qwen2, fn, expect):
    rollout, _, _ = _rollout(tiny_qwen2, fn)
    group = rollout.next_groups(1)[0]
    asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))
    assert all(s.status == Status.FAILED for s in group)
    assert f"--custom-generate-function-path user_hooks:{fn} {expect}" in group[0].metadata["agent_error"]


def test_ctx_turns_without_the_chat_template_stops_the_run_naming_the_flag(user_dir, tiny_qwen2):
    rollout, _, _ = _rollout(tiny_qwen2, "uses_turns", template=False)
    group = rollout.next_groups(1)[0]
    with pytest.raises(ConfigError, match=re.escape("--apply-chat-template: context().turns renders observations "
                                                    "with the chat template, so the run needs --apply-chat-template")):
        asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))


def test_an_observation_past_the_budget_is_cut_to_it(user_dir, tiny_qwen2):
    rollout, _, _ = _rollout(tiny_qwen2, "long_observation")
    rollout.cfg.rollout_max_response_len = 64
    group = rollout.next_groups(1)[0]
    asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))
    for s in group:
        s.check()
        assert s.response_length == 64 and s.status == Status.TRUNCATED
        assert s.metadata["cut_tokens"] == s.segments()[0][1] and [t for _, _, t in s.segments()] == [True, False]


@pytest.mark.slow
def test_a_run_whose_samples_have_no_tokens_trains_on_nothing_and_goes_on(user_dir, tiny_qwen2, arith_files):
    """Every sample fails (no response token) and --agent-failure-limit 1 keeps the run going:
    the trainer gets a batch with no response token, backpropagates zero and the run ends."""
    out = user_dir / "run"
    r = subprocess.run([sys.executable, "-m", "rlvr", "train", *_base(tiny_qwen2, arith_files),
                        "--custom-generate-function-path", "user_hooks:no_tokens", "--agent-failure-limit", "1",
                        "--num-rollout", "1", "--output-dir", str(out)],
                       cwd=user_dir, capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(row for row in rows if "rollout/step" in row)
    assert step["rollout/agent_errors"] == 4 and [row["train/step"] for row in rows if "train/step" in row] == [1]
    shown = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(shown) == 4 and all("with no response token" in row["agent_error"] for row in shown)


def test_a_module_in_the_working_directory_imports_without_pythonpath(tmp_path, monkeypatch):
    from rlvr.core.registry import load_function

    (tmp_path / "only_here_agent.py").write_text("def generate(args, sample, sampling_params):\n    return sample\n")
    monkeypatch.chdir(tmp_path)
    assert not any(Path(p or ".").resolve() == tmp_path.resolve() for p in sys.path)
    try:
        fn = load_function("only_here_agent:generate", "--custom-generate-function-path")
        assert Path(sys.modules["only_here_agent"].__file__).resolve() == (tmp_path / "only_here_agent.py").resolve()
        assert fn.__name__ == "generate"
    finally:
        sys.modules.pop("only_here_agent", None)


def test_sample_fields_a_reader_needs_are_in_samples_jsonl(tmp_path):
    from rlvr.core.types import RolloutBatch
    from rlvr.observe.run_files import write_samples

    s = Sample("p", [1], response_ids=[4, 5, 6], loss_mask=[1, 0, 1], rollout_log_probs=[-1.0, 0.0, -1.0],
               metadata={"turns": 2, "tool_calls": 1, "tool_errors": 0, "tool_counts": {"f": 1}})
    write_samples(tmp_path / "s.jsonl", RolloutBatch(0, [s], 1, {}), decode=lambda ids: "".join(map(str, ids)))
    row = json.loads((tmp_path / "s.jsonl").read_text())
    assert row["segments"] == [{"loss_mask": 1, "tokens": 1, "text": "4"}, {"loss_mask": 0, "tokens": 1, "text": "5"},
                               {"loss_mask": 1, "tokens": 1, "text": "6"}]
    assert (row["turns"], row["tool_calls"], row["tool_counts"]) == (2, 1, {"f": 1})
