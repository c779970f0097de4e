"""The driver: one RL run, top to bottom (STYLE point 4, DESIGN "One RL step").

    resume from --load (if a checkpoint is there)
    for rollout_id in range(start, num_rollout):
        batch   = source.next_batch(rollout_id)           # sample + grade (or a saved debug rollout)
        metrics = trainer.train(rollout_id, batch.samples) # advantages, loss, optimizer step(s)
        source.update_weights(trainer.weights(), rollout_id + 1)  # every --update-weights-interval
        maybe evaluate, log, maybe save

``build`` wires the components from a ``Config`` (each gets its own group); ``run`` drives them.
The batch source is the one difference between the modes (``rlvr.rollout.producer``): the
synchronous one generates rollout ``r`` when asked; ``--async``'s producer thread generates all the
time, within ``--max-staleness``. ``ledger.jsonl`` records every trained sample's uid and weight
versions (and, at the end of an async run, the groups still pending).
A checkpoint (``rlvr.checkpoint``) is written after everything about its rollout is logged, and
holds all the state the next rollout depends on, so a run killed at any point and resumed with
``--load`` logs the same values as one that was never stopped. slime's debug split:
``--save-debug-rollout-data`` writes each ``RolloutBatch``, ``--load-debug-rollout-data`` trains
on them instead of sampling (``--debug-train-only``), ``--debug-rollout-only`` samples without
training.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml
from transformers import AutoTokenizer

from rlvr.checkpoint import capture_rng, crash_hook, find_checkpoint, read_run_state, restore_rng, save_checkpoint
from rlvr.config import Config
from rlvr.data.dataset import DataSource, PromptDataset, PromptRecord, read_prompts, render_prompt
from rlvr.errors import ConfigError, DataError
from rlvr.engine.embedded import EmbeddedEngine
from rlvr.jsonl import iter_objects
from rlvr.observe import ConsoleProgress, MetricsLogger, plot_runs
from rlvr.rewards.grader import Grader
from rlvr.rollout.producer import AsyncProducer, SyncBatches
from rlvr.rollout.rollout import Rollout
from rlvr.train.trainer import Trainer
from rlvr.types import RolloutBatch, Sample

log = logging.getLogger(__name__)


@dataclass
class Components:
    """What ``run`` drives. Under ``--ray``, ``rollout`` and ``trainer`` are proxies of actor
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


def export_hf(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """A plain HF checkpoint (weights, config, tokenizer; no optimizer or run state) from a
    training checkpoint, loadable with ``AutoModelForCausalLM.from_pretrained``."""
    from transformers import AutoModelForCausalLM

    save_hf(AutoModelForCausalLM.from_pretrained(checkpoint), AutoTokenizer.from_pretrained(checkpoint), out_dir)
    return Path(out_dir)


def open_training_data(cfg: Config, tokenizer) -> PromptDataset:
    """The training prompts, streamed from disk; prompts over ``--rollout-max-prompt-len`` dropped."""
    d = cfg.data
    return PromptDataset(d.prompt_data, d.input_key, d.label_key, d.metadata_key, tokenizer=tokenizer,
                         apply_chat_template=d.apply_chat_template, chat_template_kwargs=d.chat_template_kwargs(),
                         max_prompt_len=d.rollout_max_prompt_len)


def build(cfg: Config) -> Components:
    tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
    records = open_training_data(cfg, tokenizer)
    check_fits_micro_batch(cfg, records)
    eval_sets = {name: read_dataset(cfg, path) for name, path in cfg.eval.datasets()}
    if cfg.cluster.ray:  # the same components as actor groups on Ray
        from rlvr.distributed import start_on_ray

        rollout, trainer, close = start_on_ray(cfg)
        return Components(tokenizer, rollout, trainer, eval_sets, close)
    trainer = make_trainer(cfg)
    # The engine starts from the trainer's weights, so both hold the same policy at version 0.
    engine = build_engine(cfg, trainer.model, tokenizer)
    rollout = make_rollout(cfg, engine, tokenizer, records)
    return Components(tokenizer, rollout, trainer, eval_sets, close=getattr(engine, "close", lambda: None))


def make_trainer(cfg: Config, parallel=None) -> Trainer:
    """The trainer (one data-parallel rank of it when ``parallel`` is given)."""
    return Trainer(cfg.train, cfg.algo, temperature=cfg.rollout.rollout_temperature,
                   global_batch_size=cfg.global_batch_size, n_samples_per_prompt=cfg.rollout.n_samples_per_prompt,
                   total_steps=cfg.run.num_rollout * cfg.steps_per_rollout, parallel=parallel)


def make_rollout(cfg: Config, engine, tokenizer, records: PromptDataset) -> Rollout:
    d = cfg.data
    return Rollout(cfg.rollout, engine, tokenizer, DataSource(records, shuffle=d.rollout_shuffle, seed=d.rollout_seed),
                   Grader(cfg.reward), apply_chat_template=d.apply_chat_template,
                   chat_template_kwargs=d.chat_template_kwargs())


def build_engine(cfg: Config, model, tokenizer):
    """The embedded engine on ``model`` (a module or a checkpoint path), a client of the
    ``--rollout-external-engine-addrs`` servers (started on the same checkpoint: version 0), or
    supervised server processes of ``--hf-checkpoint`` (``--rollout-num-engines`` > 1 or
    ``--use-fault-tolerance``; the trainer starts from that checkpoint too: version 0)."""
    r = cfg.rollout
    if r.uses_engine_processes:  # supervised `rlvr serve` processes (restarted with --use-fault-tolerance)
        from rlvr.engine.supervisor import EngineSupervisor

        checkpoint = model if isinstance(model, (str, Path)) else cfg.train.hf_checkpoint
        return EngineSupervisor(
            str(checkpoint), r.rollout_num_engines, fault_tolerance=r.use_fault_tolerance,
            health_check_interval=r.rollout_health_check_interval, health_check_timeout=r.rollout_health_check_timeout,
            max_restarts=r.rollout_max_engine_restarts, seed=cfg.train.seed,
            max_running_requests=r.rollout_max_running_requests, log_dir=Path(cfg.run.output_dir) / "engines")
    if r.rollout_external_engine_addrs:
        from rlvr.engine.client import HttpEngine

        return HttpEngine(r.rollout_external_engine_addrs, timeout=r.rollout_external_engine_timeout,
                          retries=r.rollout_external_engine_retries)
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


def skipped_rollout_path(run_dir: Path, rollout_id: int) -> Path:
    """Where a rollout whose optimizer step was skipped (non-finite loss/grad) is saved for replay."""
    return run_dir / "skipped_rollouts" / f"rollout_{rollout_id:06d}.pt"


def prepare_run_dir(output_dir: str, resume: dict | None = None) -> Path:
    """Create the run directory. A fresh run moves a previous run's outputs there to
    ``archive/<time>/`` (never overwritten, never appended to), so each metrics stream describes
    one run. A resumed run (``resume`` = the checkpoint's run state) continues the same streams:
    records logged after the checkpoint (by the run that crashed) are cut, since they are about
    to be logged again, so nothing is lost or duplicated."""
    run_dir = Path(output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume is not None:
        truncate_streams(run_dir, resume["rollout_id"], resume["train_step"])
        return run_dir
    old = [run_dir / n for n in ("metrics.jsonl", "samples.jsonl", "ledger.jsonl", "tensorboard", "wandb",
                                 "curves.png", "config.yaml")]
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


def truncate_streams(run_dir: Path, rollout_id: int, train_step: int) -> None:
    """Keep the records of ``metrics.jsonl`` / ``samples.jsonl`` up to a checkpoint taken after
    ``rollout_id`` rollouts and ``train_step`` optimizer steps; drop later ones (and a truncated
    last line)."""
    limits = {"rollout/step": rollout_id - 1, "train/step": train_step, "eval/step": rollout_id}
    keep_metric = lambda r: all(r[k] <= v for k, v in limits.items() if k in r)  # noqa: E731
    keep_sample = lambda r: r.get("rollout_id", 0) < rollout_id  # noqa: E731
    for name, keep in (("metrics.jsonl", keep_metric), ("samples.jsonl", keep_sample), ("ledger.jsonl", keep_sample)):
        path = run_dir / name
        if not path.is_file():
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the truncated last line of a killed writer is expected
            rows = [r for _, r in iter_objects(path, allow_truncated_tail=True)]
        kept = [r for r in rows if keep(r)]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, path)
        if len(kept) < len(rows):
            log.info("resume: cut %d records of %s logged after the checkpoint", len(rows) - len(kept), path)


def open_logger(cfg: Config, run_dir: Path, resume: dict | None) -> MetricsLogger:
    """metrics.jsonl always; TensorBoard and W&B when asked for (seed 000 §2.7.3)."""
    r = cfg.run
    tb_dir = run_dir / "tensorboard"
    if r.tb_project_name or r.tb_experiment_name:
        tb_dir = tb_dir / (r.tb_project_name or "rlvr") / (r.tb_experiment_name or run_dir.name)
    sinks = []
    if r.use_wandb:
        from rlvr.observe.wandb_sink import WandbSink

        sinks.append(WandbSink(run_dir, r.wandb_project, r.wandb_mode, r.wandb_group,
                               run_id=(resume or {}).get("wandb_run_id"), config=cfg.to_dict()))
    return MetricsLogger(run_dir, use_tensorboard=r.use_tensorboard, tb_dir=tb_dir, sinks=sinks)


def resume_point(cfg: Config) -> tuple[Path | None, dict | None]:
    """The checkpoint ``--load`` names (its newest complete one) and its run state, or (None, None)."""
    if cfg.run.load is None:
        return None, None
    ckpt = find_checkpoint(cfg.run.load)
    if ckpt is None:
        log.warning("--load %s: no checkpoint there yet; starting a fresh run", cfg.run.load)
        return None, None
    saved = yaml.safe_load((ckpt / "config.yaml").read_text())
    changed = [f"{g}.{k}" for g, fields in cfg.to_dict().items() if g != "run"
               for k, v in fields.items() if saved.get(g, {}).get(k, v) != v]
    if changed:  # allowed (e.g. a new LR), but the run is then no longer the same run
        log.warning("resuming %s with settings that differ from the checkpoint's: %s", ckpt, ", ".join(changed))
    return ckpt, read_run_state(ckpt)


def restore(c: Components, ckpt: Path, state: dict) -> None:
    """Put the trainer, engine, data source and RNGs back where the checkpoint left them."""
    c.trainer.load(ckpt)
    c.rollout.update_weights(c.trainer.weights(), version=state["rollout_id"])
    c.rollout.data_source.load_state_dict(state["data_source"])
    restore_rng(state["rng"], c.rollout.engine)
    log.info("resumed from %s: rollout %d, train step %d", ckpt, state["rollout_id"], c.trainer.step)


def save(cfg: Config, c: Components, done: int, logger: MetricsLogger, source) -> None:
    """Checkpoint after ``done`` rollouts (and the plain HF copy ``--save-hf`` asks for)."""
    state = {"train_step": c.trainer.step, "data_source": source.data_state(),
             "rng": capture_rng(c.rollout.engine),
             "wandb_run_id": next((s.run_id for s in logger.sinks if hasattr(s, "run_id")), None)}
    t0 = time.perf_counter()
    path = save_checkpoint(cfg.run.save_dir, done, c.trainer, c.tokenizer, state,
                           yaml.safe_dump(cfg.to_dict(), sort_keys=False), cfg.run.keep_last_k)
    log.info("saved %s in %.1f s", path, time.perf_counter() - t0)
    if cfg.run.save_hf and "{rollout_id}" in cfg.run.save_hf:
        save_hf(c.trainer.model, c.tokenizer, cfg.run.save_hf.format(rollout_id=done))


def next_batch(cfg: Config, rollout: Rollout, rollout_id: int) -> RolloutBatch:
    """Rollout ``rollout_id``: sampled and graded, or replayed from ``--load-debug-rollout-data``;
    saved to ``--save-debug-rollout-data`` when asked (slime's debug split)."""
    r = cfg.run
    if r.load_debug_rollout_data:
        path = Path(r.load_debug_rollout_data.format(rollout_id=rollout_id))
        if not path.is_file():
            raise DataError(str(path), None, f"no saved rollout {rollout_id} (--load-debug-rollout-data)")
        batch = RolloutBatch.load(path)
    else:
        batch = rollout.generate(rollout_id)
    if r.save_debug_rollout_data:
        batch.save(r.save_debug_rollout_data.format(rollout_id=rollout_id))
    return batch


def batch_source(cfg: Config, c: Components, start: int):
    """Where batches come from: generated on request (``SyncBatches``), or by the ``--async``
    producer -- a thread beside the trainer, or under ``--ray`` one on the rollout manager actor."""
    a, r = cfg.asynchronous, cfg.rollout
    if not a.async_train:
        return SyncBatches(c.rollout, lambda rollout_id: next_batch(cfg, c.rollout, rollout_id))
    args = (r.rollout_concurrency or r.rollout_batch_size, a.max_staleness, a.weight_update_inflight, start)
    if cfg.cluster.ray:  # the producer runs on the rollout manager actor, beside the engines
        return c.rollout.async_source(*args)
    return AsyncProducer(c.rollout, *args)


def run(cfg: Config, console: bool = True) -> Path:
    """Train for ``--num-rollout`` rollouts (continuing a ``--load`` checkpoint); return the run directory."""
    ckpt, resume = resume_point(cfg)
    run_dir = prepare_run_dir(cfg.run.output_dir, resume)
    cfg.save_yaml(run_dir / "config.yaml")
    start = resume["rollout_id"] if resume else 0
    n_rollout, eval_every, save_every = cfg.run.num_rollout, cfg.eval.eval_interval, cfg.run.save_interval
    push_every = cfg.asynchronous.update_weights_interval
    train = not cfg.run.debug_rollout_only

    def evaluate(step: int) -> dict[str, float]:
        """Log ``eval/*`` at ``eval/step``; return them with ``perf/eval_time`` (a rollout-record key)."""
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        for name, records in c.eval_sets.items():
            metrics |= rollout.evaluate(name, records, cfg.eval)
        logger.log(metrics, "eval/step", step)
        return metrics | {"perf/eval_time": time.perf_counter() - t0}

    # The components are closed on every exit (Ray: actors and cluster stopped, also on Ctrl-C;
    # local: the engine's worker thread or server processes).
    with build(cfg) as c:
        rollout, trainer = c.rollout, c.trainer
        if ckpt is not None:
            restore(c, ckpt, resume)
        with (
            batch_source(cfg, c, start) as source,
            open_logger(cfg, run_dir, resume) as logger,
            ConsoleProgress(n_rollout, start=start, enabled=console) as progress,
        ):
            if c.eval_sets and not cfg.eval.skip_eval_before_train and start == 0:
                evaluate(0)
            for rollout_id in range(start, n_rollout):
                t_step = time.perf_counter()
                batch = source.next_batch(rollout_id)
                crash_hook(f"rollout:{rollout_id}")  # crash tests only: SIGKILL in the middle of a rollout
                train_metrics, perf = {}, {}
                if train:
                    train_metrics = trainer.train(rollout_id, batch.samples)
                    if train_metrics.get("train/skipped_steps"):  # keep the bad rollout for inspection
                        batch.save(skipped_rollout_path(run_dir, rollout_id))
                    if (rollout_id + 1) % push_every == 0:
                        t0 = time.perf_counter()
                        source.update_weights(trainer.weights(), version=rollout_id + 1)
                        perf["perf/update_weights_time"] = time.perf_counter() - t0
                    # perf/* go with the rollout record, so the time split of a rollout is one record.
                    perf |= {k: v for k, v in train_metrics.items() if k.startswith("perf/")}
                    logger.log({k: v for k, v in train_metrics.items() if not k.startswith("perf/")},
                               "train/step", trainer.step)

                done = rollout_id + 1
                eval_metrics = {}
                if c.eval_sets and ((eval_every and done % eval_every == 0) or done == n_rollout):
                    if train and done % push_every:  # an eval sees the trainer's weights, pushed or not
                        source.update_weights(trainer.weights(), version=done)
                    source.wait_for_weights()
                    eval_metrics = evaluate(done)
                    perf["perf/eval_time"] = eval_metrics.pop("perf/eval_time")
                perf["perf/step_time"] = time.perf_counter() - t_step
                logger.log(batch.metrics | perf, "rollout/step", rollout_id)
                write_samples(run_dir / "samples.jsonl", batch)
                write_ledger(run_dir / "ledger.jsonl", batch.rollout_id, batch.samples, trained=train)
                # Saved after everything about this rollout is logged: a resumed run logs nothing twice.
                if train and ((save_every and done % save_every == 0) or done == n_rollout):
                    save(cfg, c, done, logger, source)
                progress.advance(rollout_id, batch.metrics | train_metrics | perf | eval_metrics)
                trainer.guard.raise_if_exhausted(lambda rid: str(skipped_rollout_path(run_dir, rid)))
            source.close()
            pending = [s for g in source.pending_groups() for s in g]
            write_ledger(run_dir / "ledger.jsonl", n_rollout, pending, trained=False)  # drawn, never trained
        if cfg.run.save_hf and "{rollout_id}" not in cfg.run.save_hf:
            save_hf(trainer.model, c.tokenizer, cfg.run.save_hf)
    plot_runs([run_dir], run_dir / "curves.png")
    return run_dir


def write_ledger(path: Path, rollout_id: int, samples: list[Sample], trained: bool) -> None:
    """One line per sample the loop took (``trained``) or left pending at the end of an async
    run: its uid, prompt, and the weight versions of its tokens -- what tests check "every group
    trained exactly once" and the staleness bound against."""
    with open(path, "a") as f:
        for s in samples:
            v = s.weight_versions
            row = {"rollout_id": rollout_id, "uid": s.uid, "prompt_index": s.prompt_index, "trained": trained,
                   "status": s.status.value, "version_min": min(v) if v else None,
                   "version_max": max(v) if v else None, "staleness": rollout_id - min(v) if v and trained else None}
            f.write(json.dumps(row) + "\n")


def write_samples(path: Path, batch: RolloutBatch, k: int = 4) -> None:
    """Append the first ``k`` samples of the rollout, and every sample whose grading failed
    (with its ``reward_error``), for reading."""
    with open(path, "a") as f:
        for i, s in enumerate(batch.samples):
            if i >= k and "reward_error" not in s.metadata:
                continue
            row = {"rollout_id": batch.rollout_id, "index": s.index, "uid": s.uid, "prompt": s.prompt,
                   "response": s.response, "label": s.label, "reward": s.reward, "status": s.status.value,
                   "weight_versions": sorted(set(s.weight_versions))}
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
    source = DataSource(open_training_data(cfg, tokenizer), seed=d.rollout_seed)
    trainer = Trainer(cfg.train, cfg.algo, temperature=1.0, total_steps=cfg.run.num_rollout)

    def to_sample(r: PromptRecord) -> Sample:
        text = render_prompt(r.prompt, tokenizer, d.apply_chat_template, d.chat_template_kwargs())
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
    engine = build_engine(cfg, cfg.train.hf_checkpoint, tokenizer)
    metrics: dict[str, float] = {}
    for name, path in cfg.eval.datasets():
        records = read_dataset(cfg, path)
        rollout = Rollout(cfg.rollout, engine, tokenizer, DataSource(records), Grader(cfg.reward),
                          apply_chat_template=d.apply_chat_template, chat_template_kwargs=d.chat_template_kwargs())
        metrics |= rollout.evaluate(name, records, cfg.eval)
    return metrics
