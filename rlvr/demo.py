"""The arithmetic demo: build its assets on first use, run GRPO, report held-out accuracy.

Assets live in ``examples/arith/assets/`` (git-ignored), all made by the project's own code:
``base/`` a randomly initialised tiny Qwen2 checkpoint, ``train.jsonl`` / ``test.jsonl`` the
arithmetic task, and ``sft/`` the bootstrap checkpoint GRPO starts from, made by
``rlvr sft --config examples/arith/sft.yaml``. Everything is deterministic given the seeds.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from rlvr.config import parse_config
from rlvr.data.arith import write_splits
from rlvr.models.tiny import build_tiny_model

log = logging.getLogger(__name__)

EXAMPLE_DIR = Path("examples/arith")
ASSETS = EXAMPLE_DIR / "assets"
TINY_MODEL = dict(hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4, num_kv_heads=2)


def is_example_asset(path: str | None) -> bool:
    if not path:
        return False
    try:
        Path(path).resolve().relative_to(ASSETS.resolve())
        return True
    except ValueError:
        return False


def prepare_assets(console: bool = True, sft: bool = True) -> None:
    """Build whatever of the demo's assets is missing (seconds for data/model, ~7 min for SFT)."""
    from rlvr.sft import run_sft

    if not (ASSETS / "train.jsonl").is_file() or not (ASSETS / "test.jsonl").is_file():
        log.info("writing the arithmetic task to %s", ASSETS)
        write_splits(ASSETS)
    if not (ASSETS / "base" / "config.json").is_file():
        log.info("building the tiny base model in %s", ASSETS / "base")
        build_tiny_model(ASSETS / "base", **TINY_MODEL)
    if sft and not (ASSETS / "sft" / "config.json").is_file():
        log.info("bootstrap SFT -> %s (examples/arith/sft.yaml)", ASSETS / "sft")
        cfg = parse_config(["--config", str(EXAMPLE_DIR / "sft.yaml")], rl=False)
        run_sft(cfg, ASSETS / "sft", console=console)


def main(extra_args: list[str] | None = None) -> str:
    """``make demo``: assets, GRPO from the SFT checkpoint, and the summary line."""
    from rlvr.loop import run
    from rlvr.observe import read_metrics

    t0 = time.perf_counter()
    prepare_assets()
    cfg = parse_config(["--config", str(EXAMPLE_DIR / "grpo.yaml"), *(extra_args or [])])
    run_dir = run(cfg)
    evals = [r for r in read_metrics(run_dir) if "eval/step" in r]
    name = cfg.eval.datasets()[0][0]
    before, after = evals[0][f"eval/{name}/score"], evals[-1][f"eval/{name}/score"]
    n_heldout = sum(1 for line in open(cfg.eval.datasets()[0][1]) if line.strip())
    line = (
        f"demo: held-out accuracy {before:.3f} -> {after:.3f} ({100 * (after - before):+.1f} points) "
        f"in {time.perf_counter() - t0:.0f} s"
    )
    print(f"run directory: {run_dir} ({n_heldout} held-out problems, greedy)")
    print(line)
    return line
