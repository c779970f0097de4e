"""Run checkpoints: everything a run needs to continue exactly where it stopped.

Layout of ``--save DIR`` (slime/Megatron keep the same pointer file name)::

    rollout_000004/                        one checkpoint per save; the number = rollouts done
        config.json, model.safetensors, tokenizer files   a plain HF checkpoint (Trainer.save)
        trainer_state.pt                   optimizer(s) and optimizer step (Trainer.save); the LR
                                           schedule is a pure function of the step, so it is the
                                           scheduler state
        run_state.pt                       rollout id, RNG states (torch, python, numpy, the
                                           engine's sampling generator), data-source state, run ids
        config.yaml                        the run's config, for reading
    latest_checkpointed_iteration.txt      "4": the newest *complete* checkpoint

Atomicity: a checkpoint is written under ``rollout_000004.tmp/`` and renamed once complete, then
the pointer file is replaced with ``os.replace``. A crash at any moment leaves the pointer naming
a complete checkpoint; a leftover ``*.tmp`` directory is removed by the next save.

Crash tests (``rlvr.core.testing.crash_point``) SIGKILL the process at a named point, ``rollout:N`` (in
the middle of rollout N, 0-based) or ``save:N`` (half-way through writing the checkpoint after N
rollouts), so they are deterministic.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from rlvr.core.errors import ConfigError
from rlvr.core.testing import crash_point

log = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
RUN_STATE_FILE = "run_state.pt"
_NAME = re.compile(r"^rollout_(\d{6,})$")
_ANY_NAME = re.compile(r"^rollout_(\d+)$")  # the nested config's commands write rollout_100 for rollout_000100


def checkpoint_name(rollout_id: int) -> str:
    return f"rollout_{rollout_id:06d}"


# ---- RNG states ----------------------------------------------------------------------------
def capture_rng(engine_state: Any = None) -> dict[str, Any]:
    """Every random stream a run draws from in this process, and ``engine_state`` (the rollout's
    ``rng_state()``: its engines' samplers) when there is one."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # numpy is optional; nothing can have drawn from it
        pass
    if engine_state is not None:
        state["engine"] = engine_state
    return state


def restore_rng(state: dict[str, Any]) -> Any:
    """Restore this process's streams from ``capture_rng``'s state; returns the engines' part
    (None if it has none) for the rollout's ``set_rng_state``."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    return state.get("engine")


# ---- save ----------------------------------------------------------------------------------
def save_checkpoint(save_dir: str | Path, rollout_id: int, trainer, tokenizer, run_state: dict[str, Any],
                    config_yaml: str, keep_last_k: int | None = None) -> Path:
    """Write checkpoint ``rollout_id`` atomically, point ``latest`` at it, prune old ones."""
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    final = save_dir / checkpoint_name(rollout_id)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.save(tmp, tokenizer=tokenizer, extra={"rollout_id": rollout_id})
    crash_point(f"save:{rollout_id}")  # the crash test kills here: model written, run state not yet
    torch.save({**run_state, "rollout_id": rollout_id}, tmp / RUN_STATE_FILE)
    (tmp / "config.yaml").write_text(config_yaml)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    pointer = save_dir / (LATEST_FILE + ".tmp")
    pointer.write_text(f"{rollout_id}\n")
    os.replace(pointer, save_dir / LATEST_FILE)
    if keep_last_k:
        prune(save_dir, keep_last_k)
    return final


def list_checkpoints(save_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``save_dir``, oldest first (``*.tmp`` leftovers excluded)."""
    save_dir = Path(save_dir)
    if not save_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in save_dir.iterdir() if (m := _NAME.match(p.name))]
    return sorted(c for c in found if (c[1] / RUN_STATE_FILE).is_file())


def prune(save_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (never the one ``latest`` names)."""
    latest = read_latest(save_dir)
    ckpts = list_checkpoints(save_dir)
    removed = []
    for rid, path in ckpts[:-keep] if keep < len(ckpts) else []:
        if rid != latest:
            shutil.rmtree(path)
            removed.append(path)
    return removed


# ---- load ----------------------------------------------------------------------------------
def read_latest(load_dir: str | Path) -> int | None:
    """The rollout id ``latest_checkpointed_iteration.txt`` names, or None when there is none."""
    pointer = Path(load_dir) / LATEST_FILE
    if not pointer.is_file():
        return None
    text = pointer.read_text().strip()
    if not text.isdigit():
        raise ConfigError("--load", f"{pointer} should hold a rollout number, got {text!r}")
    return int(text)


def find_checkpoint(load_dir: str | Path, flag: str = "--load") -> Path | None:
    """The checkpoint ``--load`` names: ``load_dir`` itself when it is one (``rollout_000004``, or
    ``rollout_4`` as the nested config's commands write it), else the newest complete checkpoint under it;
    None when the directory has none yet (slime's behaviour: the same command line starts a run
    and restarts it). Errors name ``flag``."""
    load_dir = Path(load_dir)
    if (load_dir / RUN_STATE_FILE).is_file():
        return load_dir
    if (m := _ANY_NAME.match(load_dir.name)) and not (load_dir / LATEST_FILE).is_file():
        path = load_dir.with_name(checkpoint_name(int(m.group(1))))
        if not (path / RUN_STATE_FILE).is_file():
            raise ConfigError(flag, f"{load_dir} is not a complete checkpoint (no {path / RUN_STATE_FILE}); give "
                                        "a rollout_* directory that has one, or the --save directory (its newest)")
        return path
    rollout_id = read_latest(load_dir)
    if rollout_id is None:
        return None
    path = load_dir / checkpoint_name(rollout_id)
    if not (path / RUN_STATE_FILE).is_file():
        raise ConfigError(flag, f"{load_dir / LATEST_FILE} names {path.name}, which is missing or "
                                    "incomplete; point the file at a complete rollout_* directory")
    return path


def read_run_state(path: str | Path) -> dict[str, Any]:
    # weights_only=False: the state holds python's RNG tuple and numpy's state; the file is ours.
    return torch.load(Path(path) / RUN_STATE_FILE, weights_only=False)
