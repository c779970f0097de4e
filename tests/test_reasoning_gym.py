"""reasoning-gym task families: prompt data (specs, disjoint splits, the curriculum stream), the
``reasoning_gym`` reward (final-answer reading on real SmolLM2 replies, equal to each task's own
``score_answer``), per-task metrics, and real ``rlvr train`` runs on a mix: two rollouts, and a
curriculum that survives SIGKILL + ``--load``."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")  # the `tasks` extra; `make test` installs it (dev extra)

from reasoning_gym.factory import DATASETS  # noqa: E402

from rlvr.core.errors import DataError  # noqa: E402
from rlvr.core.types import Sample, Status  # noqa: E402
from rlvr.data.reasoning_gym import (FALSE_CREDIT, UNSCORABLE, TaskStream, entry_at, generator_seed, held_out_records,  # noqa: E402
                                     parse_spec, split_of, task_dataset)
from rlvr.rewards import grade, score  # noqa: E402
from rlvr.rewards.reasoning_gym import final_answer, reasoning_gym_reward  # noqa: E402
from tests.support import run_rlvr  # noqa: E402

REPLIES = Path(__file__).parent / "data" / "reasoning_gym_replies.jsonl"


# ---- data -------------------------------------------------------------------------------------
def test_splits_are_disjoint_by_seed_and_by_question():
    """Each split's generators are seeded differently, every question sits in the split its hash
    names, and no question of a mix is in two splits (train: 3,000 draws of the stream)."""
    spec = "reasoning_gym:chain_sum,gcd,count_bits"
    val = held_out_records(parse_spec(spec + "?split=val&size=150"))
    test = held_out_records(parse_spec(spec + "?split=test&size=150"))
    train = TaskStream(parse_spec(spec)).next_prompts(3000)
    questions = {}
    for split, records in (("val", val), ("test", test), ("train", train)):
        questions[split] = {(r.metadata["task"], r.metadata["entry"]["question"]) for r in records}
        assert all(split_of(task, q) == split for task, q in questions[split])
        assert {r.metadata["reasoning_gym"]["seed"] for r in records}.isdisjoint(
            {generator_seed(0, other, t, None, c) for other in ("train", "val", "test") if other != split
             for t in ("chain_sum", "gcd", "count_bits") for c in range(3)})
    assert len(questions["val"]) == len(val) == 150  # distinct within a held-out set
    assert not questions["val"] & questions["test"]
    assert not questions["train"] & (questions["val"] | questions["test"])
    assert {r.metadata["task"] for r in val} == {"chain_sum", "gcd", "count_bits"}
    assert [sum(r.metadata["task"] == t for r in val) for t in ("chain_sum", "gcd", "count_bits")] == [50, 50, 50]


def test_spec_errors_name_the_task_and_the_field(tmp_path):
    cases = {
        "reasoning_gym:chainsum": "unknown reasoning-gym task 'chainsum'; similar: ['chain_sum'",
        "reasoning_gym:rush_hour": "task 'rush_hour' cannot verify its own answers",
        "reasoning_gym:game_of_life_halting": "task 'game_of_life_halting' gives wrong answers full marks",
        "reasoning_gym:chain_sum?colour=red": "unknown spec key(s) ['colour']",
        "reasoning_gym:chain_sum?split=dev": "split must be one of",
        "reasoning_gym:chain_sum=heavy": "weight of chain_sum must be a number",
    }
    bad_key = tmp_path / "bad.yaml"
    bad_key.write_text("tasks:\n  gcd: {config: {max_terms: 3}}\n")
    cases[f"reasoning_gym:{bad_key}"] = "task gcd: unknown config field 'max_terms'; valid: ['max_numbers'"
    owned = tmp_path / "owned.yaml"
    owned.write_text("tasks:\n  chain_sum: {config: {max_terms: 3}}\ncurriculum: true\n")
    cases[f"reasoning_gym:{owned}"] = "task chain_sum: config field(s) ['max_terms'] are set by the curriculum"
    refused = tmp_path / "refused.yaml"
    refused.write_text("tasks:\n  chain_sum: {config: {min_terms: 5, max_terms: 2}}\n")
    cases[f"reasoning_gym:{refused}"] = "task chain_sum: the generator refuses config"
    for spec, message in cases.items():
        with pytest.raises(DataError) as e:
            parse_spec(spec)
        assert message in str(e.value), (spec, str(e.value))


def test_a_configuration_refused_only_while_generating_names_the_field(tmp_path):
    """simple_equations builds a dataset from two operators without operators_weights; only its
    first draw fails, inside random.choices: the spec check draws, and names the field."""
    parse_spec("reasoning_gym:simple_equations?size=50")  # its defaults generate
    refused = tmp_path / "refused.yaml"
    refused.write_text("tasks:\n  chain_sum: {}\n  simple_equations: {config: {operators: ['+', '-'], min_terms: 2}}\n")
    with pytest.raises(DataError) as e:
        parse_spec(f"reasoning_gym:{refused}")
    assert str(e.value) == (f"reasoning_gym:{refused}: task simple_equations: the generator refuses config field(s) "
                            "['operators']: ValueError: The number of weights does not match the population")


@pytest.mark.slow
def test_a_refused_spec_stops_a_resumed_run_before_the_model_loads(tiny_qwen2, tmp_path):
    """A run resumed (--load) with a spec its generator refuses fails in one line naming the
    flag, the spec, the task, the field and reasoning-gym's message; the run's files and its
    checkpoint are unchanged, and the run resumes with the spec mended."""
    mix, weighted = tmp_path / "mix.yaml", "{operators: ['+', '-'], operators_weights: [0.5, 0.5]}"
    mix.write_text(f"tasks:\n  chain_sum: {{config: {{min_terms: 2, max_terms: 2}}}}\n  simple_equations: "
                   f"{{config: {weighted}}}\n")
    run = tmp_path / "run"
    assert (r := rlvr(*_args(tiny_qwen2, mix, run, 1, "--save", str(run / "ckpt")))).returncode == 0, r.stderr[-3000:]

    def files():
        return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}

    before, resume = files(), _args(tiny_qwen2, mix, run, 2, "--save", str(run / "ckpt"), "--load", str(run / "ckpt"))
    mix.write_text(mix.read_text().replace(weighted, "{operators: ['+', '-']}"))
    refused = rlvr(*resume)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"rlvr train: error: --prompt-data: reasoning_gym:{mix}: task simple_equations: the generator refuses config "
        "field(s) ['operators']: ValueError: The number of weights does not match the population"]
    assert files() == before
    mix.write_text(mix.read_text().replace("{operators: ['+', '-']}", weighted))
    resumed = rlvr(*resume)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [x["rollout/step"] for x in _records(run) if "rollout/step" in x] == [0, 1]


def test_missing_package_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # what an install without the extra sees
    with pytest.raises(DataError, match=r"needs the reasoning-gym package: pip install 'rlvr\[tasks\]'"):
        parse_spec("reasoning_gym:chain_sum")


def test_cli_checks_of_specs(tmp_path):
    from rlvr.core.errors import ConfigError
    from rlvr.runtime.configure import check_data
    from rlvr.config import DataConfig, EvalConfig

    with pytest.raises(ConfigError, match="--prompt-data: .*held-out split"):
        check_data(DataConfig(prompt_data="reasoning_gym:gcd?split=test"), EvalConfig())
    with pytest.raises(ConfigError, match="--eval-prompt-data: v: .*unknown reasoning-gym task"):
        check_data(DataConfig(prompt_data="reasoning_gym:gcd"), EvalConfig(eval_prompt_data=["v", "reasoning_gym:x"]))
    with pytest.raises(ConfigError, match="--rollout-max-prompt-len: applies to prompt files"):
        check_data(DataConfig(prompt_data="reasoning_gym:gcd", rollout_max_prompt_len=64), EvalConfig())
    from rlvr.runtime.configure import merged_values, make_parser

    values = merged_values(make_parser().parse_args(["--prompt-data", "reasoning_gym:gcd?size=80", "--num-epoch", "2",
                                                     "--rollout-batch-size", "8"]))
    assert values["num_rollout"] == 20  # an epoch is the spec's size


def test_the_recipe_evaluates_whatever_mix_prompt_data_names(tmp_path):
    """The recipe's eval set is ``reasoning_gym:?split=val&size=96``: the training mix's tasks, so
    changing ``--prompt-data`` alone changes what is evaluated."""
    from rlvr.core.errors import ConfigError
    from rlvr.runtime.build import read_eval_sets
    from rlvr.runtime.configure import merged_values, make_parser, parse_config

    recipe = ["--config", "examples/reasoning_gym/grpo.yaml"]
    values = merged_values(make_parser().parse_args(recipe))
    assert values["eval_prompt_data"] == ["val", "reasoning_gym:examples/reasoning_gym/mix.yaml?split=val&size=96"]
    mix = tmp_path / "other.yaml"
    mix.write_text("seed: 5\ntasks:\n  gcd: {level: 0}\n  lcm: {level: 0}\n")
    cfg = parse_config(recipe + ["--prompt-data", f"reasoning_gym:{mix}", "--eval-prompt-data", "val",
                                 "reasoning_gym:?split=val&size=6"])
    records = read_eval_sets(cfg)["val"]
    assert sorted(r.metadata["task"] for r in records) == ["gcd"] * 3 + ["lcm"] * 3
    named = read_eval_sets(parse_config(recipe + ["--prompt-data", f"reasoning_gym:{mix}", "--eval-prompt-data",
                                                  "val", f"reasoning_gym:{mix}?split=val&size=6"]))["val"]
    assert [r.prompt for r in records] == [r.prompt for r in named]  # the same questions as naming the file
    with pytest.raises(ConfigError, match="--eval-prompt-data: .*takes them from --prompt-data.*name the tasks"):
        merged_values(make_parser().parse_args(["--prompt-data", "data.jsonl", "--eval-prompt-data",
                                                "reasoning_gym:?split=val"]))


def test_small_task_space_fails_with_the_task_named():
    with pytest.raises(DataError, match="task products: only .* distinct val questions"):
        held_out_records(_level0("products", "val", 40))


def _level0(task: str, split: str, size: int):
    spec = parse_spec(f"reasoning_gym:{task}?split={split}&size={size}")
    spec.tasks[0].level = 0  # 1-digit x 1-digit products: 100 questions in all
    return spec


# ---- the reward ---------------------------------------------------------------------------------
def test_reward_equals_score_answer_on_extracted_answers_for_every_task():
    """For every task that scores its own answers: the reward of a reply equals the task's own
    ``score_answer`` on the answer read from it (the stored answer in tags, stated, and a wrong
    one); the stored answer in tags scores 1. The five tasks that cannot score their own stored
    answer are exactly ``UNSCORABLE``, and the tasks whose ``score_answer`` gives a wrong answer
    (a number no task asks for, or the opposite True/False or Yes/No) full marks are exactly
    ``FALSE_CREDIT``."""
    unscorable, false_credit = set(), set()
    opposite = {"True": "False", "False": "True", "Yes": "No", "No": "Yes"}
    for task in sorted(set(DATASETS) - {"composite"}):
        ds = task_dataset(task, "{}", None, generator_seed(0, "test", task, None, 0), 4)
        entry, locator = ds[0], {"task": task, "config": {}, "level": None, "seed": ds.seed, "size": 4, "index": 0}
        if ds.score_answer(entry["answer"], entry) < 1.0:
            unscorable.add(task)
            continue
        answer = str(entry["answer"])
        if any(ds.score_answer(wrong, entry) >= 1.0 for wrong in ("123456789", opposite.get(answer.strip()))
               if wrong is not None and wrong != answer):
            false_credit.add(task)
        for reply in (f"<answer>{answer}</answer>", f"The answer is {answer}.", "The answer is 123456789."):
            s = Sample("", [], label=answer, metadata={"reasoning_gym": locator}, response=reply)
            expected = ds.score_answer(final_answer(reply, answer), entry_at(locator))
            assert reasoning_gym_reward(s) == expected, (task, reply)
        tagged = Sample("", [], label=answer, metadata={"reasoning_gym": locator}, response=f"<answer>{answer}</answer>")
        assert reasoning_gym_reward(tagged) == 1.0, task
    assert unscorable == UNSCORABLE
    assert false_credit == FALSE_CREDIT


def test_extraction_on_real_smollm2_replies():
    """Replies SmolLM2-135M-Instruct wrote (examples/reasoning_gym/make_reply_fixture.py says how);
    ``expected`` is the final answer a careful grader reads, reviewed by hand reply by reply
    (null: no committed answer, or a hedge)."""
    rows = [json.loads(line) for line in REPLIES.read_text().splitlines()]
    assert len(rows) >= 100 and {r["task"] for r in rows} >= {"chain_sum", "products", "gcd", "spell_backward"}
    for r in rows:
        got = final_answer(r["reply"], r["answer"], truncated=r["truncated"])
        assert got == r["expected"], (r["reply"], got, r["expected"])
        s = Sample("", [], label=r["answer"], metadata={"reasoning_gym": r["reasoning_gym"]}, response=r["reply"],
                   status=Status.TRUNCATED if r["truncated"] else Status.COMPLETED)
        entry = entry_at(r["reasoning_gym"])
        assert reasoning_gym_reward(s) == task_dataset(
            r["task"], "{}", 0, r["reasoning_gym"]["seed"], r["reasoning_gym"]["size"]).score_answer(got, entry)
    credited = [r for r in rows if r["expected"] is not None and r["expected"] == r["answer"]]
    assert len(credited) >= 5  # the model is right sometimes, and the reading sees it


@pytest.mark.parametrize("reply, oracle, truncated, expected", [
    ("The answer is 16 or 17.", "16", False, None),  # hedged
    ("1. The answer is 1.\n2. The answer is 2.", "2", False, None),  # listed
    ("The answer is 1,234.", "1234", False, "1234"),
    ("**Answer:** 42", "42", False, "42"),
    ("So 2 * 8 = 16\n\nThe final answer is 4.", "16", False, "4"),  # the committed answer, not the work
    ("2 * 8 = 16 and then we", "16", True, None),  # cut off before committing
    ("The answer is 16. Let me also check 2 * 8 again, which", "16", True, "16"),  # stated before the cut
    ("\\boxed{-7}", "-7", False, "-7"),
    ("ainomma", "ainomma", False, "ainomma"),
    ("I think it is\nsomething else entirely", "ainomma", False, None),  # a text answer needs one line
])
def test_final_answer_forms(reply, oracle, truncated, expected):
    assert final_answer(reply, oracle, truncated) == expected


def test_reward_composes_with_format_and_needs_its_metadata():
    record = held_out_records(parse_spec("reasoning_gym:products?split=test&size=1"))[0]
    both = score("reasoning_gym=0.9,format=0.1", f"<think>x</think><answer>{record.label}</answer>", record.label,
                 **record.metadata)
    assert both == pytest.approx(1.0)
    wrong = score("reasoning_gym=0.9,format=0.1", "<think>x</think><answer>-1</answer>", record.label, **record.metadata)
    assert wrong == pytest.approx(0.1)
    untagged = score("reasoning_gym=0.9,format=0.1", f"The answer is {record.label}.", record.label, **record.metadata)
    assert untagged == pytest.approx(0.9)
    from rlvr.data.reasoning_gym import task_score

    outcome = grade("reasoning_gym=0.9,format=0.1", f"The answer is {record.label}.", record.label, **record.metadata)
    assert task_score(Sample("", [], reward=outcome.as_reward())) == 1.0  # the curriculum counts the task's own part

    outcome = grade("reasoning_gym", "The answer is 3.", "3")
    assert outcome.score == 0.0 and "neither a 'reasoning_gym' locator" in outcome.error


# ---- curriculum -------------------------------------------------------------------------------------
def _graded(records, correct):
    return [Sample("", [], label=r.label, metadata=r.metadata, reward=1.0 if ok else 0.0)
            for r, ok in zip(records, correct)]


def test_curriculum_raises_and_lowers_levels_by_rolling_accuracy(tmp_path):
    spec = tmp_path / "mix.yaml"
    spec.write_text("tasks:\n  chain_sum: {level: 1}\ncurriculum: {window: 4, raise_at: 0.75, lower_at: 0.25}\n")
    stream = TaskStream(parse_spec(f"reasoning_gym:{spec}"))
    first = stream.next_prompts(4)
    assert {r.metadata["reasoning_gym"]["level"] for r in first} == {1}
    m = stream.observe(_graded(first[:3], [True, True, False]))  # window not full: no move
    assert m == {"curriculum/chain_sum/accuracy": pytest.approx(2 / 3), "curriculum/chain_sum/level": 1.0}
    m = stream.observe(_graded(first[3:], [True]))  # 3 of 4 >= 0.75: up
    assert m["curriculum/chain_sum/level"] == 2.0 and stream.windows["chain_sum"].maxlen == 4
    assert stream.observe(_graded(first, [False] * 4))["curriculum/chain_sum/level"] == 2.0  # drawn at level 1: ignored
    second = stream.next_prompts(4)
    assert {r.metadata["reasoning_gym"]["level"] for r in second} == {2}
    assert {r.metadata["entry"]["metadata"]["num_terms"] for r in second} <= {2, 3, 4}
    assert stream.observe(_graded(second, [True, False, False, False]))["curriculum/chain_sum/level"] == 1.0


def test_stream_state_round_trips_exactly(tmp_path):
    spec = tmp_path / "mix.yaml"
    spec.write_text("tasks:\n  chain_sum: {level: 2}\n  gcd: {weight: 1}\ncurriculum: {window: 3, raise_at: 1.0, "
                    "lower_at: 0.5}\n")
    a = TaskStream(parse_spec(f"reasoning_gym:{spec}"))
    a.observe(_graded(a.next_prompts(20), [False] * 20))
    state = json.loads(json.dumps(a.state_dict()))  # what a checkpoint keeps is plain data
    b = TaskStream(parse_spec(f"reasoning_gym:{spec}"))
    b.load_state_dict(state)
    assert b.levels == a.levels and a.levels["chain_sum"] < 2
    assert [(r.prompt, r.metadata["reasoning_gym"]) for r in a.next_prompts(9)] == \
           [(r.prompt, r.metadata["reasoning_gym"]) for r in b.next_prompts(9)]


# ---- real runs ----------------------------------------------------------------------------------------
rlvr = run_rlvr  # python -m rlvr on one thread, SIGKILLed at a crash point when asked


def _mix(tmp_path: Path) -> Path:
    path = tmp_path / "mix.yaml"
    path.write_text("seed: 1\ntasks:\n  chain_sum: {level: 3}\n  products: {level: 2}\n  count_bits: {level: 1}\n"
                    "curriculum: {window: 4, raise_at: 0.9, lower_at: 0.5}\n")
    return path


def _args(ckpt, mix: Path, out: Path, rollouts: int, *extra) -> list[str]:
    return ["train", "--hf-checkpoint", str(ckpt), "--prompt-data", f"reasoning_gym:{mix}",
            "--eval-prompt-data", "val", f"reasoning_gym:{mix}?split=val&size=6",
            "--n-samples-per-eval-prompt", "2", "--eval-temperature", "1.0",
            "--rm-type", "reasoning_gym=0.9,format=0.1", "--apply-chat-template", "--rollout-batch-size", "3",
            "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4", "--num-rollout", str(rollouts),
            "--lr", "1e-3", "--output-dir", str(out), "--use-tensorboard", *extra]


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_rollouts_on_a_mix_log_per_task_metrics(tiny_qwen2, tmp_path):
    run = tmp_path / "run"
    r = rlvr(*_args(tiny_qwen2, _mix(tmp_path), run, 2))
    assert r.returncode == 0, r.stderr[-3000:]
    records = _records(run)
    rollouts = [x for x in records if "rollout/step" in x]
    evals = [x for x in records if "eval/step" in x]
    assert [x["rollout/step"] for x in rollouts] == [0, 1] and len(evals) == 2
    for task in ("chain_sum", "products", "count_bits"):
        assert f"rollout/curriculum/{task}/level" in rollouts[0] and f"rollout/curriculum/{task}/level" in rollouts[1]
        assert 0.0 <= evals[-1][f"eval/val/{task}"] <= 1.0 and f"eval/val/passrate/{task}/pass@2" in evals[-1]
        assert all(0.0 < evals[-1][f"eval/val/{share}/{task}"] <= 1.0 for share in ("reply_share", "label_share"))
    drawn = {k.split("/")[-1] for x in rollouts for k in x if k.startswith("rollout/raw_reward/")}
    assert drawn and drawn <= {"chain_sum", "products", "count_bits"}
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    assert sample["task"] in drawn
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    from PIL import Image

    with Image.open(run / "curves.png") as img:
        panels = dict(p.split(": ", 1) for p in img.text["Description"].split(" | "))
    assert {f"task {t}" for t in drawn} <= set(panels)
    assert all("rollout/raw_reward/" in panels[f"task {t}"] and "eval/val/" in panels[f"task {t}"] for t in drawn)


@pytest.mark.slow
def test_curriculum_levels_survive_sigkill_and_load(tiny_qwen2, tmp_path):
    """The tiny model answers nothing right, so each task's level falls as its window fills
    (lower_at 0.5). A run SIGKILLed mid-rollout 3 and resumed with --load logs the same levels,
    windows and draws as one never stopped, and ends in the same data state."""
    mix, extra = _mix(tmp_path), ("--save-interval", "1", "--deterministic-mode")
    whole = tmp_path / "whole"
    r = rlvr(*_args(tiny_qwen2, mix, whole, 5, "--save", str(whole / "ckpt"), *extra))
    assert r.returncode == 0, r.stderr[-3000:]
    cut = tmp_path / "cut"
    cmd = _args(tiny_qwen2, mix, cut, 5, "--save", str(cut / "ckpt"), "--load", str(cut / "ckpt"), *extra)
    killed = rlvr(*cmd, kill_at="rollout:3")
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = rlvr(*cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    def curriculum(run):
        return [{k: v for k, v in x.items() if "curriculum" in k or "raw_reward/" in k}
                for x in _records(run) if "rollout/step" in x]

    levels = curriculum(whole)
    assert len(levels) == 5 and levels == curriculum(cut)
    assert levels[-1]["rollout/curriculum/chain_sum/level"] < 3  # the levels moved during the run
    import torch

    def state(run):
        return torch.load(run / "ckpt" / "rollout_000005" / "run_state.pt", weights_only=False)["data_source"]

    assert state(whole) == state(cut)


_DIGESTS = r"""
import hashlib, json, sys
from rlvr.data.reasoning_gym import task_dataset
out = {}
for task, level in json.loads(sys.argv[1]):
    ds = task_dataset(task, "{}", level, 1234, 8)
    text = json.dumps([(ds[i]["question"], str(ds[i]["answer"])) for i in range(8)])
    out[f"{task}@{level}"] = hashlib.sha256(text.encode()).hexdigest()
print(json.dumps(out))
"""


def test_hash_seeded_tasks_need_a_fixed_hash_seed(monkeypatch):
    """The tasks of ``HASH_SEEDED`` generate other questions from the same generator seed under another
    string hash seed (two processes, PYTHONHASHSEED 1 and 2), the recipe's families do not; a spec
    naming one of them is refused, before any model loads, unless PYTHONHASHSEED is fixed."""
    import os
    import subprocess

    from rlvr.data.reasoning_gym import HASH_SEEDED

    probes = [[t, 0 if t == "codeio" else None] for t in sorted(HASH_SEEDED)]
    probes += [[t, 0] for t in ("chain_sum", "products", "letter_counting", "basic_arithmetic")]
    digests = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        run = subprocess.run([sys.executable, "-c", _DIGESTS, json.dumps(probes)], capture_output=True, text=True,
                             env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        digests.append(json.loads(run.stdout.strip().splitlines()[-1]))
    differ = {key.split("@")[0] for key in digests[0] if digests[0][key] != digests[1][key]}
    assert differ == set(HASH_SEEDED)

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(DataError, match="task ransom_note: its questions depend on Python's string hash seed.*"
                                        "PYTHONHASHSEED=0"):
        parse_spec("reasoning_gym:chain_sum,ransom_note")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert [t.name for t in parse_spec("reasoning_gym:chain_sum,ransom_note").tasks] == ["chain_sum", "ransom_note"]
