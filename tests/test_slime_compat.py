"""slime's launch script parses and the flag policy holds."""

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from rlvr.compat.slime import flags as slime_flags
from rlvr.config import FIELDS, build_config
from rlvr.runtime.configure import make_parser, merged_values
from rlvr.config.cluster import ClusterConfig
from rlvr.core.errors import ConfigError
from tests.conftest import write_lines

# GPU placement flags: config fields (docs/scaling.md); one not defined yet is left out.
PLACEMENT = {"actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus_per_engine", "colocate",
             "sglang_mem_fraction_static", "rollout_num_gpus"}


def full_script(ckpt: Path, train: Path, test: Path, out: Path) -> list[tuple[str, ...]]:
    """A slime GRPO launch script (Megatron, SGLang and RL flags), flag by flag, with its paths pointed at local files. MODEL_ARGS
    (``source scripts/models/qwen3-8B.sh``) are written for the tiny checkpoint, as a user would."""
    cfg = json.loads((ckpt / "config.json").read_text())
    bt_size, n = 4, 2
    model = [("--swiglu",), ("--num-layers", str(cfg["num_hidden_layers"])), ("--hidden-size", str(cfg["hidden_size"])),
             ("--ffn-hidden-size", str(cfg["intermediate_size"])),
             ("--num-attention-heads", str(cfg["num_attention_heads"])), ("--group-query-attention",),
             ("--num-query-groups", str(cfg["num_key_value_heads"])), ("--use-rotary-position-embeddings",),
             ("--disable-bias-linear",), ("--normalization", "RMSNorm"), ("--norm-epsilon", str(cfg["rms_norm_eps"])),
             ("--rotary-base", str(int(cfg["rope_parameters"]["rope_theta"]))), ("--vocab-size", str(cfg["vocab_size"])),
             ("--kv-channels", str(cfg["hidden_size"] // cfg["num_attention_heads"])), ("--qk-layernorm",)]
    # (qwen3-8B.sh also has --untie-embeddings-and-output-weights; the tiny checkpoint ties them, so it is left out)
    ckpt_args = [("--hf-checkpoint", str(ckpt)), ("--ref-load", str(ckpt)), ("--save", str(out / "ckpt")),
                 ("--save-interval", "40")]
    rollout = [("--prompt-data", str(train)), ("--input-key", "prompt"), ("--label-key", "label"),
               ("--apply-chat-template",), ("--rollout-shuffle",), ("--rm-type", "math"), ("--num-rollout", "2000"),
               ("--rollout-batch-size", str(bt_size)), ("--n-samples-per-prompt", str(n)),
               ("--rollout-max-response-len", "3000"), ("--rollout-temperature", "1"),
               ("--global-batch-size", str(bt_size * n))]
    evals = [("--eval-interval", "20"), ("--eval-prompt-data", "aime24", str(test)), ("--n-samples-per-eval-prompt", "1"),
             ("--eval-max-response-len", "16384"), ("--eval-top-k", "1")]
    perf = [("--tensor-model-parallel-size", "1"), ("--sequence-parallel",), ("--pipeline-model-parallel-size", "1"),
            ("--context-parallel-size", "1"), ("--use-dynamic-batch-size",), ("--max-tokens-per-gpu", "9216")]
    grpo = [("--advantage-estimator", "grpo"), ("--use-kl-loss",), ("--kl-loss-coef", "0.01"),
            ("--kl-loss-type", "low_var_kl"), ("--kl-coef", "0.00"), ("--entropy-coef", "0.00"), ("--eps-clip", "0.2"),
            ("--eps-clip-high", "0.28")]
    optimizer = [("--optimizer", "adam"), ("--lr", "1e-6"), ("--lr-decay-style", "constant"), ("--weight-decay", "0.1"),
                 ("--adam-beta1", "0.9"), ("--adam-beta2", "0.98")]
    tensorboard = [("--use-tensorboard",), ("--tb-project-name", "MyProject"), ("--tb-experiment-name", "experiment_1"),
                   ("--tensorboard-dir", str(out / "tensorboard"))]
    sglang = [("--rollout-num-gpus-per-engine", "1"), ("--sglang-mem-fraction-static", "0.7"),
              ("--sglang-enable-deterministic-inference",), ("--sglang-attention-backend", "flashinfer"),
              ("--deterministic-mode",), ("--sglang-chunked-prefill-size", "4096"),
              ("--sglang-max-running-requests", "128")]
    misc = [("--attention-dropout", "0.0"), ("--hidden-dropout", "0.0"), ("--accumulate-allreduce-grads-in-fp32",),
            ("--attention-softmax-in-fp32",), ("--attention-backend", "flash")]
    launch = [("--actor-num-nodes", "1"), ("--actor-num-gpus-per-node", "4"), ("--colocate",),
              ("--calculate-per-token-loss",), ("--use-slime-router",)]
    return launch + model + ckpt_args + rollout + optimizer + grpo + tensorboard + perf + evals + sglang + misc


def argv_of(script: list[tuple[str, ...]]) -> list[str]:
    def defined(flag: str) -> bool:
        name = flag[2:].replace("-", "_")
        return name not in PLACEMENT or name in FIELDS

    return [a for item in script if defined(item[0]) for a in item]


@pytest.fixture()
def files(tmp_path):
    train = write_lines(tmp_path / "train.jsonl", [{"prompt": f"{i}+1=", "label": str(i + 1)} for i in range(10)])
    test = write_lines(tmp_path / "aime-2024.jsonl", [{"prompt": "1+1=", "label": "2"}])
    return train, test


def parse(argv: list[str]):
    return build_config(merged_values(make_parser().parse_args(argv)))


def test_seed_000_full_script_parses_honours_and_warns_once(tiny_qwen2, files, tmp_path, caplog):
    script = full_script(tiny_qwen2, *files, tmp_path)
    with caplog.at_level(logging.WARNING, logger="rlvr.compat.slime.flags"):
        cfg = parse(argv_of(script))
    warnings = [r.getMessage() for r in caplog.records if r.name == "rlvr.compat.slime.flags"]
    assert len(warnings) == 1, warnings  # one line lists everything ignored
    for ignored in ("--sequence-parallel", "--tensor-model-parallel-size 1", "--attention-backend flash",
                    "--sglang-attention-backend flashinfer", "--hidden-dropout 0.0", "--num-layers",
                    "--accumulate-allreduce-grads-in-fp32"):
        assert ignored in warnings[0]
    assert "--use-slime-router" not in warnings[0]  # built in: nothing ignored
    # honoured: each flag landed in its field
    assert cfg.train.optimizer == "adam" and cfg.train.weight_decay == 0.1 and cfg.train.adam_beta2 == 0.98
    assert cfg.run.tensorboard_dir == str(tmp_path / "tensorboard") and cfg.run.tb_project_name == "MyProject"
    assert cfg.engine.rollout_max_running_requests == 128  # --sglang-max-running-requests
    assert cfg.algo.eps_clip_high == 0.28 and cfg.algo.kl_loss_type == "low_var_kl" and cfg.algo.calculate_per_token_loss
    assert cfg.eval.datasets() == [("aime24", str(files[1]))] and cfg.eval.eval_top_k == 1
    assert cfg.train.ref_load == str(tiny_qwen2) and cfg.run.save_interval == 40
    # Everything but placement validates here; placement (GPUs, --colocate) is docs/scaling.md's.
    dataclasses.replace(cfg, cluster=ClusterConfig()).validate()


@pytest.mark.parametrize("flag, value, says", [
    ("--tensor-model-parallel-size", "2", "no tensor parallelism"),
    ("--pipeline-model-parallel-size", "4", "scale with data-parallel ranks"),
    ("--hidden-dropout", "0.1", "config.json dropout"),
    ("--num-layers", "36", "disagrees with num_hidden_layers"),
    ("--rotary-base", "1000000", "disagrees with rope_theta"),
    ("--load-format", "torch_dist", "Hugging Face checkpoints only"),
    ("--loss-type", "custom_loss", "register a policy loss"),
])
def test_values_that_would_change_the_result_are_refused(tiny_qwen2, files, flag, value, says):
    with pytest.raises(ConfigError) as e:
        parse(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(files[0]), flag, value])
    assert str(e.value).startswith(flag) and says in str(e.value)


def test_untie_flag_is_refused_for_a_tied_checkpoint(tiny_qwen2, files):
    with pytest.raises(ConfigError, match="tie_word_embeddings=true"):
        parse(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(files[0]), "--untie-embeddings-and-output-weights"])


def test_megatron_ref_load_is_refused_naming_the_fix(tiny_qwen2, files, tmp_path):
    megatron = tmp_path / "Qwen3-8B_torch_dist"
    (megatron / "iter_0000000").mkdir(parents=True)
    (megatron / "latest_checkpointed_iteration.txt").write_text("release")
    with pytest.raises(ConfigError, match="Megatron checkpoint.*drop --ref-load"):
        parse(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(files[0]), "--ref-load", str(megatron),
               "--use-kl-loss"]).validate()


def test_num_epoch_sets_num_rollout_unless_given(tiny_qwen2, files):
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(files[0]), "--rollout-batch-size", "4"]
    assert parse(base + ["--num-epoch", "3"]).run.num_rollout == 3 * 10 // 4
    assert parse(base + ["--num-epoch", "3", "--num-rollout", "5"]).run.num_rollout == 5  # slime: num_epoch ignored


def test_docs_table_lists_every_policy_entry_and_the_placement_flags():
    doc = (Path(__file__).parents[1] / "docs" / "slime_flags.md").read_text()
    for flag, _rule, _ in slime_flags.table_rows():
        assert f"`{flag}`" in doc, flag
    for name in PLACEMENT:
        assert f"`--{name.replace('_', '-')}`" in doc
    assert "docs/slime_flags.md" in (Path(__file__).parents[1] / "README.md").read_text()


def test_rollout_stop_flags_reach_the_sampling_params(tiny_qwen2, files):
    from rlvr.runtime.build import load_tokenizer
    from rlvr.runtime.configure import parse_config
    from rlvr.rollout.rollout import Rollout

    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(files[0]),
                        "--rollout-stop", "###", "Answer:", "--rollout-stop-token-ids", "7", "9"])
    tok = load_tokenizer(str(tiny_qwen2))
    rollout = Rollout(cfg.rollout, engine=None, tokenizer=tok, data_source=None, grader=None)
    params = rollout.sampling_params()
    assert params.stop == ("###", "Answer:") and params.stop_token_ids == (tok.eos_token_id, 7, 9)


def dict_reward(sample):
    return {"acc": 1.0, "fmt": 0.5}


def test_reward_key_scores_a_dict_reward_by_that_entry():
    import asyncio

    from rlvr.config.reward import RewardConfig
    from rlvr.rewards.grader import Grader
    from rlvr.core.types import Sample
    samples = [Sample("p", [1])]
    asyncio.run(Grader(RewardConfig(custom_rm_path="tests.test_slime_compat:dict_reward", reward_key="fmt"))
                .grade_group(samples))
    assert samples[0].reward == {"score": 0.5, "acc": 1.0}
    asyncio.run(Grader(RewardConfig(custom_rm_path="tests.test_slime_compat:dict_reward", reward_key="nope"))
                .grade_group(samples))
    assert samples[0].reward == 0.0 and "'nope'" in samples[0].metadata["reward_error"]  # contained, named
