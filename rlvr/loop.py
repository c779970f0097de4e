"""The driver: one RL run, top to bottom (STYLE point 4, DESIGN "One RL step").

    for rollout_id in range(num_rollout):
        batch   = rollout.generate(rollout_id)            # sample + grade
        metrics = trainer.train(rollout_id, batch.samples) # advantages, loss, optimizer step(s)
        rollout.update_weights(trainer.weights(), rollout_id + 1)
        maybe evaluate, maybe save, log

``build`` wires the components from a ``Config`` (each gets its own group); ``run`` drives them.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer

from rlvr.config import Config
from rlvr.errors import ConfigError
from rlvr.data.dataset import DataSource, PromptRecord, read_prompts, render_prompt
from rlvr.engine.embedded import EmbeddedEngine
from rlvr.observe import ConsoleProgress, MetricsLogger, plot_runs
from rlvr.rewards.grader import Grader
from rlvr.rollout.rollout import Rollout
from rlvr.train.trainer import Trainer
from rlvr.types import RolloutBatch, Sample

log = logging.getLogger(__name__)


@dataclass
class Components:
    tokenizer: object
    rollout: Rollout
    trainer: Trainer
    eval_sets: dict[str, list[PromptRecord]]


def load_tokenizer(path: str):
    """The checkpoint's tokenizer; one without a pad token pads with EOS."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def read_dataset(cfg: Config, path: str) -> list[PromptRecord]:
    d = cfg.data
    return read_prompts(path, d.input_key, d.label_key, d.metadata_key)


def save_hf(model, tokenizer, directory: str | Path) -> None:
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def build(cfg: Config) -> Components:
    d = cfg.data
    tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
    records = read_dataset(cfg, d.prompt_data)
    check_fits_micro_batch(cfg, tokenizer, records)
    eval_sets = {name: read_dataset(cfg, path) for name, path in cfg.eval.datasets()}
    trainer = Trainer(
        cfg.train,
        cfg.algo,
        temperature=cfg.rollout.rollout_temperature,
        global_batch_size=cfg.global_batch_size,
        n_samples_per_prompt=cfg.rollout.n_samples_per_prompt,
        total_steps=cfg.run.num_rollout * cfg.steps_per_rollout,
    )
    # The engine starts from the trainer's weights, so both hold the same policy at version 0.
    engine = EmbeddedEngine(trainer.model, pad_token_id=tokenizer.pad_token_id, seed=cfg.train.seed)
    rollout = Rollout(
        cfg.rollout,
        engine,
        tokenizer,
        DataSource(records, shuffle=d.rollout_shuffle, seed=d.rollout_seed),
        Grader(cfg.reward),
        apply_chat_template=d.apply_chat_template,
    )
    return Components(tokenizer, rollout, trainer, eval_sets)


def check_fits_micro_batch(cfg: Config, tokenizer, records: list[PromptRecord]) -> None:
    """With ``--use-dynamic-batch-size``, the longest prompt plus ``--rollout-max-response-len``
    must fit ``--max-tokens-per-gpu``: known before the first rollout, so refused here rather than
    left to the trainer (which would have to leave such samples out of training)."""
    cap = cfg.train.max_tokens_per_gpu
    if not cfg.train.use_dynamic_batch_size or not records:
        return
    texts = [render_prompt(r.prompt, tokenizer, cfg.data.apply_chat_template) for r in records]
    longest = max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    if longest + cfg.rollout.rollout_max_response_len > cap:
        raise ConfigError(
            "--max-tokens-per-gpu",
            f"{cap} cannot hold the longest prompt of {cfg.data.prompt_data} ({longest} tokens) plus "
            f"--rollout-max-response-len {cfg.rollout.rollout_max_response_len}; raise it to at least "
            f"{longest + cfg.rollout.rollout_max_response_len} or lower the response length",
        )


def skipped_rollout_path(run_dir: Path, rollout_id: int) -> Path:
    """Where a rollout whose optimizer step was skipped (non-finite loss/grad) is saved for replay."""
    return run_dir / "skipped_rollouts" / f"rollout_{rollout_id:06d}.pt"


def prepare_run_dir(output_dir: str) -> Path:
    """Create the run directory; a previous run's outputs there are moved to ``archive/<time>/``
    (never overwritten, never appended to), so each metrics stream describes one run."""
    run_dir = Path(output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    old = [run_dir / n for n in ("metrics.jsonl", "samples.jsonl", "tensorboard", "curves.png", "config.yaml")]
    old = [p for p in old if p.exists()]
    if old:
        stamp, k = time.strftime("%Y%m%d-%H%M%S"), 0
        while (archive := run_dir / "archive" / (stamp + (f"-{k}" if k else ""))).exists():
            k += 1
        archive.mkdir(parents=True)
        for p in old:
            p.rename(archive / p.name)
        log.info("moved the previous run's outputs in %s to %s", run_dir, archive)
    return run_dir


def run(cfg: Config, console: bool = True) -> Path:
    """Train for ``--num-rollout`` rollouts; return the run directory."""
    run_dir = prepare_run_dir(cfg.run.output_dir)
    cfg.save_yaml(run_dir / "config.yaml")
    c = build(cfg)
    rollout, trainer = c.rollout, c.trainer
    n_rollout, eval_every, save_every = cfg.run.num_rollout, cfg.eval.eval_interval, cfg.run.save_interval

    def evaluate(step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        for name, records in c.eval_sets.items():
            metrics |= rollout.evaluate(name, records, cfg.eval)
        metrics["perf/eval_time"] = time.perf_counter() - t0
        logger.log(metrics, "eval/step", step)
        return metrics

    with MetricsLogger(run_dir, use_tensorboard=cfg.run.use_tensorboard) as logger, ConsoleProgress(
        n_rollout, enabled=console
    ) as progress:
        if c.eval_sets and not cfg.eval.skip_eval_before_train:
            evaluate(0)
        for rollout_id in range(n_rollout):
            t_step = time.perf_counter()
            batch = rollout.generate(rollout_id)
            train_metrics = trainer.train(rollout_id, batch.samples)
            if train_metrics.get("train/skipped_steps"):  # keep the bad rollout for inspection
                batch.save(skipped_rollout_path(run_dir, rollout_id))
            t0 = time.perf_counter()
            rollout.update_weights(trainer.weights(), version=rollout_id + 1)
            perf = {"perf/update_weights_time": time.perf_counter() - t0}

            done = rollout_id + 1
            eval_metrics = {}
            if c.eval_sets and ((eval_every and done % eval_every == 0) or done == n_rollout):
                eval_metrics = evaluate(done)
            if (save_every and done % save_every == 0) or done == n_rollout:
                trainer.save(cfg.run.save_dir / f"rollout_{done:06d}", tokenizer=c.tokenizer, extra={"rollout_id": done})
            perf["perf/step_time"] = time.perf_counter() - t_step

            logger.log(train_metrics, "train/step", trainer.step)
            logger.log(batch.metrics | perf, "rollout/step", rollout_id)
            write_samples(run_dir / "samples.jsonl", batch)
            progress.advance(rollout_id, batch.metrics | train_metrics | perf | eval_metrics)
            trainer.guard.raise_if_exhausted(lambda rid: str(skipped_rollout_path(run_dir, rid)))
    plot_runs([run_dir], run_dir / "curves.png")
    return run_dir


def write_samples(path: Path, batch: RolloutBatch, k: int = 4) -> None:
    """Append the first ``k`` samples of the rollout, and every sample whose grading failed
    (with its ``reward_error``), for reading."""
    with open(path, "a") as f:
        for i, s in enumerate(batch.samples):
            if i >= k and "reward_error" not in s.metadata:
                continue
            row = {"rollout_id": batch.rollout_id, "index": s.index, "prompt": s.prompt, "response": s.response,
                   "label": s.label, "reward": s.reward, "status": s.status.value}
            if "reward_error" in s.metadata:
                row["reward_error"] = s.metadata["reward_error"]
            f.write(json.dumps(row, default=str) + "\n")


SFT_LOG_EVERY = 50  # SFT steps are short: one console line per 50 (metrics.jsonl has every step)


def run_sft(cfg: Config, out_dir: str | Path, console: bool = True) -> Path:
    """Supervised bootstrap: ``--num-rollout`` steps of NLL on ``label`` as the response.

    Each step takes ``--rollout-batch-size`` prompts; the response is the label text followed
    by the EOS token. Writes a plain HF checkpoint to ``out_dir``.
    """
    d = cfg.data
    run_dir = prepare_run_dir(cfg.run.output_dir)
    cfg.save_yaml(run_dir / "config.yaml")
    tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
    source = DataSource(read_dataset(cfg, d.prompt_data), seed=d.rollout_seed)
    trainer = Trainer(cfg.train, cfg.algo, temperature=1.0, total_steps=cfg.run.num_rollout)

    def to_sample(r: PromptRecord) -> Sample:
        text = render_prompt(r.prompt, tokenizer, d.apply_chat_template)
        response = tokenizer(str(r.label), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return Sample(text, tokenizer(text, add_special_tokens=False)["input_ids"], label=r.label,
                      response_ids=response, loss_mask=[1] * len(response))

    with MetricsLogger(run_dir, use_tensorboard=cfg.run.use_tensorboard) as logger, ConsoleProgress(
        cfg.run.num_rollout, enabled=console
    ) as progress:
        for step in range(cfg.run.num_rollout):
            t0 = time.perf_counter()
            metrics = trainer.train_sft([to_sample(r) for r in source.next_prompts(cfg.rollout.rollout_batch_size)])
            metrics["perf/train_time"] = time.perf_counter() - t0
            logger.log(metrics, "train/step", trainer.step)
            last = step + 1 == cfg.run.num_rollout
            progress.advance(step, metrics, show=step % SFT_LOG_EVERY == 0 or last)
            if cfg.run.save_interval and (step + 1) % cfg.run.save_interval == 0 and not last:
                save_hf(trainer.model, tokenizer, Path(out_dir) / f"step_{step + 1:06d}")
    save_hf(trainer.model, tokenizer, out_dir)
    return Path(out_dir)


def run_eval(cfg: Config) -> dict[str, float]:
    """Evaluate ``--hf-checkpoint`` on every ``--eval-prompt-data`` set (no training)."""
    d = cfg.data
    tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
    engine = EmbeddedEngine(cfg.train.hf_checkpoint, pad_token_id=tokenizer.pad_token_id, seed=cfg.train.seed)
    metrics: dict[str, float] = {}
    for name, path in cfg.eval.datasets():
        records = read_dataset(cfg, path)
        rollout = Rollout(cfg.rollout, engine, tokenizer, DataSource(records), Grader(cfg.reward),
                          apply_chat_template=d.apply_chat_template)
        metrics |= rollout.evaluate(name, records, cfg.eval)
    return metrics
