"""slime-signature plugins run under rlvr as written, and the metrics slime users read."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlvr.config.algo import AlgoConfig
from rlvr.algo.corrections import apply_corrections
from rlvr.runtime.configure import parse_config
from rlvr.core.errors import ConfigError
from rlvr.compat.slime.plugins import SlimeArgs, adapt_reward, is_slime_style
from rlvr.core.types import Sample
from tests.conftest import write_lines

# Written against slime's documented signatures (docs/en/get_started/customization.md); porting
# changed only the two import lines (slime.utils.types / slime.rollout.filter_hub.base_types).
PLUGINS = '''
import torch

from rlvr.compat.slime.plugins import DynamicFilterOutput
from rlvr.core.types import Sample


async def custom_rm(args, sample: Sample) -> dict:
    assert args.n_samples_per_prompt == 4 and args.rollout_max_response_len == 6
    acc = float(len(sample.tokens) % 2)  # something that varies within a group
    return {"acc": acc, "truncated": float(sample.status == Sample.Status.TRUNCATED)}


def varied_groups(args, samples, **kwargs):
    rewards = [s.get_reward_value(args) for s in samples]
    keep = max(rewards) > min(rewards)
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{round(rewards[0], 1)}")


def doubled_rewards(args, samples):
    raw = [s.get_reward_value(args) for s in samples]
    return raw, [2.0 * r for r in raw]  # no normalisation: the estimator must see exactly these


def drop_first_of_group(args, samples):
    for group in samples:
        group[0].remove_sample = True


def eval_rollout(args, rollout_id, data_source, evaluation=False):
    # slime's eval function; the eval set was read with --eval-input-key question --eval-label-key answer
    assert evaluation and args.n_samples_per_eval_prompt == 2
    samples = []
    for record in data_source.records:
        assert "plus" in record.prompt and record.label == "2"
        for _ in range(args.n_samples_per_eval_prompt):
            samples.append(Sample(prompt=record.prompt, prompt_ids=[1], label=record.label, response="x",
                                  response_ids=[5, 5, 5], rollout_log_probs=[0.0] * 3, loss_mask=[1] * 3,
                                  status=Sample.Status.TRUNCATED))
    return samples


class CountingSource:  # slime's DataSource protocol (slime.rollout.data_source.DataSource)
    def __init__(self, args):
        self.n, self.i = args.n_samples_per_prompt, 0

    def get_samples(self, num_samples):
        groups = []
        for _ in range(num_samples):
            s = Sample(prompt=f"{self.i} times 2 is", label=str(2 * self.i), metadata={"source_name": "counting"})
            groups.append([s] * self.n)
            self.i += 1
        return groups

    def add_samples(self, samples):
        pass

    def save(self, rollout_id):
        pass

    def load(self, rollout_id=None):
        pass

    def __len__(self):
        return 10**6


def my_tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    old, q = torch.cat(train_log_probs), torch.cat(rollout_log_probs)
    w = torch.exp(old - q).clamp(max=args.tis_clip)
    return pg_loss * w, loss_masks, {"my_tis_weight": w}
'''


def test_slime_reward_gets_the_config_by_slime_names():
    async def custom_rm(args, sample):
        return args.reward_timeout + len(sample.tokens)

    assert is_slime_style(custom_rm) and not is_slime_style(lambda sample: 1.0)
    from rlvr.config.reward import RewardConfig

    reward = adapt_reward(custom_rm, SlimeArgs(RewardConfig(reward_timeout=5.0)))
    import asyncio

    assert asyncio.run(reward(Sample("p", [1, 2], response_ids=[3]))) == 8.0


def test_the_hooks_args_answer_by_group_and_by_flat_name_but_the_config_only_by_group():
    """The multi-turn hooks get ``args`` built at the edge (``rlvr.runtime.plugins.slime_args``):
    the config's groups and slime's flat names; the ``Config`` itself has no flat names."""
    from rlvr.config import Config
    from rlvr.runtime.plugins import slime_args

    cfg = Config()
    cfg.rollout.rollout_batch_size, cfg.rollout.n_samples_per_prompt, cfg.algo.disable_rewards_normalization = 3, 4, True
    args = slime_args(cfg)
    assert args.rollout is cfg.rollout and args.agent is cfg.agent
    assert (args.rollout_batch_size, args.n_samples_per_prompt, args.rewards_normalization) == (3, 4, False)
    assert cfg.train.global_batch_size is None and args.global_batch_size == 12  # the run's, as slime's args
    with pytest.raises(AttributeError, match="read-only"):
        args.rollout_batch_size = 1
    with pytest.raises(AttributeError):
        cfg.n_samples_per_prompt  # noqa: B018


def test_slime_tis_function_sees_flat_tensors_and_weights_the_loss(tmp_path, monkeypatch):
    (tmp_path / "slime_tis_mod.py").write_text(textwrap.dedent('''
        def clamp_tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths):
            import torch
            assert pg_loss.dim() == 1 and len(train_log_probs) == len(response_lengths)
            w = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs)).clamp(max=args.tis_clip)
            return pg_loss * w, loss_masks, {"w": w}
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = AlgoConfig(use_tis=True, tis_clip=1.5, custom_tis_function_path="slime_tis_mod:clamp_tis")
    lp = torch.tensor([[0.0, -1.0], [-0.5, -0.5]])
    q = torch.tensor([[-1.0, -1.0], [-0.5, 0.0]])
    from rlvr.runtime.plugins import custom_tis

    tis = custom_tis(cfg)  # the builders' adaptation: what the trainer is given
    loss, m = apply_corrections(torch.ones(2, 2), lp, lp, q, torch.ones(2, 2), torch.ones(2, 2), cfg, tis)
    expected = torch.exp(lp - q).clamp(max=1.5)  # e^1 clamped to 1.5, 1, 1, e^-0.5
    assert torch.allclose(loss, expected) and torch.allclose(m["w"], expected)


def test_slime_paths_map_or_name_the_rlvr_equivalent(tiny_qwen2, tmp_path):
    data = write_lines(tmp_path / "d.jsonl", [{"prompt": "1+1=", "label": "2"}])
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data)]
    cfg = parse_config(base + ["--dynamic-sampling-filter-path",
                               "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"])
    assert cfg.rollout.dynamic_sampling_filter_path.endswith("check_reward_nonzero_std")  # resolves to nonzero_std
    with pytest.raises(ConfigError, match="--custom-rm-path: 'slime.rollout.rm_hub.my_rm.f' is slime's code.*--rm-type"):
        parse_config(base + ["--custom-rm-path", "slime.rollout.rm_hub.my_rm.f"])
    with pytest.raises(ConfigError, match="rlvr.core.types"):
        parse_config(base + ["--custom-rm-path", "slime.utils.types:whatever"])


def test_slime_data_source_hands_out_prompts_and_resumes_by_replay(tmp_path, monkeypatch):
    (tmp_path / "src_mod.py").write_text(PLUGINS)
    monkeypatch.syspath_prepend(str(tmp_path))
    from rlvr.config import Config
    from rlvr.runtime.slime_source import slime_data_source

    args = SlimeArgs(Config())
    source = slime_data_source("src_mod:CountingSource", args)
    assert [r.label for r in source.next_prompts(3)] == ["0", "2", "4"] and source.position == 3
    state = source.state_dict()
    again = slime_data_source("src_mod:CountingSource", args)
    again.load_state_dict(state)
    assert [r.prompt for r in again.next_prompts(2)] == ["3 times 2 is", "4 times 2 is"]


@pytest.mark.slow
def test_two_rollout_cli_run_with_slime_plugins_and_slime_metrics(tiny_qwen2, tmp_path):
    (tmp_path / "my_slime_plugins.py").write_text(PLUGINS)
    train = write_lines(tmp_path / "train.jsonl", [{"prompt": f"{i} plus {i} is", "label": str(2 * i)} for i in range(4)])
    test = write_lines(tmp_path / "test.jsonl", [{"question": "1 plus 1 is", "answer": "2"}] * 2)
    out, tb = tmp_path / "run", tmp_path / "tb_root"
    args = ["train", "--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(train), "--num-epoch", "1",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
            "--custom-rm-path", "my_slime_plugins.custom_rm", "--reward-key", "acc",
            "--dynamic-sampling-filter-path", "my_slime_plugins.varied_groups",
            "--custom-reward-post-process-path", "my_slime_plugins.doubled_rewards",
            "--rollout-sample-filter-path", "my_slime_plugins.drop_first_of_group",
            "--use-tis", "--custom-tis-function-path", "my_slime_plugins.my_tis",
            "--use-kl-loss", "--kl-loss-coef", "0.01", "--log-passrate", "--rollout-stop-token-ids", "7",
            "--eval-prompt-data", "toy", str(test), "--eval-input-key", "question", "--eval-label-key", "answer",
            "--n-samples-per-eval-prompt", "2", "--eval-temperature", "1.0", "--skip-eval-before-train",
            "--eval-function-path", "my_slime_plugins.eval_rollout", "--data-source-path", "my_slime_plugins.CountingSource",
            "--use-tensorboard", "--output-dir", str(out), "--tensor-model-parallel-size", "1", "--use-slime-router"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "TENSORBOARD_DIR": str(tb), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "rlvr", *args], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("ignored slime flags") == 1 and "--tensor-model-parallel-size 1" in r.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rollouts = [x for x in records if "rollout/step" in x]
    assert [x["rollout/step"] for x in rollouts] == [0, 1]  # --num-epoch 1: 4 prompts / 2 per rollout
    for m in rollouts:
        # slime's per-rollout means (kind 4), logged with the rollout
        for key in ("rollout/log_probs", "rollout/ref_log_probs", "rollout/rollout_log_probs", "rollout/advantages",
                    "rollout/returns", "rollout/rewards", "rollout/response_lengths", "rollout/truncated",
                    "passrate/pass@1", "passrate/pass@4"):
            assert key in m, key
        assert m["rollout/log_probs"] < 0 and m["rollout/ref_log_probs"] < 0
        assert m["rollout/rewards"] == pytest.approx(2 * m["rollout/raw_reward"])  # the post-process's own rewards
        assert m["rollout/removed_samples"] == 2.0  # one per group, loss mask 0
        assert m["rollout/counting/count"] == 8.0  # every prompt came from the slime data source
        assert m["passrate/pass@1"] == pytest.approx(m["rollout/raw_reward"])
        assert m["rollout/reward/truncated"] >= 0  # the dict reward's other field, scored by --reward-key acc
    train = [x for x in records if "train/step" in x]
    assert len(train) == 2 and all(0 < x["train/my_tis_weight"] <= 2.0 for x in train)  # the slime TIS ran
    evals = [x for x in records if "eval/step" in x]
    assert evals and evals[-1]["eval/toy-truncated_ratio"] == 1.0 and "eval/toy-pass@2" in evals[-1]
    assert evals[-1]["eval/toy/response_len/mean"] == 3.0  # the eval function's samples, graded by custom_rm
    assert evals[-1]["eval/toy"] == 0.0  # len(tokens) = 4: acc 0
    assert list(Path(tb).rglob("events.out.tfevents.*"))  # TENSORBOARD_DIR honoured
    assert not (out / "tensorboard").exists()
