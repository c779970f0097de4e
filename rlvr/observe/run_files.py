"""The files of a run directory: metric streams, sampled responses, the ledger of trained
samples, and the archive/resume rules that keep each stream about exactly one run.

``metrics.jsonl`` (and TensorBoard / W&B, ``MetricsLogger``), ``samples.jsonl`` (a few responses
per rollout and every one whose grading failed), ``ledger.jsonl`` (every sample the loop trained
or left pending, with its weight versions), ``skipped_rollouts/`` (rollouts whose optimizer step
was skipped). A fresh run archives a previous run's files; a resumed run cuts what was logged
after its checkpoint, so nothing is lost or logged twice.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from rlvr.core.jsonl import iter_objects
from rlvr.observe.metrics import MetricsLogger

if TYPE_CHECKING:
    from rlvr.config.groups import RunConfig
    from rlvr.core.types import RolloutBatch, Sample

log = logging.getLogger(__name__)


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


def open_logger(r: RunConfig, run_dir: Path, resume: dict | None, config: dict | None = None) -> MetricsLogger:
    """metrics.jsonl always; TensorBoard and W&B (``r``: the run group's flags) when asked for;
    ``config`` is the resolved config W&B records with the run."""
    # slime: --tensorboard-dir, else $TENSORBOARD_DIR; rlvr's default keeps it inside the run directory
    root = r.tensorboard_dir or os.environ.get("TENSORBOARD_DIR")
    tb_dir = Path(root) if root else run_dir / "tensorboard"
    if r.tb_project_name or r.tb_experiment_name:
        tb_dir = tb_dir / (r.tb_project_name or "rlvr") / (r.tb_experiment_name or run_dir.name)
    sinks = []
    if r.use_wandb:
        from rlvr.observe.wandb_sink import WandbSink

        sinks.append(WandbSink(run_dir, r.wandb_project, r.wandb_mode, r.wandb_group,
                               run_id=(resume or {}).get("wandb_run_id"), config=config))
    return MetricsLogger(run_dir, use_tensorboard=r.use_tensorboard, tb_dir=tb_dir, sinks=sinks)


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


# What a reader needs of a multi-turn sample, from its metadata (rlvr.agents).
SAMPLE_FIELDS = ("reward_error", "agent_error", "agent_traceback", "turns", "tool_calls", "tool_errors", "tool_counts",
                 "openai_calls", "cut_tokens", "engine_error", "task")  # task: a mixed dataset's family


def segments_of(s: Sample, decode: Callable[..., str] | None) -> list[dict]:
    """The response's runs of equal loss mask: ``{"loss_mask": 0|1, "tokens": n, "text": ...}``
    (``text`` decoded with special tokens, when ``decode`` is given).

    >>> from rlvr.core.types import Sample
    >>> segments_of(Sample("p", [1], response_ids=[4, 5, 6], loss_mask=[1, 1, 0]), None)
    [{'loss_mask': 1, 'tokens': 2}, {'loss_mask': 0, 'tokens': 1}]
    """
    out = []
    for a, b, trainable in s.segments():
        row = {"loss_mask": int(trainable), "tokens": b - a}
        if decode is not None:
            row["text"] = decode(s.response_ids[a:b])
        out.append(row)
    return out


def write_samples(path: Path, batch: RolloutBatch, k: int = 4, decode: Callable[..., str] | None = None) -> None:
    """Append the first ``k`` samples of the rollout, and every sample whose grading or generate
    function failed (with its ``reward_error`` / ``agent_error``), for reading. A multi-turn
    sample also gets its ``segments`` (text, token count, loss mask of each) and its turn and
    tool-call counts."""
    with open(path, "a") as f:
        for i, s in enumerate(batch.samples):
            failed = "reward_error" in s.metadata or "agent_error" in s.metadata
            if i >= k and not failed:
                continue
            row = {"rollout_id": batch.rollout_id, "index": s.index, "uid": s.uid, "prompt": s.prompt,
                   "response": s.response, "label": s.label, "reward": s.reward, "status": s.status.value,
                   "weight_versions": sorted(set(s.weight_versions))}
            row |= {key: s.metadata[key] for key in SAMPLE_FIELDS if key in s.metadata}
            if "turns" in s.metadata:
                row["segments"] = segments_of(s, decode)
            f.write(json.dumps(row, default=str) + "\n")
