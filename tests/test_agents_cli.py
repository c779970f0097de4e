"""slime-style hooks through the CLI: a custom generate function written here, not in
the package, trains 2 rollouts in sync, ``--async`` and ``--ray`` modes; a rollout function too.

The functions below are what a slime user writes, with ``slime.*`` imports swapped for
``rlvr.agents.context()`` (slime's ``GenerateState``) and the engine handle (slime posts to the
router's ``/generate``; here the handle sends token ids and returns ids + log-probs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.agents import context
from rlvr.core.testing import RUN_SILENT_ENV
from rlvr.core.types import RolloutBatch, Sample, Status
from tests.support import cli

SERIAL_GROUP = "ray"  # one xdist worker for the group's modules (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]


async def generate(args, sample: Sample, sampling_params: dict) -> Sample:
    """Two model turns with a tool observation between them, token-in/token-out."""
    ctx = context()
    for turn in range(2):
        left = sampling_params["max_new_tokens"] - sample.response_length
        out = await ctx.engine.generate(sample.prompt_ids + sample.response_ids,
                                        dict(sampling_params, max_new_tokens=max(1, min(4, left))))
        sample.append_segment(out.token_ids, trainable=True, log_probs=out.log_probs,
                              weight_versions=out.weight_versions, text=ctx.tokenizer.decode(out.token_ids))
        if out.finish_reason == "abort":
            sample.status = Status.ABORTED
            return sample
        if turn == 0:
            text, ids = ctx.turns.observation_ids([{"role": "tool", "content": "7"}], out.token_ids)
            sample.append_segment(ids, trainable=False, text=text)
    sample.status = Status.TRUNCATED if out.finish_reason == "length" else Status.COMPLETED
    return sample


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    """A whole rollout (slime's ``generate_rollout``): prompts from the data source, one engine
    call per sample through the per-sample function above; returns (groups, metrics)."""
    import asyncio

    ctx = context()
    params = ctx.rollout.sampling_params()
    if evaluation:
        groups = [ctx.rollout.new_group(r, g, data_source.n_samples_per_prompt) for g, r in enumerate(data_source.records)]
    else:
        groups = ctx.rollout.next_groups(args.rollout.rollout_batch_size)

    async def one(s):
        h = ctx.new_handle(s.uid)
        out = await h.generate(s.prompt_ids, params)
        return s.append_segment(out.token_ids, trainable=True, log_probs=out.log_probs,
                                weight_versions=out.weight_versions, text=ctx.tokenizer.decode(out.token_ids))

    async def run():
        await asyncio.gather(*(one(s) for g in groups for s in g))

    asyncio.run(run())
    return groups, {"rollout/custom_metric": 1.0}


def train_args(ckpt, arith_files, out, *extra) -> list[str]:
    train, test = arith_files
    small_eval = out.parent / "eval.jsonl"
    small_eval.write_text("".join(test.read_text().splitlines(keepends=True)[:4]))
    return ["train", "--hf-checkpoint", str(ckpt), "--prompt-data", str(train), "--apply-chat-template",
            "--eval-prompt-data", "arith", str(small_eval), "--eval-interval", "1",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "32",
            "--num-rollout", "2", "--lr", "1e-3", "--output-dir", str(out),
            "--save-debug-rollout-data", str(out / "dump" / "r{rollout_id}.pt"), *extra]


def check_multi_turn_run(out: Path, rollouts: int = 2, dumps: bool = True) -> None:
    """2 turns per sample in training and eval; in the saved batches (sync: the loop saves them)
    every sample is model / tool / model, the tool tokens masked with placeholder log-probs."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/step" in r]
    assert [r["rollout/step"] for r in steps] == list(range(rollouts))
    assert [r["train/step"] for r in rows if "train/step" in r] == list(range(1, rollouts + 1))
    assert all(r["rollout/turns/mean"] == 2 for r in steps)
    assert [r for r in rows if "eval/step" in r][-1]["eval/arith/turns/mean"] == 2  # eval runs the function too
    for r in range(rollouts if dumps else 0):
        batch = RolloutBatch.load(out / "dump" / f"r{r}.pt")
        for s in batch.samples:
            segs = s.segments()
            assert [t for _, _, t in segs] == [True, False, True], segs
            start, end, _ = segs[1]
            assert s.response.count("<|im_start|>tool\n7") == 1 and s.rollout_log_probs[start:end] == [0.0] * (end - start)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_custom_generate_function_trains_through_the_cli(tiny_qwen2, arith_files, tmp_path, mode, monkeypatch):
    # the tiny model's rollouts may have no reward variance at all: run every sample's forward, whose numbers this checks
    monkeypatch.setenv(RUN_SILENT_ENV, "1")
    out = tmp_path / "run"
    extra = ["--async", "--max-staleness", "1"] if mode == "async" else []
    r = cli(*train_args(tiny_qwen2, arith_files, out, "--custom-generate-function-path",
                        "tests.test_agents_cli:generate", *extra))
    assert r.returncode == 0, r.stderr[-3000:]
    check_multi_turn_run(out, dumps=mode == "sync")
    if mode == "sync":  # on-policy, one step per rollout: the trainer's p0 is the engine's q on model tokens
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r for r in rows if "train/step" in r][0]["train/train_rollout_logprob_abs_diff"] < 1e-5


def check_rollout_function_run(out: Path, staleness: int = 0) -> None:
    """2 rollouts made by the rollout function (its metric logged), trained, evaluated 3 times
    (the function runs in eval too), each batch within ``staleness`` versions of the trainer."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/step" in r]
    assert [r["rollout/custom_metric"] for r in steps] == [1.0, 1.0]
    assert [r["train/step"] for r in rows if "train/step" in r] == [1, 2]
    assert all(r["rollout/staleness_max"] <= staleness for r in steps)
    assert len([r for r in rows if "eval/step" in r]) == 3


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_rollout_function_trains_and_evaluates_through_the_cli(tiny_qwen2, arith_files, tmp_path, mode):
    """Under --async a thread calls the function for the next rollout while the trainer trains
    (``rlvr.rollout.producer.RolloutFunctionProducer``), within --max-staleness."""
    out = tmp_path / "run"
    extra = ["--async", "--max-staleness", "1"] if mode == "async" else []
    r = cli(*train_args(tiny_qwen2, arith_files, out, "--rollout-function-path",
                        "tests.test_agents_cli:generate_rollout", *extra))
    assert r.returncode == 0, r.stderr[-3000:]
    check_rollout_function_run(out, staleness=1 if mode == "async" else 0)


def test_hook_paths_are_checked_at_parse_time(tiny_qwen2, arith_files, tmp_path):
    from rlvr.runtime.configure import parse_config
    from rlvr.core.errors import ConfigError

    base = train_args(tiny_qwen2, arith_files, tmp_path / "run")[1:]
    with pytest.raises(ConfigError, match="--custom-generate-function-path"):
        parse_config(base + ["--custom-generate-function-path", "tests.test_agents_cli:nope"])
    with pytest.raises(ConfigError, match="--rollout-function-path"):
        parse_config(base + ["--rollout-function-path", "tests.test_agents_cli:generate_rollout",
                             "--custom-generate-function-path", "tests.test_agents_cli:generate"])
    parse_config(base + ["--rollout-function-path", "tests.test_agents_cli:generate_rollout", "--async"])


@pytest.mark.slow
# Two of the four combinations, to keep the suite short (all four passed when this was written;
# each hook's other mode runs locally above): the generate function in sync, the rollout function
# under --async, whose producer then also runs on the rollout manager.
@pytest.mark.parametrize("hook,mode", [("generate", "sync"), ("rollout", "async")])
def test_hooks_train_under_ray(ray_cluster, tiny_qwen2, arith_files, tmp_path, hook, mode):
    """Both functions run on the rollout manager actor (2 engine actors, session affinity), in
    training and eval; under --async the producer runs there too."""
    from rlvr.entrypoints.cli import main

    out = tmp_path / "run"
    flag, fn = {"generate": ("--custom-generate-function-path", "generate"),
                "rollout": ("--rollout-function-path", "generate_rollout")}[hook]
    extra = ["--async", "--max-staleness", "1"] if mode == "async" else []
    argv = train_args(tiny_qwen2, arith_files, out, flag, f"tests.test_agents_cli:{fn}", "--ray",
                      "--actor-num-cpu-workers-per-node", "2", "--rollout-num-engines", "2", *extra)
    assert main(argv) == 0
    if hook == "generate":
        check_multi_turn_run(out, dumps=mode == "sync")
    else:
        check_rollout_function_run(out, staleness=1 if mode == "async" else 0)
