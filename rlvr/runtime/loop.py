"""The driver: one RL run, top to bottom (DESIGN "One RL step").

    resume from --load (if a checkpoint is there)
    for rollout_id in range(start, num_rollout):
        batch   = source.next_batch(rollout_id)           # sample + grade (or a saved debug rollout)
        metrics = trainer.train(rollout_id, batch.samples) # advantages, loss, optimizer step(s)
        source.update_weights(trainer.weights(), rollout_id + 1)  # every --update-weights-interval
        maybe evaluate, log, maybe save

``rlvr.runtime.build`` wires the components from a ``Config`` (each gets its own group); ``run`` drives them,
through what ``rlvr.runtime.roles`` declares of a rollout and a trainer (local or on Ray alike).
The batch source is the one difference between the modes (``rlvr.rollout.producer``): the
synchronous one generates rollout ``r`` when asked; ``--async``'s producer thread generates all the
time, within ``--max-staleness``. ``ledger.jsonl`` records every trained sample's uid and weight
versions (and, at the end of an async run, the groups still pending).
A checkpoint (``rlvr.runtime.checkpoint``) is written after everything about its rollout is logged, and
holds all the state the next rollout depends on, so a run killed at any point and resumed with
``--load`` logs the same values as one that was never stopped. slime's debug split:
``--save-debug-rollout-data`` writes each ``RolloutBatch``, ``--load-debug-rollout-data`` trains
on them instead of sampling (``--debug-train-only``), ``--debug-rollout-only`` samples without
training.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlvr.runtime.build import Components, build_local
from rlvr.runtime.freshness import FreshnessGuard, freshness_guard
from rlvr.runtime.checkpoint import capture_rng, find_checkpoint, read_run_state, restore_rng, save_checkpoint
from rlvr.config import Config
from rlvr.core.errors import DataError
from rlvr.observe import ConsoleProgress, MetricsLogger, plot_runs
from rlvr.observe.run_files import open_logger, prepare_run_dir, skipped_rollout_path, write_ledger, write_samples
from rlvr.rollout.pipeline import PipelinedProducer
from rlvr.rollout.producer import BatchSource, SyncBatches, make_producer
from rlvr.rollout.rollout import Rollout
from rlvr.core.testing import crash_point
from rlvr.core.types import RolloutBatch

log = logging.getLogger(__name__)


def run(cfg: Config, console: bool = True) -> Path:
    """Train for ``--num-rollout`` rollouts (continuing a ``--load`` checkpoint); return the run directory."""
    ckpt, resume = resume_point(cfg)
    run_dir = prepare_run_dir(cfg.run.output_dir, resume)
    cfg.save_yaml(run_dir / "config.yaml")
    start = resume["rollout_id"] if resume else 0
    # The components are closed on every exit (Ray: actors and cluster stopped, also on Ctrl-C;
    # local: the engine's worker thread or server processes).
    with build(cfg) as c:
        if ckpt is not None:
            restore(c, ckpt, resume)
        with (
            batch_source(cfg, c, start, resume) as source,
            open_logger(cfg.run, run_dir, resume, cfg.to_dict()) as logger,
            ConsoleProgress(cfg.run.num_rollout, start=start, enabled=console) as progress,
        ):
            r = Step(cfg, c, source, logger, run_dir, freshness_guard(cfg, c.tokenizer))
            r.check_freshness(start)  # the engine starts on the trainer's policy (a --load, an adapter)
            if c.eval_sets and not cfg.eval.skip_eval_before_train and start == 0:
                r.evaluate(0)
            for rollout_id in range(start, cfg.run.num_rollout):
                progress.advance(rollout_id, r.rollout(rollout_id))
                c.trainer.check_bad_steps(lambda rid: str(skipped_rollout_path(run_dir, rid)))
            source.close()
            pending = [s for g in source.pending_groups() for s in g]
            write_ledger(run_dir / "ledger.jsonl", cfg.run.num_rollout, pending, trained=False)  # drawn, never trained
        if cfg.run.save_hf and "{rollout_id}" not in cfg.run.save_hf:
            c.trainer.save_hf(c.tokenizer, cfg.run.save_hf)
    plot_runs([run_dir], run_dir / "curves.png")
    return run_dir


def build(cfg: Config) -> Components:
    """Local components, or under ``--ray`` the same as proxies of actor groups."""
    if cfg.cluster.ray:
        from rlvr.distributed import start_on_ray

        return start_on_ray(cfg)
    return build_local(cfg)


@dataclass
class Step:
    """One rollout of the loop: sample, train, push weights, evaluate, log, save."""

    cfg: Config
    c: Components
    source: BatchSource  # SyncBatches / AsyncProducer / RolloutFunctionProducer / RayAsyncSource
    logger: MetricsLogger
    run_dir: Path
    guard: FreshnessGuard  # the policy-freshness probe after pushes (rlvr.runtime.freshness)

    def rollout(self, rollout_id: int) -> dict[str, float]:
        """Rollout ``rollout_id`` end to end; returns what the console shows."""
        cfg, t0 = self.cfg, time.perf_counter()
        done, train = rollout_id + 1, not cfg.run.debug_rollout_only
        batch = self.source.next_batch(rollout_id)
        if cfg.run.save_debug_rollout_data:  # whichever source made it: sync, async or pipelined
            batch.save(cfg.run.save_debug_rollout_data.format(rollout_id=rollout_id))
        crash_point(f"rollout:{rollout_id}")  # crash tests only: SIGKILL in the middle of a rollout
        train_metrics, perf = self.train(rollout_id, batch) if train else ({}, {})
        eval_metrics = {}
        if self.c.eval_sets and ((cfg.eval.eval_interval and done % cfg.eval.eval_interval == 0)
                                 or done == cfg.run.num_rollout):
            if train and done % cfg.asynchronous.update_weights_interval:  # eval sees the trainer's weights
                self.source.update_weights(self.c.trainer.weights(), version=done)
            self.source.wait_for_weights()
            if train and not isinstance(self.source, SyncBatches):  # the push is loaded now
                perf |= self.check_freshness(done)
            eval_metrics = self.evaluate(done)
            perf["perf/eval_time"] = eval_metrics.pop("perf/eval_time")
        perf["perf/step_time"] = time.perf_counter() - t0
        self.logger.log(batch.metrics | perf, "rollout/step", rollout_id)
        write_samples(self.run_dir / "samples.jsonl", batch, decode=self.c.tokenizer.decode)
        write_ledger(self.run_dir / "ledger.jsonl", batch.rollout_id, batch.samples, trained=train)
        # Saved after everything about this rollout is logged: a resumed run logs nothing twice.
        if train and ((cfg.run.save_interval and done % cfg.run.save_interval == 0) or done == cfg.run.num_rollout):
            save(cfg, self.c, done, self.logger, self.source)
        return batch.metrics | train_metrics | perf | eval_metrics

    def train(self, rollout_id: int, batch: RolloutBatch) -> tuple[dict[str, float], dict[str, float]]:
        """Optimizer step(s) on the batch, then the weights to the engines (every
        ``--update-weights-interval``); returns (train metrics, perf metrics)."""
        trainer, perf = self.c.trainer, {}
        metrics = trainer.train(rollout_id, batch.samples)
        if metrics.get("train/skipped_steps"):  # keep the bad rollout for inspection
            batch.save(skipped_rollout_path(self.run_dir, rollout_id))
        if (rollout_id + 1) % self.cfg.asynchronous.update_weights_interval == 0:
            t0 = time.perf_counter()
            self.source.update_weights(trainer.weights(), version=rollout_id + 1)
            perf["perf/update_weights_time"] = time.perf_counter() - t0
            if isinstance(self.source, SyncBatches):  # the engine holds the push now
                perf |= self.check_freshness(rollout_id + 1)
        # perf/* go with the rollout record, so the time split of a rollout is one record; so do the
        # trainer's rollout/* (slime's per-rollout means of log-probs, advantages, ...: rollout/step).
        perf |= {k: v for k, v in metrics.items() if k.startswith(("perf/", "rollout/"))}
        self.logger.log({k: v for k, v in metrics.items() if not k.startswith(("perf/", "rollout/"))}, "train/step",
                        trainer.step)
        return metrics, perf

    def check_freshness(self, version: int) -> dict[str, float]:
        """The freshness guard's probe of the engine just given ``version`` (nothing when it is off)."""
        return self.guard.check(self.c.rollout, self.c.trainer, version) if self.guard.enabled else {}

    def evaluate(self, step: int) -> dict[str, float]:
        """Log ``eval/*`` at ``eval/step``; return them with ``perf/eval_time`` (a rollout-record key)."""
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        for name, records in self.c.eval_sets.items():
            metrics |= self.c.rollout.evaluate(name, records, self.cfg.eval)
        self.logger.log(metrics, "eval/step", step)
        return metrics | {"perf/eval_time": time.perf_counter() - t0}


def resume_point(cfg: Config) -> tuple[Path | None, dict | None]:
    """The checkpoint ``--load`` names (a rollout_* directory, or the newest complete one under a
    --save directory) and its run state, or (None, None)."""
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
    c.rollout.load_data_state(state["data_source"])
    c.rollout.set_rng_state(restore_rng(state["rng"]))
    log.info("resumed from %s: rollout %d, train step %d", ckpt, state["rollout_id"], c.trainer.step)


def save(cfg: Config, c: Components, done: int, logger: MetricsLogger, source) -> None:
    """Checkpoint after ``done`` rollouts (and the plain HF copy ``--save-hf`` asks for)."""
    state = {"train_step": c.trainer.step, **source.checkpoint_state(),  # data source (+ made batches)
             "rng": capture_rng(c.rollout.rng_state()),
             "wandb_run_id": next((s.run_id for s in logger.sinks if hasattr(s, "run_id")), None)}
    t0 = time.perf_counter()
    path = save_checkpoint(cfg.run.save_dir, done, c.trainer, c.tokenizer, state,
                           yaml.safe_dump(cfg.to_dict(), sort_keys=False), cfg.run.keep_last_k)
    log.info("saved %s in %.1f s", path, time.perf_counter() - t0)
    if cfg.run.save_hf and "{rollout_id}" in cfg.run.save_hf:
        c.trainer.save_hf(c.tokenizer, cfg.run.save_hf.format(rollout_id=done))


def next_batch(cfg: Config, rollout: Rollout, rollout_id: int) -> RolloutBatch:
    """Rollout ``rollout_id``: sampled and graded, or replayed from ``--load-debug-rollout-data``
    (slime's debug split; ``Step.rollout`` saves every source's batches to ``--save-debug-rollout-data``)."""
    r = cfg.run
    if r.load_debug_rollout_data:
        path = Path(r.load_debug_rollout_data.format(rollout_id=rollout_id))
        if not path.is_file():
            raise DataError(str(path), None, f"no saved rollout {rollout_id} (--load-debug-rollout-data)")
        return RolloutBatch.load(path)
    return rollout.generate(rollout_id)


def batch_source(cfg: Config, c: Components, start: int, resume: dict | None = None):
    """Where batches come from: generated on request (``SyncBatches``), or by the ``--async``
    producer -- a thread beside the trainer (with ``--deterministic-mode`` the pipelined one, whose
    schedule the rollout ids fix, resumed with the batches its checkpoint holds), or under
    ``--ray`` one on the rollout manager actor."""
    a, r = cfg.asynchronous, cfg.rollout

    def make(rollout_id: int) -> RolloutBatch:
        return next_batch(cfg, c.rollout, rollout_id)

    if not a.async_train:
        return SyncBatches(c.rollout, make)
    if cfg.run.deterministic_mode:
        return PipelinedProducer(c.rollout, make, a.max_staleness, start, cfg.run.num_rollout,
                                 (resume or {}).get("pipeline"))
    args = (r.rollout_concurrency or r.rollout_batch_size, a.max_staleness, a.weight_update_inflight, start)
    if cfg.cluster.ray:  # the producer runs on the rollout manager actor, beside the engines
        return c.rollout.async_source(*args)
    return make_producer(c.rollout, *args)
