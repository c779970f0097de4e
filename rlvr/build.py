"""Builders: a ``Config`` in, the run's components out (DESIGN "Builders beside the driver").

The driver (``rlvr.loop``) only drives; it, the SFT and eval entry points, the Ray actors
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
from rlvr.data.dataset import DataSource, PromptDataset, PromptRecord, read_prompts
from rlvr.data.tokenizer import load_tokenizer
from rlvr.errors import ConfigError
from rlvr.rewards.grader import Grader
from rlvr.rollout.rollout import Rollout
from rlvr.train.trainer import Trainer

__all__ = ["Components", "build_engine", "build_local", "check_fits_micro_batch", "export_hf", "load_tokenizer",
           "make_rollout", "make_trainer", "open_training_data", "read_dataset", "read_eval_sets", "save_hf"]


@dataclass
class Components:
    """What the driver drives. Under ``--ray``, ``rollout`` and ``trainer`` are proxies of actor
    groups with the same methods (``rlvr.distributed``), and ``close`` stops them."""

    tokenizer: object
    rollout: Rollout
    trainer: Trainer
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
    """Every ``--eval-prompt-data`` set by name, read whole (they are small)."""
    return {name: read_dataset(cfg, path) for name, path in cfg.eval.datasets()}


def open_training_data(cfg: Config, tokenizer) -> PromptDataset:
    """The training prompts, streamed from disk; prompts over ``--rollout-max-prompt-len`` dropped."""
    d = cfg.data
    return PromptDataset(d.prompt_data, d.input_key, d.label_key, d.metadata_key, tokenizer=tokenizer,
                         apply_chat_template=d.apply_chat_template, chat_template_kwargs=d.chat_template_kwargs(),
                         max_prompt_len=d.rollout_max_prompt_len)


def build_local(cfg: Config) -> Components:
    """Local mode: trainer, engine and rollout in this process."""
    tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
    records = open_training_data(cfg, tokenizer)
    check_fits_micro_batch(cfg, records)
    trainer = make_trainer(cfg)
    # The engine starts from the trainer's weights, so both hold the same policy at version 0.
    engine = build_engine(cfg, trainer.model, tokenizer)
    rollout = make_rollout(cfg, engine, tokenizer, records)
    return Components(tokenizer, rollout, trainer, read_eval_sets(cfg), close=getattr(engine, "close", lambda: None))


def make_trainer(cfg: Config, parallel=None) -> Trainer:
    """The trainer (one data-parallel rank of it when ``parallel`` is given)."""
    return Trainer(cfg.train, cfg.algo, temperature=cfg.rollout.rollout_temperature,
                   global_batch_size=cfg.global_batch_size, n_samples_per_prompt=cfg.rollout.n_samples_per_prompt,
                   total_steps=cfg.run.num_rollout * cfg.steps_per_rollout, parallel=parallel,
                   lora_sync_merged=lora_engines_merge(cfg))


def lora_engines_merge(cfg: Config) -> bool:
    """Whether the engines take merged weights rather than LoRA adapters: external servers and
    local mode's `rlvr serve` processes hold plain models; embedded engines (local or Ray actors)
    hold the LoRA-wrapped one."""
    e = cfg.engine
    return not cfg.cluster.ray and bool(e.rollout_external_engine_addrs or e.uses_engine_processes)


def make_rollout(cfg: Config, engine, tokenizer, records) -> Rollout:
    d = cfg.data
    rollout = Rollout(cfg.rollout, engine, tokenizer,
                      DataSource(records, shuffle=d.rollout_shuffle, seed=d.rollout_seed),
                      Grader(cfg.reward), apply_chat_template=d.apply_chat_template,
                      chat_template_kwargs=d.chat_template_kwargs())
    a = cfg.agent
    if a.per_sample or a.rollout_function_path:  # multi-turn hooks (issue 17); they get the whole config, as slime's
        from rlvr.agents.hooks import Agent

        rollout.agent = Agent(cfg, engine, tokenizer, rollout)
    return rollout


def build_engine(cfg: Config, model, tokenizer):
    """The embedded engine on ``model`` (a module or a checkpoint path), a client of the
    ``--rollout-external-engine-addrs`` servers (started on the same checkpoint: version 0), or
    supervised server processes of ``--hf-checkpoint`` (``--rollout-num-engines`` > 1 or
    ``--use-fault-tolerance``; the trainer starts from that checkpoint too: version 0)."""
    r = cfg.engine
    if r.uses_engine_processes:  # supervised `rlvr serve` processes (restarted with --use-fault-tolerance)
        from rlvr.engine.processes import ServeProcesses
        from rlvr.engine.supervisor import EngineSupervisor

        checkpoint = model if isinstance(model, (str, Path)) else cfg.train.hf_checkpoint
        processes = ServeProcesses(checkpoint, seed=cfg.train.seed, max_running_requests=r.rollout_max_running_requests,
                                   log_dir=Path(cfg.run.output_dir) / "engines")
        return EngineSupervisor(processes, r)
    if r.rollout_external_engine_addrs:
        from rlvr.engine.client import HttpEngine

        return HttpEngine(r.rollout_external_engine_addrs, timeout=r.rollout_external_engine_timeout,
                          retries=r.rollout_external_engine_retries)
    from rlvr.engine.embedded import EmbeddedEngine

    return EmbeddedEngine(model, pad_token_id=tokenizer.pad_token_id, seed=cfg.train.seed,
                          max_batch_size=r.rollout_max_running_requests, tokenizer=tokenizer)


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


def save_hf(model, tokenizer, directory: str | Path) -> None:
    """A plain HF checkpoint of ``model`` (a LoRA-wrapped policy is written merged)."""
    from rlvr.train import lora

    merged = lora.merged_weights(model) if lora.has_adapter(model) else None
    model.save_pretrained(directory, state_dict=merged)
    tokenizer.save_pretrained(directory)


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
