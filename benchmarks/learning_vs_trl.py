"""Learning per wall-clock second: rlvr vs TRL's GRPOTrainer from the same bootstrap checkpoint.

Both sides start from the same checkpoint on the same training prompts and reward (rlvr's ``math``
reward; TRL calls it through ``rlvr.rewards.score``), with the same GRPO settings, all read from one
recipe (``--recipe``, parsed by rlvr's own config): by default the tiny-model demo's
``examples/arith/grpo.yaml`` (its SFT bootstrap, the arithmetic prompts); with
``--recipe examples/smollm2/grpo.yaml`` the real-model demo's (SmolLM2-135M-Instruct from
``make smollm2``, chat prompts rendered with the model's template on both sides: rlvr
``--apply-chat-template``, TRL conversational prompts). The shared settings:
prompts per step, samples per prompt, max response length, sampling temperature (top-p 1, no
top-k), learning rate (constant: neither side knows its step count in advance under a time
budget), Adam betas, gradient clipping, PPO clip range (0.2 / 0.28 in the tiny recipe, 0.2 / 0.2
in SmolLM2's), one optimizer step per rollout (on-policy), group-normalised advantages (mean and
std), per-sequence token-mean loss (TRL ``loss_type="grpo"``), and the tiny recipe's KL loss to the
initial policy with the k3 estimator (rlvr ``low_var_kl``, TRL ``beta``; SmolLM2's has none),
and the same recomputation choice (rlvr ``--recompute-activations`` from the recipe, or on for both
with ``--recompute-activations`` here; TRL ``gradient_checkpointing``, which TRL 1.16 turns on by
default, so it is always set explicitly).
What TRL cannot do identically: the tiny demo's DAPO dynamic-sampling filter (``nonzero_std``:
resample until every group in the batch has reward variance) has no TRL counterpart, so it is
off on the rlvr side too; and rlvr clamps k3 to [-10, 10] (slime's ``low_var_kl``), TRL does not
(the KL stays far below that here).

Each side runs in its own process with the same thread count for ``--budget`` seconds of wall
time, counted from its first training step (model load and set-up excluded on both sides), and
keeps the policy after the last step that ended at or before each mark (every ``--mark-every``
seconds); the time spent keeping those copies is not counted. Afterwards one evaluator (rlvr's
``run_eval``: greedy, the recipe's held-out test split, 500 problems in the tiny recipe and 200 in
SmolLM2's) scores every kept checkpoint of both sides. It prints a table, writes
``docs/learning_vs_trl.png`` (``docs/learning_vs_trl_smollm2.png``) and ends with one JSON line.

    pip install -e ".[bench]"    # TRL, accelerate, datasets: benchmark-only
    python benchmarks/learning_vs_trl.py [--budget 240] [--mark-every 30]
    python benchmarks/learning_vs_trl.py --recipe examples/smollm2/grpo.yaml --budget 300 --mark-every 60 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ARITH_RECIPE, SMOLLM2_RECIPE = "examples/arith/grpo.yaml", "examples/smollm2/grpo.yaml"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))


def shared_settings(recipe: str) -> dict:
    """The GRPO settings both sides use, read from the recipe with rlvr's own parser (its defaults
    for what the recipe leaves out)."""
    from rlvr.runtime.configure import parse_config

    c = parse_config(["--config", str(ROOT / recipe)])
    eps, eps_high = c.algo.clip_range()
    (_, test), *_ = c.eval.datasets()
    return {"prompts": c.rollout_batch_size, "samples": c.n_samples_per_prompt, "max_len": c.rollout_max_response_len,
            "temperature": c.rollout_temperature, "lr": c.lr, "kl_coef": c.kl_loss_coef if c.use_kl_loss else 0.0,
            "eps": eps, "eps_high": eps_high, "clip_grad": c.clip_grad, "beta2": c.adam_beta2,
            "chat": c.apply_chat_template, "model": str(c.hf_checkpoint), "data": str(c.prompt_data), "test": str(test),
            "recompute": c.recompute_activations}


def prepare(recipe: str) -> None:
    """Write a demo recipe's data (and the tiny demo's SFT bootstrap) when they are missing."""
    if recipe == SMOLLM2_RECIPE:
        from rlvr.entrypoints.demo_smollm2 import prepare_assets
    else:
        from rlvr.entrypoints.demo import prepare_assets
    prepare_assets()


class WallMarks:
    """Keeps the policy as it was at each wall-time mark: after every step, a mark that the step
    ended past gets the state after the previous step. Its own time is not counted."""

    def __init__(self, budget: float, every: float):
        self.marks = [min(every * k, budget) for k in range(1, int(-(-budget // every)) + 1)]
        self.kept: list[dict] = []  # {"mark", "t", "cpu", "state"}
        self.t0 = self.cpu0 = None
        self.paused = 0.0

    def start(self, model) -> None:
        self.prev = {"t": 0.0, "cpu": 0.0, "state": self._copy(model)}
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()

    def after_step(self, model) -> bool:
        """Note a step's end; True when the budget is spent (stop training)."""
        now, cpu = time.perf_counter(), time.process_time()
        t = now - self.t0 - self.paused
        while len(self.kept) < len(self.marks) and t > self.marks[len(self.kept)]:
            self.kept.append({"mark": self.marks[len(self.kept)], **self.prev})
        self.prev = {"t": t, "cpu": cpu - self.cpu0, "state": self._copy(model)}
        self.paused += time.perf_counter() - now
        return len(self.kept) == len(self.marks)

    @staticmethod
    def _copy(model) -> dict:
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    def save(self, model, tokenizer, out: Path, steps: int) -> None:
        for i, k in enumerate(self.kept):
            model.load_state_dict(k["state"])
            model.save_pretrained(out / f"mark_{i:02d}")
            tokenizer.save_pretrained(out / f"mark_{i:02d}")
        rows = [{"mark": k["mark"], "t": k["t"], "cpu": k["cpu"], "dir": f"mark_{i:02d}"} for i, k in enumerate(self.kept)]
        (out / "marks.json").write_text(json.dumps({"steps": steps, "marks": rows}))


class BudgetSpent(Exception):
    pass


def run_rlvr(s: dict, model: Path, data: Path, out: Path, budget: float, every: float, seed: int) -> None:
    """rlvr's real loop (``rlvr.runtime.loop.run``), stopped once the budget is spent."""
    from rlvr.runtime.configure import parse_config
    from rlvr.runtime.loop import Step, run

    marks, steps = WallMarks(budget, every), [0]
    cfg = parse_config([
        "--hf-checkpoint", str(model), "--prompt-data", str(data), "--rm-type", "math",
        "--rollout-batch-size", str(s["prompts"]), "--n-samples-per-prompt", str(s["samples"]),
        "--rollout-max-response-len", str(s["max_len"]), "--rollout-temperature", str(s["temperature"]),
        "--lr", str(s["lr"]), "--lr-decay-style", "constant", "--adam-beta2", str(s["beta2"]),
        "--clip-grad", str(s["clip_grad"]), "--eps-clip", str(s["eps"]), "--eps-clip-high", str(s["eps_high"]),
        *(["--use-kl-loss", "--kl-loss-coef", str(s["kl_coef"]), "--kl-loss-type", "low_var_kl"] if s["kl_coef"] else []),
        "--advantage-estimator", "grpo", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096",
        "--num-rollout", "1000000", "--seed", str(seed), "--rollout-seed", str(seed), "--output-dir", str(out / "run"),
        *(["--apply-chat-template"] if s["chat"] else []),
        *(["--recompute-activations"] if s["recompute"] else [])])
    rollout = Step.rollout

    def timed(self, rollout_id):
        if marks.t0 is None:
            marks.start(self.c.trainer.model)
        result = rollout(self, rollout_id)
        steps[0] += 1
        if marks.after_step(self.c.trainer.model):
            marks.save(self.c.trainer.model, self.c.tokenizer, out, steps[0])
            raise BudgetSpent
        return result

    Step.rollout = timed
    try:
        run(cfg, console=False)
    except BudgetSpent:
        pass


def run_trl(s: dict, model: Path, data: Path, out: Path, budget: float, every: float, seed: int) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.core.jsonl import iter_objects
    from rlvr.rewards import score

    marks = WallMarks(budget, every)
    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}] if s["chat"] else r["prompt"], "label": str(r["label"])}
            for _, r in iter_objects(data)]

    def math_reward(prompts, completions, label, **kwargs):  # conversational completions: [{"role", "content"}]
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [score("math", c, y) for c, y in zip(texts, label)]

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            marks.start(model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if marks.after_step(model):
                control.should_training_stop = True

    tokenizer = AutoTokenizer.from_pretrained(model)
    args = GRPOConfig(
        output_dir=str(out / "run"), per_device_train_batch_size=s["prompts"] * s["samples"],
        num_generations=s["samples"], max_completion_length=s["max_len"], temperature=s["temperature"], top_p=1.0,
        top_k=0, learning_rate=s["lr"], lr_scheduler_type="constant", adam_beta2=s["beta2"],
        max_grad_norm=s["clip_grad"] or 1e9, beta=s["kl_coef"], epsilon=s["eps"], epsilon_high=s["eps_high"],
        loss_type="grpo", scale_rewards="group", num_iterations=1, gradient_accumulation_steps=1,
        max_steps=1_000_000, logging_steps=50, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
        seed=seed, dataloader_num_workers=0, gradient_checkpointing=s["recompute"])
    policy = AutoModelForCausalLM.from_pretrained(model)
    trainer = GRPOTrainer(model=policy, reward_funcs=math_reward, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[Clock()])
    trainer.train()
    marks.save(trainer.model, tokenizer, out, trainer.state.global_step)


def evaluate(checkpoint: Path, test: Path, train: Path, max_len: int, chat: bool) -> float:
    """The one shared evaluator: rlvr's ``run_eval``, greedy, on the held-out test split."""
    from rlvr.runtime.configure import parse_config
    from rlvr.entrypoints.evaluate import run_eval

    cfg = parse_config(["--hf-checkpoint", str(checkpoint), "--prompt-data", str(train), "--rm-type", "math",
                        "--eval-prompt-data", "test", str(test), "--rollout-max-response-len", str(max_len),
                        *(["--apply-chat-template"] if chat else [])], rl=False)
    return run_eval(cfg)["eval/test/score"]


def plot(curves: dict[str, list[tuple[float, float]]], out: Path, title: str) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, pts in curves.items():
        ax.plot([t for t, _ in pts], [a for _, a in pts], marker="o", label=name)
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def run_side(name: str, args, root: Path, env: dict) -> dict:
    cmd = [sys.executable, __file__, "--side", name, "--recipe", args.recipe, "--model", str(args.model),
           "--data", str(args.data), "--out", str(root / name), "--budget", str(args.budget),
           "--mark-every", str(args.mark_every), "--seed", str(args.seed), "--threads", str(args.threads),
           *(["--recompute-activations"] if args.recompute_activations else [])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode or not (root / name / "marks.json").is_file():
        sys.exit(f"{name} failed:\n{proc.stderr[-4000:]}")
    print(f"{name}: trained for the budget in a process of {time.perf_counter() - t0:.0f} s", flush=True)
    return json.loads((root / name / "marks.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=240, help="training wall seconds per side")
    ap.add_argument("--mark-every", type=float, default=30, help="seconds between kept checkpoints")
    ap.add_argument("--recipe", default=ARITH_RECIPE, help=f"the GRPO recipe both sides follow ({ARITH_RECIPE} or "
                    f"{SMOLLM2_RECIPE}); its checkpoint, training and held-out data unless given below")
    ap.add_argument("--model", default=None, help="the checkpoint both start from (default: the recipe's)")
    ap.add_argument("--data", default=None, help="training prompts (default: the recipe's)")
    ap.add_argument("--test", default=None, help="held-out prompts (default: the recipe's first eval set)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--recompute-activations", action="store_true",
                    help="both sides recompute activations in backward (default: the recipe's choice, on both sides)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--png", default=None, help="the plot (default: docs/learning_vs_trl.png, "
                    "docs/learning_vs_trl_smollm2.png for the SmolLM2 recipe)")
    ap.add_argument("--side", choices=["rlvr", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from common import set_threads

    set_threads(args.threads)
    os.chdir(ROOT)  # the recipes' paths are relative to the repository
    if not args.side:
        prepare(args.recipe)
    s = shared_settings(args.recipe)
    s["recompute"] = s["recompute"] or args.recompute_activations
    args.png = args.png or str(ROOT / ("docs/learning_vs_trl_smollm2.png" if args.recipe == SMOLLM2_RECIPE
                                       else "docs/learning_vs_trl.png"))
    args.model, args.data, args.test = (Path(getattr(args, k) or s[k]).resolve() for k in ("model", "data", "test"))
    if not (args.model / "config.json").is_file():
        sys.exit(f"--model: {args.model} has no config.json (the SmolLM2 recipe needs `make smollm2` first)")
    if args.side:
        fn = run_rlvr if args.side == "rlvr" else run_trl
        return fn(s, args.model, args.data, Path(args.out), args.budget, args.mark_every, args.seed)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="rlvr-learning-"))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    sides = {name: run_side(name, args, root, env) for name in ("rlvr", "trl")}
    report(args, s, root, sides)


def report(args, s: dict, root: Path, sides: dict) -> None:
    max_len, chat = s["max_len"], s["chat"]
    start = evaluate(args.model, args.test, args.data, max_len, chat)
    curves = {name: [(0.0, start)] + [(m["t"], evaluate(root / name / m["dir"], args.test, args.data, max_len, chat))
                                      for m in side["marks"]] for name, side in sides.items()}
    print(f"\nheld-out accuracy (greedy, {sum(1 for _ in open(args.test))} test problems) at each wall-time mark; "
          f"start {start:.3f}")
    print("| mark (s) | rlvr: time of kept policy (s) | rlvr acc | TRL: time of kept policy (s) | TRL acc |")
    print("| --- | --- | --- | --- | --- |")
    for i, m in enumerate(sides["rlvr"]["marks"]):
        r, t = curves["rlvr"][i + 1], curves["trl"][i + 1]
        print(f"| {m['mark']:.0f} | {r[0]:.1f} | {r[1]:.3f} | {t[0]:.1f} | {t[1]:.3f} |")
    print(f"steps in the budget: rlvr {sides['rlvr']['steps']}, TRL {sides['trl']['steps']}")
    rlvr_acc, trl_acc = curves["rlvr"][-1][1], curves["trl"][-1][1]
    reach = next((t for t, a in curves["rlvr"] if a >= trl_acc), None)
    png = plot({f"rlvr ({sides['rlvr']['steps']} steps)": curves["rlvr"],
                f"TRL GRPOTrainer ({sides['trl']['steps']} steps)": curves["trl"]}, Path(args.png),
               f"GRPO from {args.model.name}, {args.budget:.0f} s per side, {args.threads} thread(s)")
    print(f"plot: {png}")
    print(json.dumps({"bench": "learning_vs_trl", "recipe": args.recipe, "budget_s": args.budget, "start_acc": start,
                      "recompute_activations": s["recompute"], "seed": args.seed,
                      "rlvr_acc": rlvr_acc, "trl_acc": trl_acc,
                      "rlvr_time_to_trl_final_s": None if reach is None else round(reach, 1),
                      "rlvr_steps": sides["rlvr"]["steps"], "trl_steps": sides["trl"]["steps"]}))


if __name__ == "__main__":
    main()
