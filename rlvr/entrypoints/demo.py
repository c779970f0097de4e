"""``rlvr demo --tiny``, the tiny-model arithmetic demo: build its assets on first use, run GRPO,
report held-out accuracy. (``rlvr demo`` without ``--tiny`` is the SmolLM2 demo, ``rlvr.entrypoints.demo_smollm2``.)

Assets live in ``examples/arith/assets/`` (git-ignored), all made by the project's own code:
``base/`` a randomly initialised tiny Qwen2 checkpoint; ``train.jsonl``, ``val.jsonl`` (500
problems cut from train) and ``test.jsonl`` (the 500 held-out problems the demo reports on) the
arithmetic task; and ``sft/`` the bootstrap checkpoint GRPO starts from, made by ``rlvr sft
--config examples/arith/sft.yaml``, which stops early once greedy *validation* accuracy reaches
``--sft-stop-score``. The test split is only read by GRPO's evaluation, to report.

``rlvr demo --seed N`` changes the bootstrap's data order and training seed and GRPO's prompt
order and sampling; its bootstrap goes to ``assets/seed-N/sft`` and its runs to
``runs/arith-*-seed-N``, so the default seed's assets are never overwritten. The bootstrap is
reproducible given the seed and thread count; GRPO is bit-for-bit only with ``--deterministic-mode``
(without it the engine's batches form as the rollout's requests arrive, and its gain varies by a
few points between runs: README).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from rlvr.data.arith import write_splits

log = logging.getLogger(__name__)

EXAMPLE_DIR = Path("examples/arith")
ASSETS = EXAMPLE_DIR / "assets"
TINY_MODEL = dict(hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4, num_kv_heads=2)
N_VAL = 500  # validation problems (cut from train): what the bootstrap stops on and recipes are chosen on
BOOTSTRAP_FILE = "bootstrap.json"  # in the SFT checkpoint: SFT steps run and the validation score reached


def is_example_asset(path: str | None) -> bool:
    if not path:
        return False
    try:
        Path(path).resolve().relative_to(ASSETS.resolve())
        return True
    except ValueError:
        return False


def sft_dir(seed: int | None) -> Path:
    return ASSETS / "sft" if seed is None else ASSETS / f"seed-{seed}" / "sft"


def seed_flags(seed: int | None, run_name: str) -> list[str]:
    """Flags that make a run of seed ``seed`` (none for the default: the YAML's seeds)."""
    if seed is None:
        return []
    return ["--seed", str(seed), "--rollout-seed", str(seed), "--output-dir", f"runs/{run_name}-seed-{seed}"]


def prepare_assets(console: bool = True, sft: bool = True, seed: int | None = None) -> None:
    """Build whatever of the demo's assets is missing (seconds for data/model, minutes for SFT)."""
    if not all((ASSETS / f).is_file() for f in ("train.jsonl", "val.jsonl", "test.jsonl")):
        log.info("writing the arithmetic task to %s", ASSETS)
        write_splits(ASSETS, n_val=N_VAL)
    if not (ASSETS / "base" / "config.json").is_file():
        from rlvr.models.tiny import build_tiny_model

        log.info("building the tiny base model in %s", ASSETS / "base")
        build_tiny_model(ASSETS / "base", **TINY_MODEL)
    if sft and not (sft_dir(seed) / BOOTSTRAP_FILE).is_file():
        bootstrap(sft_dir(seed), seed, console)


def bootstrap(out: Path, seed: int | None, console: bool = True) -> dict:
    """The SFT bootstrap of ``seed`` into ``out``; notes its steps and validation score there."""
    from rlvr.entrypoints.sft import run_sft
    from rlvr.observe import read_metrics
    from rlvr.runtime.configure import parse_config

    log.info("bootstrap SFT -> %s (examples/arith/sft.yaml)", out)
    cfg = parse_config(["--config", str(EXAMPLE_DIR / "sft.yaml"), *seed_flags(seed, "arith-sft")], rl=False)
    run_sft(cfg, out, console=console)
    records = read_metrics(cfg.run.output_dir)
    name = cfg.eval.datasets()[0][0]
    last_eval = [r for r in records if "eval/step" in r][-1]
    info = {"seed": cfg.train.seed, "sft_steps": max(r["train/step"] for r in records if "train/step" in r),
            "val_score": last_eval[f"eval/{name}/score"], "stop_score": cfg.eval.sft_stop_score}
    (out / BOOTSTRAP_FILE).write_text(json.dumps(info) + "\n")
    return info


def main(argv: list[str] | None = None) -> str:
    """``rlvr demo``: the SmolLM2 demo (``rlvr.entrypoints.demo_smollm2``, what ``make demo`` runs), or with
    ``--tiny`` this module's tiny-model arithmetic demo."""
    argv = list(argv or [])
    if "--tiny" not in argv:
        from rlvr.entrypoints import demo_smollm2

        return demo_smollm2.main(argv)
    return main_tiny([a for a in argv if a != "--tiny"])


def main_tiny(argv: list[str] | None = None) -> str:
    """``rlvr demo --tiny``: assets, GRPO from the SFT checkpoint, and the summary line. ``--seed N``
    (see the module docstring); any other flag overrides ``examples/arith/grpo.yaml``."""
    p = argparse.ArgumentParser(prog="rlvr demo --tiny", description="the tiny-model arithmetic demo end to end")
    p.add_argument("--seed", type=int, default=None, help="seed of the bootstrap and of GRPO (default: the YAMLs')")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, see below)")
    a, extra = p.parse_known_args(argv or [])
    from rlvr.observe import read_metrics
    from rlvr.runtime.configure import parse_config
    from rlvr.runtime.loop import run

    # One thread by default: float results then do not depend on the machine's core count, and on a
    # shared 2-core machine two threads per process thrash (an SFT step measured 12.7 s with 2
    # threads at load ~17, 0.6 s with 1 thread at load ~8-15; ~0.1 s with 2 threads on a quiet machine).
    import torch

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    prepare_assets(seed=a.seed)
    boot = json.loads((sft_dir(a.seed) / BOOTSTRAP_FILE).read_text())
    cfg = parse_config(["--config", str(EXAMPLE_DIR / "grpo.yaml"), "--hf-checkpoint", str(sft_dir(a.seed)),
                        *seed_flags(a.seed, "arith-grpo"), *extra])
    run_dir = run(cfg)
    evals = [r for r in read_metrics(run_dir) if "eval/step" in r]
    name = cfg.eval.datasets()[0][0]
    before, after = evals[0][f"eval/{name}/score"], evals[-1][f"eval/{name}/score"]
    n_heldout = sum(1 for line in open(cfg.eval.datasets()[0][1]) if line.strip())
    line = (
        f"demo: held-out accuracy {before:.3f} -> {after:.3f} ({100 * (after - before):+.1f} points) "
        f"in {time.perf_counter() - t0:.0f} s"
    )
    print(f"bootstrap: validation accuracy {boot['val_score']:.3f} after {boot['sft_steps']} SFT steps "
          f"(stop at >= {boot['stop_score']}, seed {boot['seed']})")
    print(f"run directory: {run_dir} ({n_heldout} held-out problems, greedy)")
    print(line)
    return line
