"""Builders: a ``Config`` in, the run's components out (DESIGN "Builders beside the driver").

The driver (``rlvr.runtime.loop``) only drives; it, the SFT and eval entry points, the Ray actors
(``rlvr.distributed``) and the engine server all build their parts here, so a component is put
together in one place whatever process it runs in. Each builder hands a component only its own
config group (``cfg.train`` and ``cfg.algo`` to the trainer, ``cfg.rollout`` to the rollout, ...).

``build_local`` is local mode's whole set; under ``--ray`` the driver asks ``rlvr.distributed``
for the same ``Components`` made of actor-group proxies, whose actors call the builders below.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlvr.config import Config
from rlvr.data import reasoning_gym
from rlvr.data.dataset import DataSource, PromptDataset, PromptRecord, read_prompts, render_prompt
from rlvr.data.tokenizer import load_tokenizer
from rlvr.core.determinism import use_deterministic_mode
from rlvr.core.errors import ConfigError
from rlvr.rewards.grader import Grader
from rlvr.rollout.rollout import Rollout
from rlvr.runtime import plugins
from rlvr.runtime.engines import (build_engine, embedded_engine, engine_shares_trainer_weights,  # noqa: F401
                                  engine_starts_from_checkpoint, lora_engines_merge, routed_top_k, vllm_lora)
from rlvr.runtime.roles import RolloutRole, TrainerRole
from rlvr.runtime.slime_source import slime_data_source
from rlvr.train import lora
from rlvr.train.teacher import teacher_of
from rlvr.train.trainer import Trainer, save_hf

__all__ = ["Components", "build_engine", "build_local", "check_fits_micro_batch", "embedded_engine", "export_hf",
           "load_tokenizer", "make_agent",
           "make_rollout", "make_trainer", "open_training_data", "read_dataset", "read_eval_sets", "save_hf"]


@dataclass
class Components:
    """What the driver drives: a rollout and a trainer as ``rlvr.runtime.roles`` declares them
    (local objects, or under ``--ray`` handles of actor groups: ``rlvr.distributed``), and
    ``close``, which stops them."""

    tokenizer: object
    rollout: RolloutRole
    trainer: TrainerRole
    eval_sets: dict[str, list[PromptRecord]]
    close: Callable[[], None] = lambda: None

    def __enter__(self) -> Components:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_dataset(cfg: Config, path: str) -> list[PromptRecord]:
    d = cfg.data
    return read_prompts(path, d.input_key, d.label_key, d.metadata_key)


def read_eval_sets(cfg: Config) -> dict[str, list[PromptRecord]]:
    """Every ``--eval-prompt-data`` set by name, read whole (they are small), with
    ``--eval-input-key`` / ``--eval-label-key`` where given."""
    d, e = cfg.data, cfg.eval
    return {name: reasoning_gym.held_out_records(reasoning_gym.parse_spec(path)) if reasoning_gym.is_spec(path)
            else read_prompts(path, e.eval_input_key or d.input_key, e.eval_label_key or d.label_key, d.metadata_key)
            for name, path in e.datasets()}


def open_training_data(cfg: Config, tokenizer) -> PromptDataset | reasoning_gym.TaskStream:
    """The training prompts, streamed from disk; prompts over ``--rollout-max-prompt-len`` dropped.
    A ``reasoning_gym:`` spec is a generated stream instead (its own data source), whose
    ``longest_prompt`` is measured on its first 64 prompts at the starting levels."""
    d = cfg.data
    if reasoning_gym.is_spec(d.prompt_data):
        stream = reasoning_gym.TaskStream(reasoning_gym.parse_spec(d.prompt_data))
        texts = [render_prompt(r.prompt, tokenizer, d.apply_chat_template, d.chat_template_kwargs())
                 for r in reasoning_gym.TaskStream(stream.mix).next_prompts(64)]
        stream.longest_prompt = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
        return stream
    return PromptDataset(d.prompt_data, d.input_key, d.label_key, d.metadata_key, tokenizer=tokenizer,
                         apply_chat_template=d.apply_chat_template, chat_template_kwargs=d.chat_template_kwargs(),
                         max_prompt_len=d.rollout_max_prompt_len)


def build_local(cfg: Config) -> Components:
    """Local mode: trainer, engine and rollout in this process, on ``--device``."""
    tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
    records = open_training_data(cfg, tokenizer)
    check_fits_micro_batch(cfg, records)
    trainer = make_trainer(cfg)
    # The engine starts from the trainer's weights, so both hold the same policy at version 0.
    engine = build_engine(cfg, trainer.model, tokenizer)
    if cfg.cluster.colocate:  # one device, time-shared (rlvr.runtime.colocate)
        from rlvr.runtime.colocate import Colocated

        trainer = Colocated(trainer, engine, offload_optimizer=cfg.cluster.offload_train)
    if lora.enabled(cfg.train) and engine_starts_from_checkpoint(cfg):  # the same policy at version 0
        engine.update_weights(trainer.weights(), version=0)
    rollout = make_rollout(cfg, engine, tokenizer, records)
    return Components(tokenizer, rollout, trainer, read_eval_sets(cfg), close=engine.close)


def make_trainer(cfg: Config, parallel=None, device=None) -> Trainer:
    """The trainer (one data-parallel rank of it when ``parallel`` is given) on ``device``
    (default: what ``--device`` means on this machine; Ray ranks pass their bundle's)."""
    from rlvr.core.device import resolve

    if cfg.run.deterministic_mode:  # before the trainer's first CUDA call (rlvr.core.determinism)
        use_deterministic_mode()
    return Trainer(cfg.train, plugins.trainer_algo(cfg), temperature=cfg.rollout.rollout_temperature,
                   global_batch_size=cfg.global_batch_size, n_samples_per_prompt=cfg.rollout.n_samples_per_prompt,
                   total_steps=cfg.run.num_rollout * cfg.steps_per_rollout, parallel=parallel,
                   teacher=teacher_of(cfg.algo, cfg.reward, cfg.train),
                   device=device if device is not None else resolve(cfg.cluster.device),
                   lora_sync_merged=lora_engines_merge(cfg), custom_tis=plugins.custom_tis(cfg.algo))


def make_rollout(cfg: Config, engine, tokenizer, records) -> Rollout:
    """The rollout, complete: its data source, grader, plugins and agent, prompts rendered with
    the chat template's options (and ``--tools``' schemas)."""
    d, a = cfg.data, cfg.agent
    args = plugins.slime_args(cfg)  # what slime-signature plugins get as ``args``
    source = (slime_data_source(d.data_source_path, args) if d.data_source_path  # slime's DataSource class
              else records if isinstance(records, DataSource)  # a generated stream (reasoning_gym:)
              else DataSource(records, shuffle=d.rollout_shuffle, seed=d.rollout_seed))
    template_kwargs, agent = d.chat_template_kwargs(), None
    if a.per_sample or a.rollout_function_path or cfg.eval.eval_function_path:
        from rlvr.agents.tools import load_tools, tool_schemas

        tools = load_tools(a.tools) if a.tools else None
        if tools:  # prompts are rendered with the tools (the template's tool format)
            template_kwargs = {**(template_kwargs or {}), "tools": tool_schemas(tools)}
        agent = make_agent(cfg, engine, tokenizer, tools, args)
    return Rollout(cfg.rollout, engine, tokenizer, source, Grader(cfg.reward, plugins.custom_reward(cfg.reward, args)),
                   apply_chat_template=d.apply_chat_template, chat_template_kwargs=template_kwargs, agent=agent,
                   seed=cfg.train.seed, deterministic=cfg.run.deterministic_mode,
                   plugins=plugins.rollout_plugins(cfg.rollout, args),
                   top_logprobs_num=cfg.algo.score_centering_top_k if cfg.algo.use_score_centering else 0)


def make_agent(cfg: Config, engine, tokenizer, tools: dict | None = None, args=None):
    """The multi-turn hooks' ``Agent``: its group, the values of other groups it reads, and the
    ``args`` the user's functions get (default ``plugins.slime_args(cfg)``: the config by group and
    by slime's flat names, as slime's functions read it)."""
    from rlvr.agents.hooks import Agent

    limits = None
    if cfg.agent.tools:  # the python tool runs under the code reward's --code-* limits
        from rlvr.sandbox.runner import SandboxLimits

        limits = SandboxLimits.from_reward_config(cfg.reward)
    return Agent(cfg.agent, engine, tokenizer, plugins.slime_args(cfg) if args is None else args, tools=tools,
                 eval_function_path=cfg.eval.eval_function_path,
                 chat_template=cfg.data.chat_template_kwargs() if cfg.data.apply_chat_template else None,
                 max_response_len=cfg.rollout.rollout_max_response_len,
                 failure_value=cfg.reward.reward_failure_value, sandbox_limits=limits)


def check_fits_micro_batch(cfg: Config, records: PromptDataset) -> None:
    """With ``--use-dynamic-batch-size``, the longest prompt plus ``--rollout-max-response-len``
    must fit ``--max-tokens-per-gpu``: known before the first rollout (the dataset measured every
    rendered prompt when it was opened), so refused here rather than left to the trainer (which
    would have to leave such samples out of training)."""
    cap = cfg.train.max_tokens_per_gpu
    if not cfg.train.use_dynamic_batch_size or not len(records):
        return
    longest = records.longest_prompt
    if longest + cfg.rollout.rollout_max_response_len > cap:
        raise ConfigError(
            "--max-tokens-per-gpu",
            f"{cap} cannot hold the longest prompt of {cfg.data.prompt_data} ({longest} tokens) plus "
            f"--rollout-max-response-len {cfg.rollout.rollout_max_response_len}; raise it to at least "
            f"{longest + cfg.rollout.rollout_max_response_len} or lower the response length",
        )


def export_hf(checkpoint: str | Path, out_dir: str | Path, adapter_only: bool = False) -> Path:
    """A plain HF checkpoint (weights, config, tokenizer; no optimizer or run state) from a
    training checkpoint, loadable with ``AutoModelForCausalLM.from_pretrained``. A LoRA run's
    checkpoint is merged into its base, or (``adapter_only``) its adapter is written alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.train import lora

    if lora.is_adapter_checkpoint(checkpoint):
        return lora.export_lora(Path(checkpoint), Path(out_dir), adapter_only)
    if adapter_only:
        raise ConfigError("--adapter-only", f"{checkpoint} is a full fine-tuning checkpoint; it has no adapter")

    save_hf(AutoModelForCausalLM.from_pretrained(checkpoint), AutoTokenizer.from_pretrained(checkpoint), out_dir)
    return Path(out_dir)
