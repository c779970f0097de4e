"""The nested YAML config for slime and its launch commands: the mapping onto rlvr's fields, field by
field; the refusals and warnings, one line each; and the example file trained for 2 rollouts,
resumed with --resume_from and exported, through the real commands."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlvr.compat.slime import seed_config
from rlvr.compat.slime.seed_commands import export_argv, train_argv
from rlvr.config import FIELDS
from rlvr.config.parse import DEFAULTS
from rlvr.core.errors import ConfigError
from rlvr.runtime.checkpoint import find_checkpoint
from rlvr.runtime.configure import make_parser, merged_values

SERIAL_GROUP = "ray"  # one xdist worker for the group's modules (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "slime_seed" / "grpo_math_7b.yaml"
# The four parallel sizes the original file has and the example sets to 1.
SEED_PARALLEL = {"rollout": {"gpu_per_engine": 2}, "distributed": {"training_nodes": 4, "tp_size": 4, "pp_size": 2}}


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def verbatim() -> dict:
    """The original file (the example with its four parallel sizes put back)."""
    raw = example()
    for group, values in SEED_PARALLEL.items():
        raw[group].update(values)
    raw["actor_rollout_ref"]["model"]["path"] = "/path/to/qwen2.5-7b-instruct"
    return raw


def translate(raw: dict, **given):
    return seed_config.translate(raw, "f.yaml", given, DEFAULTS)


def test_every_field_of_the_example_maps_onto_its_rlvr_field():
    out = translate(example())
    assert out.refused == []
    assert out.values == {
        "hf_checkpoint": "examples/arith/assets/sft", "num_epoch": 2, "rollout_batch_size": 512,
        "global_batch_size": 256 * 8, "micro_batch_size": 64 * 8, "lr": "1e-6", "weight_decay": 0.01,
        "save_interval": 100, "eval_interval": 50, "advantage_estimator": "grpo", "n_samples_per_prompt": 8,
        "kl_loss_type": "k1", "kl_loss_coef": 0.001, "use_kl_loss": True, "eps_clip": 0.2, "entropy_coef": 0.0,
        "rollout_num_engines": 4, "rollout_max_response_len": 4096, "rollout_temperature": 0.8, "rollout_top_p": 0.95,
        "actor_num_nodes": 1, "colocate": False, "async_train": True, "rollout_concurrency": 40 // 8,
        "max_staleness": 3, "rm_type": "math=1.0,format=0.1"}
    assert set(out.values) <= set(FIELDS)
    assert out.origin["global_batch_size"] == "training.train_batch_size"


def test_the_seed_file_as_printed_is_refused_one_line_per_field(tmp_path):
    path = tmp_path / "grpo_math_7b.yaml"
    path.write_text(yaml.safe_dump(verbatim()))
    with pytest.raises(ConfigError) as e:
        merged_values(make_parser().parse_args(["--config", str(path)]))
    header, *lines = str(e.value).splitlines()
    assert header.startswith("--config: ") and "4 field(s)" in header
    assert [line.split(":")[0].strip() for line in lines] == [
        "distributed.tp_size 4", "distributed.pp_size 2", "rollout.gpu_per_engine 2", "distributed.training_nodes 4"]
    assert "no tensor parallelism" in lines[0] and "--rollout-external-engine-addrs" in lines[2] and "--ray" in lines[3]


def test_the_example_warns_once_per_ignored_field_and_once_about_kl(caplog):
    with caplog.at_level(logging.WARNING, logger="rlvr.compat.slime.seed_config"):
        values = merged_values(make_parser().parse_args(["--config", str(EXAMPLE), "--num-rollout", "2"]))
    lines = [r.getMessage() for r in caplog.records if r.name == "rlvr.compat.slime.seed_config"]
    assert len(lines) == 4, lines
    assert sum("kl_estimator_k1 is slime's --kl-loss-type k1" in line for line in lines) == 1
    for key in ("distributed.tp_size 1", "distributed.pp_size 1", "rollout.gpu_per_engine 1"):
        assert sum(key in line for line in lines) == 1
    assert values["lr"] == 1e-6 and values["rm_type"] == "math=1.0,format=0.1"  # coerced like any YAML value


@pytest.mark.parametrize("kl, expected, warns", [
    ("kl_estimator_k1", "k1", True), ("kl_estimator_k3", "k3", True), ("token_level_kl", "token_level_kl", False),
    ("k3", "k3", False), ("low_var_kl", "low_var_kl", False),
])
def test_kl_type_follows_slimes_names(kl, expected, warns):
    out = translate({"algorithm": {"kl_type": kl, "kl_coef": 0.01}})
    assert out.values["kl_loss_type"] == expected and out.values["use_kl_loss"] is True
    assert len(out.warnings) == int(warns)


def test_zero_kl_coef_adds_no_kl_term_and_an_unknown_kl_type_is_refused():
    assert "use_kl_loss" not in translate({"algorithm": {"kl_coef": 0.0}}).values
    assert translate({"algorithm": {"kl_type": "k4"}}).refused[0].startswith("algorithm.kl_type: unknown 'k4'")


def test_batch_sizes_count_prompts_times_the_group_in_effect():
    training = {"train_batch_size": 6, "ppo_mini_batch_size": 3, "gradient_accumulation": 2}
    out = translate({"training": training, "algorithm": {"group_size": 4}})
    assert (out.values["global_batch_size"], out.values["micro_batch_size"]) == (24, 12)
    out = translate({"training": training, "algorithm": {"group_size": 4}}, n_samples_per_prompt=2)  # the command line's
    assert (out.values["global_batch_size"], out.values["micro_batch_size"]) == (12, 6)
    out = translate({"training": {"train_batch_size": 6, "gradient_accumulation": 3}})  # rlvr's default group: 8
    assert (out.values["global_batch_size"], out.values["micro_batch_size"]) == (48, 16)
    bad = translate({"training": {**training, "gradient_accumulation": 3}}).refused
    assert len(bad) == 1 and "ppo_mini_batch_size 3 x gradient_accumulation 3 = 9" in bad[0]


def test_concurrency_counts_whole_groups_and_says_so_when_it_rounds():
    out = translate({"async_rollout": {"concurrency": 42}, "algorithm": {"group_size": 8}})
    assert out.values["rollout_concurrency"] == 5 and "5 groups of 8 = 40 requests" in out.warnings[0]


def test_training_nodes_need_ray():
    assert translate({"distributed": {"training_nodes": 2}}, ray=True).values["actor_num_nodes"] == 2
    assert "needs Ray" in translate({"distributed": {"training_nodes": 2}}).refused[0]


def test_rewards_become_the_weighted_composite_and_bad_entries_are_refused():
    out = translate({"reward": [{"type": "math_verify"}, {"type": "dapo", "weight": 0.5}]})
    assert out.values["rm_type"] == "math=1.0,dapo=0.5"
    refused = translate({"reward": [{"type": "math_verify", "weight": "high"}, {"kind": "x"}]}).refused
    assert refused[0].startswith("reward[0].weight") and refused[1].startswith("reward[1]")


def test_unknown_keys_are_refused_with_the_closest_key_and_rlvr_fields_may_sit_beside(tmp_path):
    assert "did you mean 'training.lr'" in translate({"training": {"lrr": 1}}).refused[0]
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump({"algorithm": {"group_size": 4}, "prompt-data": "x.jsonl"}))
    values = merged_values(make_parser().parse_args(["--config", str(path)]))
    assert values["prompt_data"] == "x.jsonl" and values["n_samples_per_prompt"] == 4
    path.write_text(yaml.safe_dump({"algorithm": {"group_size": 4}, "n_samples_per_prompt": 2}))
    with pytest.raises(ConfigError, match="set twice, by algorithm.group_size"):
        merged_values(make_parser().parse_args(["--config", str(path)]))


def test_a_flat_rlvr_file_is_not_read_as_the_seed_schema():
    assert not seed_config.is_seed_schema({"rollout": {"rollout_batch_size": 4}, "reward": {"rm_type": "math"}})
    assert seed_config.is_seed_schema({"reward": [{"type": "math_verify"}]})


def test_docs_map_every_seed_field():
    doc = (ROOT / "docs" / "slime_flags.md").read_text()
    section = doc[doc.index("## The nested YAML file and its commands"):]
    for key in seed_config.documented_keys():
        assert f"`{key}`" in section, key
    for flag in ("--experiment_name", "--output_dir", "--resume_from", "--megatron_ckpt"):
        assert f"{flag} " in section, flag


def test_the_commands_flags_become_rlvr_flags():
    assert train_argv(["--output_dir", "d", "--save", "s"]) == ["--save", "s", "--output-dir", "d"]
    assert export_argv(["--megatron_ckpt", "d/rollout_2", "--output_dir", "o", "--adapter-only"]) == [
        "d/rollout_2", "o", "--adapter-only"]


def test_load_names_a_checkpoint_padded_or_as_the_seed_writes_it(tmp_path):
    ckpt = tmp_path / "rollout_000100"
    ckpt.mkdir()
    (ckpt / "run_state.pt").write_bytes(b"")
    assert find_checkpoint(ckpt) == ckpt and find_checkpoint(tmp_path / "rollout_100") == ckpt
    with pytest.raises(ConfigError, match="rollout_7 is not a complete checkpoint"):
        find_checkpoint(tmp_path / "rollout_7")
    assert find_checkpoint(tmp_path) is None  # a --save directory with no pointer yet: start fresh


# ---- the example end to end, through its commands ------------------------------------------------
def command(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=ROOT)


def sizes(ckpt: Path, train: Path) -> list[str]:
    """The model path and the sizes a CPU runs in seconds; everything else comes from the file."""
    return ["--hf-checkpoint", str(ckpt), "--prompt-data", str(train), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--global-batch-size", "8", "--micro-batch-size", "4",
            "--rollout-max-response-len", "6", "--rollout-num-engines", "1", "--num-rollout", "2",
            "--save-interval", "1"]


def rollout_steps(run_dir: Path) -> list[int]:
    return [r["rollout/step"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "rollout/step" in r]


@pytest.mark.slow
def test_the_seed_example_trains_resumes_and_exports(tiny_qwen2, arith_files, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "grpo_math_7b"
    run = command("rlvr.train", "--config", str(EXAMPLE), "--experiment_name", "qwen7b_math_grpo_v1",
                  "--output_dir", str(out), *sizes(tiny_qwen2, arith_files[0]))
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in out.glob("rollout_*")) == ["rollout_000001", "rollout_000002"]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["asynchronous"]["async_train"] and saved["reward"]["rm_type"] == "math=1.0,format=0.1"
    assert saved["algo"]["kl_loss_type"] == "k1" and saved["run"]["tb_experiment_name"] == "qwen7b_math_grpo_v1"
    assert rollout_steps(out) == [0, 1]

    resumed = command("rlvr.train", "--config", str(EXAMPLE), "--resume_from", str(out / "rollout_1"),
                      *sizes(tiny_qwen2, arith_files[0]))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {out / 'rollout_000001'}: rollout 1" in resumed.stderr
    assert "differ from the checkpoint" not in resumed.stderr
    assert rollout_steps(out) == [0, 1]  # rollout 1 cut and logged again, once

    hf = tmp_path / "hf"
    export = command("rlvr.export_hf", "--megatron_ckpt", str(out / "rollout_2"), "--output_dir", str(hf))
    assert export.returncode == 0, export.stderr[-3000:]
    model = AutoModelForCausalLM.from_pretrained(hf)
    trained = load_file(out / "rollout_000002" / "model.safetensors")
    state = model.state_dict()
    assert all((state[k] == v).all() for k, v in trained.items() if k in state) and len(trained) > 0
    initial = load_file(tiny_qwen2 / "model.safetensors")
    assert any(not (initial[k] == v).all() for k, v in trained.items())  # the 2 rollouts trained it
