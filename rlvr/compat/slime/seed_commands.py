"""The launch commands that go with the nested YAML config (``rlvr.compat.slime.seed_config``) as
``rlvr`` command lines.

They start, resume and export with::

    python -m slime.train --config FILE --experiment_name NAME --output_dir DIR
    python -m slime.train --config FILE --resume_from DIR/rollout_100
    python -m slime.export_hf --megatron_ckpt DIR/rollout_200 --output_dir OUT

``python -m rlvr.train`` and ``python -m rlvr.export_hf`` take the same flags; ``train_argv`` and
``export_argv`` turn them into ``rlvr train`` / ``rlvr export`` arguments (any other flag passes
through as an rlvr flag). With these commands, checkpoints sit directly in ``--output_dir``
(``DIR/rollout_100``), so ``--output_dir DIR`` is both rlvr's run directory and its ``--save``;
``--resume_from DIR/rollout_N`` is ``--load`` of that checkpoint, continuing in ``DIR`` unless
``--output_dir`` says otherwise. ``--experiment_name`` names the run in TensorBoard
(``--tb-experiment-name``) and in the run's ``config.yaml``.

>>> train_argv(["--config", "f.yaml", "--experiment_name", "v1", "--output_dir", "ck", "--lr", "1e-5"])
['--config', 'f.yaml', '--lr', '1e-5', '--tb-experiment-name', 'v1', '--output-dir', 'ck', '--save', 'ck']
>>> train_argv(["--config", "f.yaml", "--resume_from", "ck/rollout_100"])
['--config', 'f.yaml', '--load', 'ck/rollout_100', '--output-dir', 'ck', '--save', 'ck']
>>> export_argv(["--megatron_ckpt", "ck/rollout_200", "--output_dir", "hf"])
['ck/rollout_200', 'hf']
"""

from __future__ import annotations

import argparse
from pathlib import Path


TRAIN_USAGE = """python -m rlvr.train: the nested config's command flags, then every rlvr train flag (below)
  --experiment_name NAME   the run's TensorBoard name (--tb-experiment-name)
  --output_dir DIR         run directory and checkpoints (--output-dir DIR --save DIR)
  --resume_from CKPT       resume from this rollout_N checkpoint (--load CKPT), in its directory
"""


def _seed_parser(prog: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)


def train_argv(argv: list[str]) -> list[str]:
    """``python -m rlvr.train`` flags -> ``rlvr train`` flags."""
    p = _seed_parser("python -m rlvr.train")
    p.add_argument("--experiment_name")
    p.add_argument("--output_dir")
    p.add_argument("--resume_from")
    seed, rest = p.parse_known_args(argv)
    out = list(rest)
    if seed.experiment_name is not None:
        out += ["--tb-experiment-name", seed.experiment_name]
    if seed.resume_from is not None:
        out += ["--load", seed.resume_from]
    run_dir = seed.output_dir or (str(Path(seed.resume_from).parent) if seed.resume_from else None)
    if run_dir is not None:
        saves = any(a == "--save" or a.startswith("--save=") for a in rest)  # an explicit --save wins
        out += ["--output-dir", run_dir] + ([] if saves else ["--save", run_dir])
    return out


def export_argv(argv: list[str]) -> list[str]:
    """``python -m rlvr.export_hf`` flags -> ``rlvr export`` arguments. ``--megatron_ckpt`` names
    an rlvr checkpoint (``rollout_N``, or a --save directory: its newest), which is already in
    Hugging Face format plus the optimizer state; export writes the model and tokenizer alone."""
    p = argparse.ArgumentParser(prog="python -m rlvr.export_hf", allow_abbrev=False,
                                description="the nested config's export command: rlvr export CHECKPOINT OUT")
    p.add_argument("--megatron_ckpt", required=True, help="a rollout_* checkpoint, or a --save directory (its newest)")
    p.add_argument("--output_dir", required=True, help="where the Hugging Face checkpoint is written")
    p.add_argument("--adapter-only", action="store_true", help="LoRA runs: the adapter alone (rlvr export)")
    a = p.parse_args(argv)
    return [a.megatron_ckpt, a.output_dir] + (["--adapter-only"] if a.adapter_only else [])
