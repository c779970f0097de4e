"""Weights & Biases sink (``--use-wandb``), as slime's ``logging_utils`` uses it.

Each step key gets its own x axis (``wandb.define_metric("rollout/*", step_metric="rollout/step")``
and so on), so rollout, train and eval curves are plotted against their own steps, and the
record is logged with its step key inside. ``--wandb-mode offline`` writes the run under
``OUTPUT_DIR/wandb/`` with no network (``wandb sync`` uploads it later). The run id is kept in
checkpoints, so a resumed run continues the same W&B run. NaN/inf values are sent as they are.
"""

from __future__ import annotations

from pathlib import Path

from rlvr.observe.metrics import STEP_KEYS


class WandbSink:
    def __init__(self, run_dir: str | Path, project: str | None, mode: str = "online", group: str | None = None,
                 name: str | None = None, run_id: str | None = None, config: dict | None = None):
        import wandb

        self._wandb = wandb
        self.run = wandb.init(project=project or "rlvr", group=group, name=name or Path(run_dir).name,
                              dir=str(run_dir), mode=mode, id=run_id, resume="allow" if run_id else None,
                              config=config, settings=wandb.Settings(console="off", silent=True, disable_git=True))
        for key in STEP_KEYS:
            prefix = key.split("/")[0]
            self.run.define_metric(key)
            self.run.define_metric(f"{prefix}/*", step_metric=key)
        self.run.define_metric("perf/*", step_metric="rollout/step")

    @property
    def run_id(self) -> str:
        return self.run.id

    def log(self, values: dict[str, float | None], step_key: str, step: int) -> None:
        self.run.log({step_key: step, **{k: v for k, v in values.items() if v is not None}})

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
