"""The typed config: one source of truth for flags, YAML files and validation (STYLE point 5).

Each group is a dataclass whose field names are slime's flag names with underscores; the CLI
flag is ``--`` + name with hyphens, the help text is the field's ``metadata["help"]``. A YAML
file given by ``--config`` holds the same names (hyphens or underscores, flat or grouped by
section); flags given on the command line override it. Each component receives only its own
group (``cfg.algo`` to algorithm code, ``cfg.rollout`` to the rollout, ...).

Validation happens at parse time, next to the fields, and every message names the flag and
what to change.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import logging
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from rlvr.algo.advantages import estimator_of
from rlvr.agents.config import AgentConfig
from rlvr.algo.config import AlgoConfig
from rlvr.algo.opd import validate_opd
from rlvr.distributed.config import ClusterConfig
from rlvr.engine.config import EngineConfig
from rlvr import slime_flags
from rlvr.errors import ConfigError
from rlvr.fields import check_bounds, flag_of, help_of, static_choices
from rlvr.fields import option as _f
from rlvr.models.moe import has_routed_experts
from rlvr.rewards.config import RewardConfig


@dataclass
class DataConfig:
    """Where prompts come from and how they are read."""

    prompt_data: str | None = _f(None, "training prompts: JSONL, Parquet, or a datasets save_to_disk directory")
    input_key: str = _f("prompt", "field holding the prompt (text, or a list of chat messages)")
    label_key: str | None = _f("label", "field holding the label the reward compares against")
    metadata_key: str = _f("metadata", "field holding a dict passed to the reward as metadata")
    apply_chat_template: bool = _f(False, "wrap prompts with the tokenizer's chat template")
    rollout_shuffle: bool = _f(True, "shuffle the prompts each epoch")
    rollout_seed: int = _f(42, "seed of the prompt order")
    apply_chat_template_kwargs: str | None = _f(
        None, 'extra keyword arguments of apply_chat_template, as a JSON object: \'{"enable_thinking": false}\''
    )
    rollout_max_prompt_len: int | None = _f(
        None, "drop (and count) training prompts longer than this many tokens; never truncated", ge=1
    )
    data_source_path: str | None = _f(
        None, "slime's DataSource class, pkg.module:Cls(args) with get_samples(n) -> groups: where training prompts "
              "come from (--prompt-data is still read for the start-up checks)"
    )

    def chat_template_kwargs(self) -> dict:
        return json.loads(self.apply_chat_template_kwargs) if self.apply_chat_template_kwargs else {}

    def validate(self) -> None:
        check_bounds(self)  # the ranges and choices declared on the fields
        from rlvr.data.readers import dataset_kind

        if self.data_source_path is not None:
            from rlvr.registry import load_function

            load_function(self.data_source_path, "--data-source-path")
        if self.prompt_data is not None:
            try:
                dataset_kind(self.prompt_data)
            except ValueError as e:
                raise ConfigError("--prompt-data", str(e)) from None
        if self.apply_chat_template_kwargs is not None:
            try:
                kwargs = json.loads(self.apply_chat_template_kwargs)
            except json.JSONDecodeError as e:
                raise ConfigError("--apply-chat-template-kwargs", f"not valid JSON: {e}") from None
            if not isinstance(kwargs, dict):
                raise ConfigError("--apply-chat-template-kwargs", "must be a JSON object, e.g. '{\"enable_thinking\": false}'")


@dataclass
class RolloutConfig:
    """How responses are sampled and graded."""

    rollout_batch_size: int = _f(8, "prompts per rollout", ge=1)
    n_samples_per_prompt: int = _f(8, "responses sampled per prompt (the GRPO group size)", ge=1)
    rollout_max_response_len: int = _f(64, "maximum new tokens per response", ge=1)
    rollout_temperature: float = _f(1.0, "sampling temperature (also applied to training log-probs); greedy (0) has no exploration", gt=0)
    rollout_top_p: float = _f(1.0, "nucleus sampling mass", gt=0, le=1)
    rollout_top_k: int = _f(-1, "top-k sampling; -1 = off")
    custom_reward_post_process_path: str | None = _f(
        None, "post-process a rollout's rewards: a registered name (dcpo) or pkg.module:fn(samples, tokenizer)"
    )
    dynamic_sampling_filter_path: str | None = _f(
        None, "keep only groups passing this filter (nonzero_std, or pkg.module:fn(group) -> bool), resampling"
    )
    dynamic_sampling_max_rounds: int = _f(8, "sampling rounds a rollout may take to fill its batch with kept groups", ge=1)
    overlong_buffer_len: int | None = _f(None, "DAPO soft overlong penalty: ramp length before the max length")
    overlong_penalty_factor: float = _f(1.0, "DAPO soft overlong penalty: its maximum size", ge=0)
    # ---- engine, abort and partial rollout (issue 5) ----
    over_sampling_batch_size: int | None = _f(
        None, "prompt groups submitted per sampling round (>= --rollout-batch-size); extra groups are aborted once enough are kept"
    )
    partial_rollout: bool = _f(False, "groups aborted at the end of a rollout go to the data source's buffer and continue next rollout")
    mask_offpolicy_in_partial_rollout: bool = _f(False, "with --partial-rollout: loss mask 0 on tokens an older policy produced")
    # ---- fully async rollout and fault tolerance (issue 9) ----
    rollout_concurrency: int | None = _f(
        None, "--async: prompt groups in flight at once (each --n-samples-per-prompt requests); default --rollout-batch-size", ge=1
    )
    # ---- slime's rollout flags (issue 20.5) ----
    rollout_stop: list[str] = _f([], "stop strings: a response finishes once its text contains one (training and eval)")
    rollout_stop_token_ids: list[int] = _f([], "token ids that finish a response, besides the tokenizer's EOS")
    log_passrate: bool = _f(False, "log passrate/pass@k of each rollout's groups (k = 1, 2, 4, ... <= n) and eval/<name>-pass@k")
    rollout_sample_filter_path: str | None = _f(
        None, "slime's fn(args, samples): samples it marks remove_sample=True get loss mask 0 (kept in the batch)"
    )

    def validate(self) -> None:
        check_bounds(self)  # the ranges and choices declared on the fields
        from rlvr.registry import resolve
        from rlvr.rollout.filters import FILTERS
        from rlvr.rollout.postprocess import POST_PROCESS

        for flag, registry, value in (
            ("--dynamic-sampling-filter-path", FILTERS, self.dynamic_sampling_filter_path),
            ("--custom-reward-post-process-path", POST_PROCESS, self.custom_reward_post_process_path),
        ):
            if value is not None:
                try:
                    resolve(registry, value, flag)
                except KeyError as e:
                    raise ConfigError(flag, str(e.args[0])) from None
        if self.rollout_sample_filter_path is not None:
            from rlvr.registry import load_function

            load_function(self.rollout_sample_filter_path, "--rollout-sample-filter-path")
        if self.overlong_buffer_len is not None and not 0 < self.overlong_buffer_len <= self.rollout_max_response_len:
            raise ConfigError(
                "--overlong-buffer-len",
                f"must be in [1, --rollout-max-response-len {self.rollout_max_response_len}], got {self.overlong_buffer_len}",
            )
        if self.over_sampling_batch_size is not None and self.over_sampling_batch_size < self.rollout_batch_size:
            raise ConfigError("--over-sampling-batch-size",
                              f"must be >= --rollout-batch-size {self.rollout_batch_size}, got {self.over_sampling_batch_size}")
        if self.mask_offpolicy_in_partial_rollout and not self.partial_rollout:
            raise ConfigError("--mask-offpolicy-in-partial-rollout", "only acts with --partial-rollout; add it or drop this flag")


@dataclass
class TrainConfig:
    """The model, the optimizer and how a rollout becomes optimizer steps."""

    hf_checkpoint: str | None = _f(None, "Hugging Face checkpoint directory of the policy (and reference)")
    global_batch_size: int | None = _f(None, "samples per optimizer step; default = one step per rollout")
    lr: float = _f(1e-6, "AdamW learning rate", gt=0)
    min_lr: float = _f(0.0, "learning rate at the end of a linear or cosine decay", ge=0)
    lr_decay_style: str = _f("constant", "learning-rate schedule over the run's optimizer steps",
                             ["constant", "linear", "cosine"])
    lr_warmup_iters: int = _f(0, "optimizer steps of linear warm-up from 0 to --lr", ge=0)
    weight_decay: float = _f(0.0, "AdamW weight decay", ge=0)
    adam_beta1: float = _f(0.9, "AdamW beta1", ge=0, lt=1)
    adam_beta2: float = _f(0.98, "AdamW beta2", ge=0, lt=1)
    clip_grad: float = _f(1.0, "clip the global gradient norm to this; 0 = off", ge=0)
    use_dynamic_batch_size: bool = _f(False, "form micro-batches by token count (--max-tokens-per-gpu)")
    max_tokens_per_gpu: int | None = _f(None, "token budget of one micro-batch with dynamic batch size", ge=1)
    micro_batch_size: int = _f(1, "samples per micro-batch without dynamic batch size", ge=1)
    seed: int = _f(1234, "seed of model sampling and training")
    critic_load: str | None = _f(None, "PPO critic initial weights (HF directory); default --hf-checkpoint")
    critic_lr: float | None = _f(None, "PPO critic learning rate; default --lr")
    ref_load: str | None = _f(None, "reference model for the KL terms (HF directory); default the initial policy")
    ref_update_interval: int | None = _f(None, "copy the policy into the reference model every N rollouts", ge=1)
    use_rollout_logprobs: bool = _f(False, "use the engine's log-probs as the old policy instead of recomputing them")
    use_rollout_routing_replay: bool = _f(False, "MoE (R3): the trainer's forwards use the experts the engine's routers chose")
    log_probs_chunk_size: int = _f(-1, "response tokens per output-layer chunk for log-probs/entropy; -1 = one chunk")
    balance_data: bool = _f(False, "split a rollout across data-parallel ranks by token count (Karmarkar-Karp)")
    bf16: bool = _f(False, "bfloat16 parameters and activations, float32 master weights in the optimizer")
    recompute_activations: bool = _f(False, "recompute each layer's activations in backward to save memory")
    optimizer: str = _f("adam", "slime's optimizer name; Megatron's adam is AdamW (decoupled weight decay), "
                                "which is what rlvr runs", ["adam"])
    max_consecutive_skipped_steps: int = _f(3, "stop after this many optimizer steps in a row skipped for a non-finite loss/grad norm", ge=1)
    lora_rank: int = _f(0, "LoRA rank: train low-rank adapters on --target-modules instead of every weight; 0 = off", ge=0)
    lora_alpha: float | None = _f(None, "LoRA scale numerator (scale = alpha / rank); default 2 x --lora-rank", gt=0)
    lora_dropout: float = _f(0.0, "dropout on the LoRA input in the training forwards", ge=0, lt=1)
    target_modules: list[str] = _f(["all-linear"], "linear layers LoRA adapts: all-linear, or names (q_proj v_proj ...)")
    lora_adapter_path: str | None = _f(None, "start from this PEFT adapter directory (its rank, alpha and targets)")

    def validate(self) -> None:
        check_bounds(self)  # the ranges and choices declared on the fields
        if self.hf_checkpoint is None:
            raise ConfigError("--hf-checkpoint", "is required: a Hugging Face model directory")
        if not (Path(self.hf_checkpoint) / "config.json").is_file():
            raise ConfigError("--hf-checkpoint", f"{self.hf_checkpoint} has no config.json; point it at a HF model directory")
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError("--min-lr", f"must be in [0, --lr {self.lr}], got {self.min_lr}")
        if self.use_dynamic_batch_size and not self.max_tokens_per_gpu:
            raise ConfigError("--max-tokens-per-gpu", "is required with --use-dynamic-batch-size")
        if self.ref_load is not None and not (Path(self.ref_load) / "config.json").is_file():
            megatron = (Path(self.ref_load) / "latest_checkpointed_iteration.txt").is_file() or any(
                Path(self.ref_load).glob("**/*.distcp")) if Path(self.ref_load).is_dir() else False
            raise ConfigError("--ref-load", (f"{self.ref_load} is a Megatron checkpoint (slime's torch_dist); rlvr reads "
                                             "Hugging Face checkpoints: give the HF directory it was converted from, or "
                                             "drop --ref-load (the reference is then the initial --hf-checkpoint)")
                              if megatron else f"{self.ref_load} has no config.json; point it at a HF model directory")
        if self.use_rollout_routing_replay and not has_routed_experts(self.hf_checkpoint):
            raise ConfigError("--use-rollout-routing-replay", f"{self.hf_checkpoint} is a dense model (no routed experts): "
                              "routing replay has nothing to replay; drop the flag")
        if self.log_probs_chunk_size == 0 or self.log_probs_chunk_size < -1:
            raise ConfigError("--log-probs-chunk-size", f"must be >= 1 or -1 (one chunk), got {self.log_probs_chunk_size}")
        if self.lora_adapter_path is not None and not (Path(self.lora_adapter_path) / "adapter_config.json").is_file():
            raise ConfigError("--lora-adapter-path", f"{self.lora_adapter_path} has no adapter_config.json; "
                                                     "point it at a PEFT adapter directory")
        if (self.lora_rank or self.lora_adapter_path) and self.ref_update_interval is not None:
            raise ConfigError("--ref-update-interval", "with LoRA the reference is the base model (adapter "
                                                       "disabled); moving it is not supported: drop one")


@dataclass
class EvalConfig:
    """Held-out evaluation."""

    eval_prompt_data: list[str] = _f([], "NAME PATH [NAME PATH ...] held-out sets (or a single PATH)")
    eval_interval: int | None = _f(None, "evaluate every N rollouts (and before training, and at the end)", ge=1)
    eval_temperature: float = _f(0.0, "sampling temperature for eval; 0 = greedy", ge=0)
    eval_max_response_len: int | None = _f(None, "max new tokens in eval; default --rollout-max-response-len", ge=1)
    n_samples_per_eval_prompt: int = _f(1, "responses per eval prompt", ge=1)
    skip_eval_before_train: bool = _f(False, "do not evaluate the starting checkpoint")
    eval_top_p: float | None = _f(None, "nucleus mass in eval; default --rollout-top-p (1 when greedy)", gt=0, le=1)
    eval_top_k: int | None = _f(None, "top-k in eval; default --rollout-top-k (off when greedy)")
    eval_function_path: str | None = _f(
        None, "pkg.module:fn(cfg, rollout_id, data_source, evaluation=True) -> samples: the rollout of evaluation only "
              "(slime; default --rollout-function-path, else the built-in rollout)")
    eval_input_key: str | None = _f(None, "prompt field of the eval sets; default --input-key")
    eval_label_key: str | None = _f(None, "label field of the eval sets; default --label-key")
    sft_stop_score: float | None = _f(
        None, "rlvr sft: stop at the first evaluation (every --eval-interval steps) whose score on the first "
              "--eval-prompt-data set is >= this; off when unset", ge=0)

    def datasets(self) -> list[tuple[str, str]]:
        """(name, path) pairs from ``--eval-prompt-data``."""
        items = self.eval_prompt_data
        if len(items) == 1:
            return [(Path(items[0]).stem, items[0])]
        return [(items[i], items[i + 1]) for i in range(0, len(items), 2)]

    def validate(self) -> None:
        check_bounds(self)  # the ranges and choices declared on the fields
        if len(self.eval_prompt_data) > 1 and len(self.eval_prompt_data) % 2:
            raise ConfigError("--eval-prompt-data", "takes NAME PATH pairs (or one PATH); got an odd count")
        from rlvr.data.readers import dataset_kind
        from rlvr.registry import load_function

        if self.eval_function_path is not None:
            load_function(self.eval_function_path, "--eval-function-path")  # names the flag if it cannot be imported
        for name, path in self.datasets():
            try:
                dataset_kind(path)
            except ValueError as e:
                raise ConfigError("--eval-prompt-data", f"{name}: {e}") from None


@dataclass
class AsyncConfig:
    """Fully asynchronous training: rollout and training overlap, with a bound on staleness."""

    async_train: bool = _f(
        False, "fully async: a producer keeps --rollout-concurrency groups in flight while the trainer trains",
        flag="--async",
    )
    update_weights_interval: int = _f(1, "push the trainer's weights to the engines every N rollouts (sync and async)", ge=1)
    max_staleness: int = _f(
        1, "--async: never train on a sample whose oldest token is more than K weight versions behind the policy being "
           "trained (such groups are re-generated); 0 = exactly on-policy", ge=0
    )
    weight_update_inflight: str = _f(
        "abort", "--async: requests in flight at a weight push are aborted and continued on the new weights (partial "
                 "rollout, per-token versions) or finish on the old weights first (the push waits for them)",
        ["abort", "finish"],
    )

    def validate(self) -> None:
        check_bounds(self)  # the ranges and choices declared on the fields
        if self.async_train and self.max_staleness < self.update_weights_interval - 1:
            raise ConfigError(
                "--max-staleness",
                f"{self.max_staleness} cannot be met when weights are pushed only every --update-weights-interval "
                f"{self.update_weights_interval} rollouts (samples are then up to {self.update_weights_interval - 1} "
                f"versions old); raise it to >= {self.update_weights_interval - 1}",
            )


@dataclass
class RunConfig:
    """Length of the run, where its outputs go, what is logged."""

    num_rollout: int = _f(10, "number of rollouts (RL steps) to run", ge=1)
    output_dir: str = _f("runs/latest", "run directory: config, metrics, samples, events, plots")
    save: str | None = _f(None, "checkpoint directory; default OUTPUT_DIR/checkpoints")
    save_interval: int | None = _f(None, "save a checkpoint every N rollouts (and at the end)", ge=1)
    use_tensorboard: bool = _f(False, "write TensorBoard events to OUTPUT_DIR/tensorboard")
    tensorboard_dir: str | None = _f(None, "TensorBoard root instead of OUTPUT_DIR/tensorboard; default $TENSORBOARD_DIR if set")
    num_epoch: int | None = _f(
        None, "set --num-rollout to NUM_EPOCH x prompts in --prompt-data // --rollout-batch-size (ignored when "
              "--num-rollout is given, as in slime)", ge=1)
    # -- checkpoints and resume
    load: str | None = _f(None, "resume from the newest checkpoint in this directory (none there yet: start fresh)")
    keep_last_k: int | None = _f(None, "keep only the newest K checkpoints under --save; default keep all", ge=1)
    save_hf: str | None = _f(None, "also write a plain HF checkpoint here at the end ({rollout_id}: at every save)")
    # -- debug replay (slime's flags)
    save_debug_rollout_data: str | None = _f(None, "save each rollout's samples to this path template with {rollout_id}")
    load_debug_rollout_data: str | None = _f(
        None, "train on rollouts saved by --save-debug-rollout-data (path template with {rollout_id}); no sampling"
    )
    debug_rollout_only: bool = _f(False, "only generate and grade rollouts; no training, no weight updates")
    debug_train_only: bool = _f(False, "only train, on --load-debug-rollout-data (implied by it)")
    # -- sinks
    tb_project_name: str | None = _f(None, "TensorBoard: events go to OUTPUT_DIR/tensorboard/PROJECT/EXPERIMENT")
    tb_experiment_name: str | None = _f(None, "TensorBoard experiment (run) name; default the run directory's name")
    use_wandb: bool = _f(False, "log to Weights & Biases (pip install wandb)")
    wandb_project: str | None = _f(None, "W&B project; default rlvr")
    wandb_group: str | None = _f(None, "W&B group")
    wandb_mode: str = _f("online", "W&B mode: offline writes OUTPUT_DIR/wandb/ with no network",
                         ["online", "offline", "disabled"])

    def validate(self) -> None:
        check_bounds(self)  # the ranges and choices declared on the fields
        for name in ("save_debug_rollout_data", "load_debug_rollout_data"):
            value = getattr(self, name)
            if value is not None and "{rollout_id}" not in value:
                raise ConfigError(flag_of(name), f"{value!r} needs a {{rollout_id}} placeholder, e.g. dump/rollout_{{rollout_id}}.pt")
        if self.load_debug_rollout_data is not None:
            self.debug_train_only = True  # slime: loading rollouts means no sampling
        if self.debug_train_only and self.load_debug_rollout_data is None:
            raise ConfigError("--debug-train-only", "needs --load-debug-rollout-data: the rollouts to train on")
        if self.debug_rollout_only and self.debug_train_only:
            raise ConfigError("--debug-rollout-only", "cannot be combined with --debug-train-only (or --load-debug-rollout-data)")
        if self.use_wandb:
            try:
                import wandb  # noqa: F401
            except ImportError:
                raise ConfigError("--use-wandb", "needs the wandb package: pip install wandb") from None

    @property
    def save_dir(self) -> Path:
        return Path(self.save) if self.save else Path(self.output_dir) / "checkpoints"


GROUPS: dict[str, type] = {
    "data": DataConfig,
    "rollout": RolloutConfig,
    "engine": EngineConfig,
    "reward": RewardConfig,
    "algo": AlgoConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "asynchronous": AsyncConfig,
    "run": RunConfig,
    "cluster": ClusterConfig,
    "agent": AgentConfig,
}


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    asynchronous: AsyncConfig = field(default_factory=AsyncConfig)
    run: RunConfig = field(default_factory=RunConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)

    def __getattr__(self, name: str) -> Any:
        """Any field by its flat (slime) name, ``cfg.n_samples_per_prompt`` for
        ``cfg.rollout.n_samples_per_prompt``: the hooks that get the whole config where slime passes
        ``args`` (custom generate, rollout and eval functions) read it as slime's code does."""
        if name in FIELDS:
            return getattr(getattr(self, FIELDS[name][0]), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ---- derived numbers (seed 000 §2.1) ----------------------------------------------
    @property
    def samples_per_rollout(self) -> int:
        return self.rollout.rollout_batch_size * self.rollout.n_samples_per_prompt

    @property
    def global_batch_size(self) -> int:
        return self.train.global_batch_size or self.samples_per_rollout

    @property
    def steps_per_rollout(self) -> int:
        return self.samples_per_rollout // self.global_batch_size

    def validate(self, rl: bool = True) -> Config:
        """Check every group, then the cross-group rules; ``rl=False`` (SFT) skips the RL-only ones."""
        for group in GROUPS:  # each checks its declared bounds (rlvr.fields.check_bounds), then its rules
            getattr(self, group).validate()
        if self.data.prompt_data is None:
            raise ConfigError("--prompt-data", "is required: a JSONL or Parquet file, or a datasets directory, of prompts")
        gbs, total = self.global_batch_size, self.samples_per_rollout
        if gbs < 1 or total % gbs:
            raise ConfigError(
                "--global-batch-size",
                f"{gbs} must divide the samples of one rollout (--rollout-batch-size "
                f"{self.rollout.rollout_batch_size} x --n-samples-per-prompt "
                f"{self.rollout.n_samples_per_prompt} = {total})",
            )
        if self.train.use_dynamic_batch_size and self.train.max_tokens_per_gpu:
            # A response can be rollout_max_response_len long; the prompt needs room too.
            if self.train.max_tokens_per_gpu <= self.rollout.rollout_max_response_len:
                raise ConfigError(
                    "--max-tokens-per-gpu",
                    f"{self.train.max_tokens_per_gpu} cannot hold one response of --rollout-max-response-len "
                    f"{self.rollout.rollout_max_response_len} plus its prompt; raise it",
                )
        if not rl:
            if self.train.use_rollout_routing_replay:
                raise ConfigError("--use-rollout-routing-replay", "replays the routing a rollout engine recorded; "
                                  "SFT samples have none: drop it")
            return self
        if self.cluster.ray:
            self._validate_ray()
        if self.cluster.colocate:
            self._validate_colocate()
        if (self.agent.tools or self.agent.environment_path) and not self.data.apply_chat_template:
            raise ConfigError("--tools" if self.agent.tools else "--environment-path",
                              "multi-turn chat needs --apply-chat-template (turns follow the chat template)")
        if self.agent.rollout_function_path and self.agent.per_sample:
            raise ConfigError("--rollout-function-path", "replaces the whole rollout, so it cannot be combined with "
                              "a per-sample generate function (--custom-generate-function-path, --tools, --environment-path)")
        if self.asynchronous.async_train and (self.run.debug_rollout_only or self.run.debug_train_only):
            raise ConfigError("--async", "overlaps sampling and training; the debug split (--debug-rollout-only, "
                              "--debug-train-only, --load-debug-rollout-data) runs one of them alone: drop one")
        uses_ref = self.algo.use_kl_loss or self.algo.kl_coef != 0
        for name in ("ref_load", "ref_update_interval"):
            if getattr(self.train, name) is not None and not uses_ref:
                raise ConfigError(flag_of(name), "does nothing without a KL term; add --use-kl-loss or --kl-coef, or unset it")
        if self.algo.use_score_centering and (self.rollout.rollout_top_p != 1 or self.rollout.rollout_top_k != -1):
            raise ConfigError("--use-score-centering", "needs the untruncated sampling distribution (its head is q's top-k "
                              "of the full vocabulary): set --rollout-top-p 1 --rollout-top-k -1")
        self._validate_estimator()
        validate_opd(self.algo, self.reward.rm_type, self.reward.rm_url)
        return self

    def _validate_estimator(self) -> None:
        """What the estimator's traits (``rlvr.algo.register_estimator``) ask of the rest of the config."""
        name, est = self.algo.advantage_estimator, estimator_of(self.algo)
        if est.group_relative and self.rollout.n_samples_per_prompt < 2:
            raise ConfigError("--n-samples-per-prompt", f"{self.rollout.n_samples_per_prompt}: {name} compares the "
                                                        "samples of one prompt, so it needs groups of >= 2 samples")
        if est.side_inputs and self.rollout.custom_reward_post_process_path is None:
            raise ConfigError("--advantage-estimator", f"{name} reads per-sample inputs {list(est.side_inputs)} that "
                                                       f"no reward post-process writes: {est.side_inputs_hint}")

    def _validate_colocate(self) -> None:
        """What cannot time-share a device with the trainer (both modes; rlvr.colocate, placement.py)."""
        local, e = not self.cluster.ray, self.engine
        refused = [
            ("--rollout-external-engine-addrs", local and bool(e.rollout_external_engine_addrs),
             "an external server keeps its own memory; drop --colocate (or the servers)"),
            ("--rollout-num-engines", local and e.uses_engine_processes,
             "rlvr serve processes keep their own memory; colocate one embedded engine (drop the flag)"),
            ("--async", local and self.asynchronous.async_train,
             "sampling and training overlap, so they cannot time-share the device; drop --colocate"),
            ("--debug-rollout-only", local and self.run.debug_rollout_only,
             "nothing trains, so there is nothing to time-share with; drop --colocate"),
            ("--update-weights-interval", self.asynchronous.update_weights_interval != 1,
             "a colocated engine is emptied while the trainer steps and reloaded after every step; use 1"),
        ]
        for flag, bad, why in refused:
            if bad:
                raise ConfigError(flag, f"with --colocate: {why}")

    def _validate_ray(self) -> None:
        """What ``--ray`` cannot do (yet), refused before any actor starts."""
        c, world = self.cluster, self.cluster.train_world_size
        # --weight-sync: a broadcast group is formed once, by the engines that exist at the start,
        # and pushed to by the driver between steps (rlvr/distributed/broadcast.py)
        static = {"--colocate": c.colocate, "--async": self.asynchronous.async_train,
                  "--use-fault-tolerance": self.engine.use_fault_tolerance}
        if c.weight_sync == "auto":
            c.weight_sync = "broadcast" if c.gpus_per_engine and not any(static.values()) else "object_store"
        elif c.weight_sync == "broadcast" and any(static.values()):
            flag = next(f for f, on in static.items() if on)
            raise ConfigError("--weight-sync", f"broadcast is formed once by the engines present at the start and "
                                               f"pushed to between steps, which {flag} does not allow; use "
                                               "object_store (or auto)")
        if self.global_batch_size % world:
            raise ConfigError("--global-batch-size", f"{self.global_batch_size} samples per optimizer step cannot be "
                                                     f"split evenly across {world} training ranks; make it a multiple of {world}")
        refused = [
            ("--rollout-external-engine-addrs", bool(self.engine.rollout_external_engine_addrs),
             "Ray engines are embedded engine actors; use external servers in local mode"),
            ("--advantage-estimator", estimator_of(self.algo).needs_critic,
             f"{self.algo.advantage_estimator}'s critic is not data-parallel yet; use a critic-free estimator "
             "(grpo, rloo, ...) under --ray"),
            ("--debug-rollout-only", self.run.debug_rollout_only and c.colocate,
             "nothing trains, so there is nothing to time-share with; drop --colocate"),
            ("--bf16", self.train.bf16 and c.train_backend == "fsdp",
             "--train-backend fsdp keeps float32 parameters; drop --bf16 or use ddp"),
            ("--offload-train", c.offload_train and c.train_backend == "fsdp",
             "not built for FSDP2's sharded optimizer state yet; use ddp or drop it"),
            ("--ref-update-interval", self.train.ref_update_interval is not None and c.train_backend == "fsdp",
             "not supported with --train-backend fsdp yet; use ddp"),
            ("--kl-loss-type", self.algo.kl_loss_type == "token_level_kl" and c.train_backend == "fsdp"
             and bool(self.train.lora_rank or self.train.lora_adapter_path),
             "token_level_kl reads the reference's hidden states, which LoRA under --train-backend fsdp keeps "
             "sharded; use ddp or another --kl-loss-type"),
            ("--async", self.asynchronous.async_train and c.colocate,
             "sampling and training overlap, so they cannot time-share bundles; drop --colocate"),
            ("--check-weight-update-equal", self.asynchronous.async_train and c.check_weight_update_equal,
             "not checked on the producer's asynchronous weight pushes yet; drop it or --async"),
        ]
        for flag, bad, why in refused:
            if bad:
                raise ConfigError(flag, f"under --ray: {why}")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {g: dataclasses.asdict(getattr(self, g)) for g in GROUPS}

    def save_yaml(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        return path


# ---- argparse generation ------------------------------------------------------------------
def _field_index() -> dict[str, tuple[str, dataclasses.Field]]:
    """field name -> (group, Field), checking names are unique across groups."""
    index: dict[str, tuple[str, dataclasses.Field]] = {}
    for group, cls in GROUPS.items():
        for f in fields(cls):
            if f.name in index:
                raise RuntimeError(f"config field {f.name!r} defined in both {index[f.name][0]} and {group}")
            index[f.name] = (group, f)
    return index


FIELDS = _field_index()
# Fields whose flag is not derived from the name (``async_train`` is ``--async``): YAML takes either.
ALIASES = {f.metadata["flag"][2:].replace("-", "_"): name for name, (_, f) in FIELDS.items() if "flag" in f.metadata}


def _annotation(tp: Any) -> Any:
    return eval(tp, vars(typing), {}) if isinstance(tp, str) else tp  # noqa: S307 (our own annotations)


def _optional(tp: Any) -> bool:
    tp = _annotation(tp)
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _or_none(parse):
    """Flag parser for an optional field: ``none`` / ``null`` unsets a value the YAML file set."""

    def convert(text: str):
        return None if text.lower() in ("none", "null") else parse(text)

    convert.__name__ = parse.__name__  # argparse names the type in its error messages
    return convert


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(inner type, is_list) of an annotation like ``float | None`` or ``list[str]``."""
    tp = _annotation(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0]
    if typing.get_origin(tp) is list:
        return typing.get_args(tp)[0], True
    return tp, False


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every config field as a flag whose default is 'not given' (so YAML can fill it)."""
    parser.add_argument("--config", help="YAML file with the same fields; flags override it")
    slime_flags.add_arguments(parser, set(FIELDS) | set(ALIASES))
    for group, cls in GROUPS.items():
        section = parser.add_argument_group(group, cls.__doc__)
        for f in fields(cls):
            tp, is_list = _base_type(f.type)
            kwargs: dict[str, Any] = dict(dest=f.name, default=argparse.SUPPRESS, help=help_of(f))
            if tp is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["type"] = _or_none(tp) if _optional(f.type) else tp
                if is_list:
                    kwargs["nargs"] = "+"
                if static_choices(f) is not None:  # registry names: checked after plugins load
                    kwargs["choices"] = static_choices(f)
            section.add_argument(f.metadata.get("flag", flag_of(f.name)), **kwargs)


def _read_yaml(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError("--config", f"file not found: {path}")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError("--config", f"{path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError("--config", f"{path} must hold a mapping of field: value")
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        if key in GROUPS and isinstance(value, dict):  # grouped form: algo: {eps_clip: 0.2}
            items = value.items()
        else:
            items = [(key, value)]
        for k, v in items:
            name = str(k).replace("-", "_")
            name = ALIASES.get(name, name)
            if name not in FIELDS:
                close = difflib.get_close_matches(name, FIELDS, n=1)
                hint = f"; did you mean {close[0].replace('_', '-')!r}?" if close else ""
                raise ConfigError("--config", f"{path}: unknown field {k!r}{hint}")
            flat[name] = v
    return flat


def _coerce(name: str, value: Any, source: str) -> Any:
    """Check a YAML value's type against the field's annotation."""
    f = FIELDS[name][1]
    tp, is_list = _base_type(f.type)
    if value is None:
        return None
    try:
        if is_list:
            values = value if isinstance(value, list) else str(value).split()
            return [tp(v) for v in values]
        if tp is bool and not isinstance(value, bool):
            raise TypeError
        if tp is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError
        value = tp(value)
    except (TypeError, ValueError):
        raise ConfigError(flag_of(name), f"{source}: expected {tp.__name__}, got {value!r}") from None
    choices = static_choices(f)  # registry names are checked by validate, once plugins are imported
    if choices is not None and value not in choices:
        raise ConfigError(flag_of(name), f"{source}: unknown value {value!r}; valid: {', '.join(choices)}")
    return value


def build_config(values: dict[str, Any]) -> Config:
    """Config from flat ``{field_name: value}``; unset fields keep their defaults."""
    grouped: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
    for name, value in values.items():
        grouped[FIELDS[name][0]][name] = value
    return Config(**{g: GROUPS[g](**kw) for g, kw in grouped.items()})


def merged_values(ns: argparse.Namespace) -> dict[str, Any]:
    """Flat ``{field: value}`` from defaults < YAML (``--config``) < flags given."""
    values: dict[str, Any] = {}
    if getattr(ns, "config", None):
        for name, v in _read_yaml(ns.config).items():
            values[name] = _coerce(name, v, ns.config)
    values.update({k: v for k, v in vars(ns).items() if k in FIELDS})
    for name, text in slime_flags.apply(ns, values).items():  # slime-only flags (docs/slime_flags.md)
        tp = _base_type(FIELDS[name][1].type)[0]
        try:
            values.setdefault(name, tp(text))
        except ValueError:
            raise ConfigError(flag_of(name), f"expected {tp.__name__}, got {text!r}") from None
    _num_rollout_from_epochs(values)
    return values


def _num_rollout_from_epochs(values: dict[str, Any]) -> None:
    """slime's ``--num-epoch``: when ``--num-rollout`` is not given, it is the epochs times the
    prompts of ``--prompt-data`` (rows, before any --rollout-max-prompt-len drop) over the batch."""
    if values.get("num_epoch") is None:
        return
    if "num_rollout" in values:
        logging.getLogger(__name__).info("--num-epoch is ignored: --num-rollout %s is given (slime)", values["num_rollout"])
        return
    from rlvr.data.readers import open_rows

    path = values.get("prompt_data")
    if path is None or not Path(path).exists():
        raise ConfigError("--num-epoch", "needs --prompt-data (its size sets --num-rollout)")
    batch = values.get("rollout_batch_size", RolloutConfig.rollout_batch_size)
    values["num_rollout"] = max(1, values["num_epoch"] * len(open_rows(path)) // batch)


def make_parser(prog: str = "rlvr train") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    add_config_arguments(parser)
    return parser


def parse_config(argv: list[str], rl: bool = True) -> Config:
    """Flags (and ``--config``) to a validated ``Config``; ``rl=False`` for SFT."""
    return build_config(merged_values(make_parser().parse_args(argv))).validate(rl=rl)
