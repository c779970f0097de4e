"""The config groups of the data, the rollout, the trainer, evaluation, async training and the
run (the other groups sit beside them: ``agent``, ``algo``, ``cluster``, ``engine``, ``reward``).

Each group is a dataclass whose field names are slime's flag names with underscores; the flag is
``--`` + name with hyphens, the help text is the field's ``metadata["help"]``, bounds and choices
are declared on the field (``rlvr.config.fields``). ``validate()`` checks the declared bounds and
the rules between the group's own fields, raising ``ConfigError(flag, what to change)``; what
needs the implementations (registered names, data files, the model's experts) is checked by
``rlvr.runtime.configure``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlvr.config.fields import check_bounds, flag_of
from rlvr.config.fields import option as _f
from rlvr.core.errors import ConfigError
from rlvr.core.registry import load_function


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
        if self.data_source_path is not None:
            load_function(self.data_source_path, "--data-source-path")
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
    rollout_temperature: float = _f(1.0, "sampling temperature (also applied to training log-probs); greedy (0) has no "
                                         "exploration", gt=0)
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
    # ---- engine, abort and partial rollout ----
    over_sampling_batch_size: int | None = _f(
        None, "prompt groups submitted per sampling round (>= --rollout-batch-size); extra groups are aborted once enough "
              "are kept"
    )
    partial_rollout: bool = _f(False, "groups aborted at the end of a rollout go to the data source's buffer and continue "
                                      "next rollout")
    mask_offpolicy_in_partial_rollout: bool = _f(False, "with --partial-rollout: loss mask 0 on tokens an older policy produced")
    # ---- fully async rollout and fault tolerance ----
    rollout_concurrency: int | None = _f(
        None, "--async: prompt groups in flight at once (each --n-samples-per-prompt requests); default "
              "--rollout-batch-size", ge=1
    )
    # ---- slime's rollout flags ----
    rollout_stop: list[str] = _f([], "stop strings: a response finishes once its text contains one (training and eval)")
    rollout_stop_token_ids: list[int] = _f([], "token ids that finish a response, besides the tokenizer's EOS")
    log_passrate: bool = _f(False, "log passrate/pass@k of each rollout's groups (k = 1, 2, 4, ... <= n) and eval/<name>-pass@k")
    rollout_sample_filter_path: str | None = _f(
        None, "slime's fn(args, samples): samples it marks remove_sample=True get loss mask 0 (kept in the batch)"
    )

    def validate(self) -> None:
        check_bounds(self)  # the ranges and choices declared on the fields
        if self.rollout_sample_filter_path is not None:
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
    log_probs_chunk_size: int = _f(-1, "response tokens per output-layer chunk for log-probs/entropy; -1 = by the vocabulary "
                                   "(<= 64 MiB of float32 logits per chunk: 341 rows at 49,152 tokens)")
    balance_data: bool = _f(False, "split a rollout across data-parallel ranks by token count (Karmarkar-Karp)")
    bf16: bool = _f(False, "bfloat16 parameters and activations, float32 master weights in the optimizer")
    recompute_activations: bool = _f(False, "recompute each layer's activations in backward to save memory")
    compile_layers: bool = _f(False, "torch.compile (dynamic shapes) each decoder layer's MLP and norms, the "
                                     "element-wise work between the matmuls; off by default: 0.92-1.11x eager on "
                                     "a 2-core AVX2 CPU after an ~80 s compile (docs/benchmarks.md)")
    optimizer: str = _f("adam", "slime's optimizer name; Megatron's adam is AdamW (decoupled weight decay), "
                                "which is what rlvr runs", ["adam"])
    max_consecutive_skipped_steps: int = _f(3, "stop after this many optimizer steps in a row skipped for a non-finite "
                                               "loss/grad norm", ge=1)
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
        if self.log_probs_chunk_size == 0 or self.log_probs_chunk_size < -1:
            raise ConfigError("--log-probs-chunk-size",
                              f"must be >= 1 or -1 (by the vocabulary), got {self.log_probs_chunk_size}")
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
        if self.eval_function_path is not None:
            load_function(self.eval_function_path, "--eval-function-path")  # names the flag if it cannot be imported


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
    load: str | None = _f(None, "resume from the newest checkpoint in this directory (none there yet: start fresh), "
                                "or from this rollout_* checkpoint directory")
    keep_last_k: int | None = _f(None, "keep only the newest K checkpoints under --save; default keep all", ge=1)
    save_hf: str | None = _f(None, "also write a plain HF checkpoint here at the end ({rollout_id}: at every save)")
    # -- debug replay (slime's flags)
    save_debug_rollout_data: str | None = _f(None, "save each rollout's samples to this path template with {rollout_id}")
    load_debug_rollout_data: str | None = _f(
        None, "train on rollouts saved by --save-debug-rollout-data (path template with {rollout_id}); no sampling"
    )
    debug_rollout_only: bool = _f(False, "only generate and grade rollouts; no training, no weight updates")
    debug_train_only: bool = _f(False, "only train, on --load-debug-rollout-data (implied by it)")
    # -- reproducibility (docs/slime_flags.md "What is reproducible")
    deterministic_mode: bool = _f(
        False, "bit-for-bit repeatable runs on one machine and thread count: each round of groups is one engine "
               "call decoded in forwards of its own (a fixed schedule), dynamic sampling waits for every group and "
               "keeps them in submission order, --async samples rollout r with exactly version r - --max-staleness, "
               "torch's deterministic algorithms (and slime's CUDA settings on GPU)")
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
                raise ConfigError(flag_of(name),
                                  f"{value!r} needs a {{rollout_id}} placeholder, e.g. dump/rollout_{{rollout_id}}.pt")
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
