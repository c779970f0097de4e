import pytest

from rlvr.runtime.configure import parse_config
from rlvr.core.errors import ConfigError


@pytest.fixture()
def base(tiny_qwen2, arith_files):
    return ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0])]


def test_flags_use_slime_names_and_derive_batch_numbers(base):
    cfg = parse_config(base + ["--rollout-batch-size", "4", "--n-samples-per-prompt", "8",
                               "--global-batch-size", "16", "--use-kl-loss", "--kl-loss-coef", "0.01",
                               "--kl-loss-type", "low_var_kl", "--eps-clip-high", "0.28"])
    assert cfg.samples_per_rollout == 32 and cfg.global_batch_size == 16 and cfg.steps_per_rollout == 2
    assert cfg.algo.use_kl_loss and cfg.algo.kl_loss_coef == 0.01 and cfg.algo.clip_range() == (0.2, 0.28)


def test_yaml_is_read_and_flags_override_it(base, tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("rollout-batch-size: 4\nn_samples_per_prompt: 2\nalgo:\n  eps_clip: 0.1\nlr: 0.5\n")
    cfg = parse_config(base + ["--config", str(y), "--lr", "0.25"])
    assert cfg.rollout.rollout_batch_size == 4 and cfg.rollout.n_samples_per_prompt == 2
    assert cfg.algo.eps_clip == 0.1 and cfg.train.lr == 0.25


def test_global_batch_must_divide_rollout(base):
    with pytest.raises(ConfigError, match=r"--global-batch-size: 5 must divide .* = 64"):
        parse_config(base + ["--global-batch-size", "5"])


def test_unknown_rm_type_lists_valid_ones(base):
    with pytest.raises(ConfigError, match=r"--rm-type: unknown reward 'nope'; valid: .*math"):
        parse_config(base + ["--rm-type", "nope"])


def test_environment_reward_needs_an_environment(base):
    with pytest.raises(ConfigError, match=r"--rm-type: 'environment' is the reward an environment gave"):
        parse_config(base + ["--rm-type", "environment=0.9,format=0.1"])
    cfg = parse_config(base + ["--rm-type", "environment=0.9,format=0.1", "--apply-chat-template",
                               "--environment-path", "tests.test_agent_tools:make_env"])
    assert cfg.reward.rm_type == "environment=0.9,format=0.1"


def test_unknown_yaml_field_suggests_the_right_one(base, tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("rollout-batchsize: 4\n")
    with pytest.raises(ConfigError, match=r"unknown field 'rollout-batchsize'; did you mean 'rollout-batch-size'"):
        parse_config(base + ["--config", str(y)])


def test_yaml_type_errors_name_the_flag(base, tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("num-rollout: many\n")
    with pytest.raises(ConfigError, match=r"--num-rollout: .*expected int, got 'many'"):
        parse_config(base + ["--config", str(y)])


def test_missing_checkpoint_and_bad_dynamic_batch(base, tmp_path):
    with pytest.raises(ConfigError, match="--hf-checkpoint"):
        parse_config(["--hf-checkpoint", str(tmp_path), "--prompt-data", base[3]])
    with pytest.raises(ConfigError, match="--max-tokens-per-gpu"):
        parse_config(base + ["--use-dynamic-batch-size"])
    with pytest.raises(ConfigError, match="--max-tokens-per-gpu"):
        parse_config(base + ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "16",
                             "--rollout-max-response-len", "32"])


def test_resolved_config_round_trips(base, tmp_path):
    cfg = parse_config(base + ["--lr", "0.003"])
    path = cfg.save_yaml(tmp_path / "config.yaml")
    again = parse_config(["--config", str(path)])
    assert again.to_dict() == cfg.to_dict()


def test_lr_schedule_flags(base):
    cfg = parse_config(base + ["--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine",
                               "--lr-warmup-iters", "2"])
    assert (cfg.train.lr_decay_style, cfg.train.min_lr, cfg.train.lr_warmup_iters) == ("cosine", 1e-4, 2)
    with pytest.raises(ConfigError, match="--min-lr"):
        parse_config(base + ["--lr", "1e-3", "--min-lr", "1e-2"])
    with pytest.raises(SystemExit):  # argparse rejects a style outside the choices
        parse_config(base + ["--lr-decay-style", "step"])


def test_lr_follows_the_schedule_in_training(tiny_qwen2):
    from rlvr.algo import AlgoConfig
    from rlvr.config import TrainConfig
    from rlvr.train.trainer import Trainer
    from rlvr.core.types import Sample

    tr = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), lr=1.0e-3, min_lr=0.0, lr_decay_style="linear"),
                 AlgoConfig(), total_steps=3)
    sample = Sample("", [1, 2, 3], response_ids=[4, 5], loss_mask=[1, 1])
    lrs = [tr.train_sft([sample])["train/lr"] for _ in range(3)]
    assert lrs == pytest.approx([1.0e-3, 0.5e-3, 0.0])


def test_none_on_the_command_line_unsets_an_optional_yaml_value(base, tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("dynamic-sampling-filter-path: nonzero_std\neps-clip-high: 0.28\n")
    cfg = parse_config(base + ["--config", str(y), "--dynamic-sampling-filter-path", "none",
                               "--eps-clip-high", "null"])
    assert cfg.rollout.dynamic_sampling_filter_path is None and cfg.algo.eps_clip_high is None


def test_engine_and_partial_rollout_flags_are_validated(base):
    cfg = parse_config(base + ["--partial-rollout", "--mask-offpolicy-in-partial-rollout",
                               "--over-sampling-batch-size", "16",
                               "--rollout-external-engine-addrs", "127.0.0.1:30000", "localhost:30001"])
    assert cfg.rollout.partial_rollout and cfg.rollout.over_sampling_batch_size == 16
    assert cfg.engine.rollout_external_engine_addrs == ["127.0.0.1:30000", "localhost:30001"]
    with pytest.raises(ConfigError, match="--mask-offpolicy-in-partial-rollout: only acts with --partial-rollout"):
        parse_config(base + ["--mask-offpolicy-in-partial-rollout"])
    with pytest.raises(ConfigError, match=r"--rollout-external-engine-addrs: 'localhost' is not host:port"):
        parse_config(base + ["--rollout-external-engine-addrs", "localhost"])
    with pytest.raises(ConfigError, match=r"--over-sampling-batch-size: must be >= --rollout-batch-size"):
        parse_config(base + ["--over-sampling-batch-size", "1"])


def test_engine_flags_are_the_engine_group_with_declared_bounds(base, tmp_path):
    cfg = parse_config(base + ["--rollout-num-engines", "2", "--use-fault-tolerance", "--rollout-health-check-timeout", "3"])
    assert cfg.engine.rollout_num_engines == 2 and cfg.engine.use_fault_tolerance and cfg.engine.uses_engine_processes
    assert cfg.engine.rollout_health_check_timeout == 3.0 and "rollout_num_engines" not in cfg.to_dict()["rollout"]
    y = tmp_path / "c.yaml"
    y.write_text("rollout:\n  rollout_max_engine_restarts: 5\n")  # a file grouped before the engine group still reads
    assert parse_config(base + ["--config", str(y)]).engine.rollout_max_engine_restarts == 5
    for flag, value, bound in [("--rollout-num-engines", "0", ">= 1"), ("--rollout-health-check-interval", "0", "> 0"),
                               ("--rollout-max-engine-restarts", "-1", ">= 0"),
                               ("--rollout-external-engine-timeout", "0", "> 0")]:
        with pytest.raises(ConfigError, match=f"{flag}: must be {bound}, got"):
            parse_config(base + [flag, value])
    with pytest.raises(ConfigError, match="--use-fault-tolerance: restarts the engine processes rlvr launches"):
        parse_config(base + ["--use-fault-tolerance", "--rollout-external-engine-addrs", "127.0.0.1:1"])


@pytest.mark.parametrize("flag, value, message", [
    ("--n-samples-per-prompt", "0", "must be >= 1, got 0"),
    ("--rollout-top-p", "1.5", "must be in (0, 1], got 1.5"),
    ("--rollout-temperature", "0", "must be > 0, got 0.0"),
    ("--lr", "-1", "must be > 0, got -1.0"),
    ("--gamma", "1.5", "must be in [0, 1], got 1.5"),
    ("--eps-clip-c", "1", "must be > 1, got 1.0"),
    ("--max-staleness", "-1", "must be >= 0, got -1"),
    ("--code-max-processes", "0", "must be >= 1, got 0"),
    ("--actor-num-nodes", "0", "must be >= 1, got 0"),
    ("--rollout-health-check-timeout", "0", "must be > 0, got 0.0"),
])
def test_declared_bounds_are_enforced_and_shown_in_help(base, flag, value, message, capsys):
    """One declaration per field: validation and --help read the same bounds (rlvr.config.fields)."""
    with pytest.raises(ConfigError) as e:
        parse_config(base + [flag, value])
    assert str(e.value) == f"{flag}: {message}"
    with pytest.raises(SystemExit):
        parse_config(["--help"])
    bound = message.split(", got")[0].removeprefix("must be ")
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    entry = f"{flag} {flag[2:].upper().replace('-', '_')} "  # its entry in the options list
    assert f"({bound})" in help_text.rsplit(entry, 1)[1].split(" --", 1)[0]


def test_registry_choices_are_listed_in_help_and_checked_after_plugins_load(base, capsys):
    with pytest.raises(SystemExit):
        parse_config(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(registered: cispo, dcpo, grpo, gspo, ppo, reinforce_plus_plus" in help_text
    with pytest.raises(ConfigError, match="--kl-loss-type: unknown value 'kl'; valid: k1, k2, k3, low_var_kl"):
        parse_config(base + ["--kl-loss-type", "kl"])
