"""``rlvr`` command line: train, sft, eval, serve, plot, export, demo, import-gguf, and the tiny-asset builders.

Errors a user can fix (a bad flag, file or data line) print one line naming what to change and
exit with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from rlvr.core.errors import ConfigError, DataError, TrainingStopped
from rlvr.core.moved import show_moved_warnings
from rlvr.core.registry import WORKDIR_ENV


def parse_values(argv: list[str], prog: str) -> dict:
    """Flat ``{field: value}`` of flags + YAML. The flags are parsed by the declarative config
    (``rlvr.config.parse``) before anything else is imported, so ``--help`` loads no torch and
    no implementation."""
    from rlvr.config.parse import make_parser

    ns = make_parser(prog).parse_args(argv)
    from rlvr.runtime.configure import merged_values

    return merged_values(ns)


def _config_with_assets(argv: list[str], prog: str, rl: bool):
    """Parse flags + YAML; when they name the example's assets, build those first (first use)."""
    values = parse_values(argv, prog)
    from rlvr.entrypoints import demo
    from rlvr.runtime.configure import config_from_values

    if any(demo.is_example_asset(values.get(k)) for k in ("hf_checkpoint", "prompt_data")):
        demo.prepare_assets(sft=rl)  # SFT itself only needs the data and the base model
    return config_from_values(values, rl=rl)


def _train(argv: list[str]) -> None:
    cfg = _config_with_assets(argv, "rlvr train", rl=True)
    from rlvr.runtime.loop import run

    run(cfg)


def _sft(argv: list[str]) -> None:
    from pathlib import Path

    cfg = _config_with_assets(argv, "rlvr sft", rl=False)
    from rlvr.entrypoints.sft import run_sft

    out = run_sft(cfg, cfg.run.save or Path(cfg.run.output_dir) / "model")
    print(f"sft: wrote {out}")


def _eval(argv: list[str]) -> None:
    values = parse_values(argv, "rlvr eval")
    from rlvr.config import build_config
    from rlvr.entrypoints.evaluate import run_eval
    from rlvr.runtime.configure import check_inputs

    cfg = build_config(values)
    for group in (cfg.train, cfg.data, cfg.eval, cfg.rollout):  # no RL, so only these groups matter
        group.validate()
    check_inputs(cfg)
    if not cfg.eval.eval_prompt_data:
        raise ConfigError("--eval-prompt-data", "is required: NAME PATH [NAME PATH ...] or one PATH")
    metrics = run_eval(cfg)
    width = max(len(k) for k in metrics)
    for key, value in sorted(metrics.items()):
        print(f"{key:<{width}}  {value:.4f}")


def _plot(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="rlvr plot", description="PNG dashboard of one or more runs")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--out", default=None, help="PNG path; default FIRST_RUN_DIR/curves.png")
    a = p.parse_args(argv)
    from rlvr.observe import plot_runs

    print(plot_runs(a.run_dirs, a.out))


def _export(argv: list[str]) -> None:
    from pathlib import Path

    p = argparse.ArgumentParser(prog="rlvr export", description="write a plain Hugging Face checkpoint "
                                "(model + tokenizer, no optimizer) from a training checkpoint")
    p.add_argument("checkpoint", help="a rollout_* checkpoint (rollout_000004 or rollout_4), or a --save directory "
                                      "(its newest checkpoint)")
    p.add_argument("out_dir")
    p.add_argument("--adapter-only", action="store_true",
                   help="LoRA runs: write the adapter alone (PEFT's files) instead of the merged model")
    a = p.parse_args(argv)
    from rlvr.runtime.build import export_hf
    from rlvr.runtime.checkpoint import find_checkpoint

    src = Path(a.checkpoint)
    if not ((src / "config.json").is_file() or (src / "adapter_config.json").is_file()):
        src = find_checkpoint(src, flag="checkpoint")  # rollout_N, or the newest under a --save directory
        if src is None:
            raise ConfigError("checkpoint", f"{a.checkpoint} is neither a checkpoint nor a --save directory with one "
                                            "(rlvr's checkpoints are Hugging Face format; a Megatron torch_dist "
                                            "checkpoint must be converted to Hugging Face format first)")
    print(export_hf(src, a.out_dir, adapter_only=a.adapter_only))


def _demo(argv: list[str]) -> None:
    from rlvr.entrypoints import demo

    demo.main(argv)


def _serve(argv: list[str]) -> None:
    from rlvr.entrypoints.serve import main as serve

    serve(argv)


def _agents(argv: list[str]) -> None:
    if argv[:1] != ["check"]:
        raise ConfigError("rlvr agents", "the command is `rlvr agents check [module:fn] FLAGS` (one prompt through "
                                         "your generate function / tools / environment, its segments and masks)")
    from rlvr.entrypoints.agents_check import main as check

    if check(argv[1:]):
        raise SystemExit(1)


# rlvr.models.tiny.ARCHITECTURES' names, declared here so that --help imports no torch
# (tests/test_cli_help.py checks that the two agree)
TINY_ARCHITECTURES = ["cohere", "gemma2", "gemma3", "gpt_neox", "llama", "mistral", "phi3", "qwen2", "qwen3", "qwen3_moe"]


def _make_tiny_model(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="rlvr make-tiny-model")
    p.add_argument("out_dir")
    p.add_argument("--arch", default="qwen2", choices=TINY_ARCHITECTURES)
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from rlvr.models.tiny import build_tiny_model

    print(build_tiny_model(a.out_dir, arch=a.arch, hidden_size=a.hidden_size, intermediate_size=3 * a.hidden_size,
                           num_layers=a.num_layers, seed=a.seed))


def _import_gguf(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="rlvr import-gguf", description="write a GGUF file (any transformers "
                                "reads) as a plain HF checkpoint: config, safetensors, tokenizer, chat template")
    p.add_argument("gguf_file")
    p.add_argument("out_dir")
    p.add_argument("--dtype", default="float32", help="dtype of the written weights: float32 or bfloat16 "
                   "(rlvr.models.gguf.DTYPES checks it)")
    a = p.parse_args(argv)
    from rlvr.models.gguf import import_gguf

    print(import_gguf(a.gguf_file, a.out_dir, a.dtype))


def _make_arith_data(argv: list[str]) -> None:
    from rlvr.data.arith import write_splits

    p = argparse.ArgumentParser(prog="rlvr make-arith-data")
    p.add_argument("out_dir")
    p.add_argument("--n-test", type=int, default=500)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--n-val", type=int, default=0, help="also write val.jsonl: this many problems cut from train")
    a = p.parse_args(argv)
    print(*write_splits(a.out_dir, n_val=a.n_val, n_test=a.n_test, seed=a.seed))


COMMANDS = {
    "train": (_train, "RL training (GRPO and the other estimators) on a HF checkpoint"),
    "sft": (_sft, "supervised bootstrap: NLL on the label as the response"),
    "eval": (_eval, "evaluate a checkpoint on held-out sets (greedy by default) and print a table"),
    "serve": (_serve, "serve a checkpoint over SGLang's HTTP protocol (+ OpenAI routes) on 127.0.0.1"),
    "plot": (_plot, "PNG dashboard of run directories"),
    "export": (_export, "write a plain HF checkpoint from a training checkpoint"),
    "agents": (_agents, "agents check [module:fn] FLAGS: one prompt through your multi-turn rollout, its segments and masks"),
    "demo": (_demo, "GRPO on SmolLM2-135M-Instruct end to end (what `make demo` runs); --tiny: the tiny-model demo"),
    "import-gguf": (_import_gguf, "write a GGUF file (e.g. a packaged model) as a plain HF checkpoint"),
    "make-tiny-model": (_make_tiny_model, "write a tiny random HF causal LM + tokenizer"),
    "make-arith-data": (_make_arith_data, "write the arithmetic task's train/test (and --n-val: val) JSONL"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: rlvr COMMAND [flags]   (rlvr COMMAND --help for its flags)\n\ncommands:")
        for name, (_, doc) in COMMANDS.items():
            print(f"  {name:<17} {doc}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # A user's module:fn in this directory imports in every process the command starts (rlvr.core.registry).
    os.environ[WORKDIR_ENV] = os.getcwd()
    show_moved_warnings()  # a plugin importing an old path (rlvr.types) is told the new one
    try:
        COMMANDS[argv[0]][0](argv[1:])
    except (ConfigError, DataError) as e:
        print(f"rlvr {argv[0]}: error: {e}", file=sys.stderr)
        return 2
    except TrainingStopped as e:
        print(f"rlvr {argv[0]}: stopped: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
