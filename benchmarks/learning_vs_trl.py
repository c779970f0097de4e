"""Learning per wall-clock second: rlvr vs TRL's GRPOTrainer from the same bootstrap checkpoint.

Both sides start from the same checkpoint on the same training prompts and reward (rlvr's ``math``
reward; TRL calls it through ``rlvr.rewards.score``), with the same GRPO settings, all read from one
recipe (``--recipe``, parsed by rlvr's own config): by default the tiny-model demo's
``examples/arith/grpo.yaml`` (its SFT bootstrap, the arithmetic prompts); with
``--recipe examples/smollm2/grpo.yaml`` the real-model demo's (SmolLM2-135M-Instruct from
``make smollm2``, chat prompts rendered with the model's template on both sides: rlvr
``--apply-chat-template``, TRL conversational prompts); with ``--recipe examples/reasoning_gym/grpo.yaml``
the reasoning-gym recipe's (its four-family mix drawn as rlvr's stream draws it, graded on both
sides by rlvr's ``reasoning_gym`` reward with the sample's task metadata, a reply cut at the
length limit without EOS read as truncated on both sides, and scored per family on the
held-out test split of docs/tasks.md, 192 questions). The shared settings:
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

Both sides take the training prompts in the file's order (no shuffling: rlvr
``--no-rollout-shuffle``, TRL ``shuffle_dataset=False``), so a step sees the same prompts on both;
the seed changes the sampling only. ``--seeds`` runs several seeds and reports each mark's mean and
spread (min-max) per side, against wall time and against optimizer steps; ``--concurrent`` runs the
two sides of a seed at the same time (one process each, ``--threads`` each), so a shared machine
loads both alike.

Each side runs in its own process with the same thread count for ``--budget`` seconds of wall
time, counted from its first training step (model load and set-up excluded on both sides), and
keeps the policy after the last step that ended at or before each mark (every ``--mark-every``
seconds); the time spent keeping those copies is not counted. After all training, one evaluator
(rlvr's ``run_eval``: greedy, the recipe's held-out test split, 500 problems in the tiny recipe and
200 in SmolLM2's; ``--eval-workers`` processes) scores every kept checkpoint of both sides. It
prints a table (and one per family for reasoning-gym), writes ``docs/learning_vs_trl.png``
(``_smollm2``, ``_reasoning_gym``; ``_seeds`` with ``--seeds``) and ends with one JSON line.

    pip install -e ".[bench]"    # TRL, accelerate, datasets: benchmark-only
    python benchmarks/learning_vs_trl.py [--budget 240] [--mark-every 30]
    python benchmarks/learning_vs_trl.py --recipe examples/smollm2/grpo.yaml --budget 300 --mark-every 60 --threads 2
    python benchmarks/learning_vs_trl.py --seeds 1 2 3 4 5 --concurrent    # five seeds per side
    python benchmarks/learning_vs_trl.py --recipe examples/reasoning_gym/grpo.yaml --budget 300 --mark-every 75 \
        --seeds 1 2 3 4 5 --concurrent --eval-workers 2
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
RG_RECIPE = "examples/reasoning_gym/grpo.yaml"
# the held-out split docs/tasks.md reports (the recipe's own eval set is its validation split)
HELD_OUT = {RG_RECIPE: "reasoning_gym:examples/reasoning_gym/mix.yaml?split=test&size=192"}
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))


def shared_settings(recipe: str) -> dict:
    """The GRPO settings both sides use, read from the recipe with rlvr's own parser (its defaults
    for what the recipe leaves out)."""
    from rlvr.runtime.configure import parse_config

    c = parse_config(["--config", str(ROOT / recipe)])
    eps, eps_high = c.algo.clip_range()
    (_, test), *_ = c.eval.datasets()
    r, a, t = c.rollout, c.algo, c.train
    return {"prompts": r.rollout_batch_size, "samples": r.n_samples_per_prompt, "max_len": r.rollout_max_response_len,
            "temperature": r.rollout_temperature, "lr": t.lr, "kl_coef": a.kl_loss_coef if a.use_kl_loss else 0.0,
            "eps": eps, "eps_high": eps_high, "clip_grad": t.clip_grad, "beta2": t.adam_beta2,
            "chat": c.data.apply_chat_template, "model": str(t.hf_checkpoint), "data": str(c.data.prompt_data),
            "test": str(test), "recompute": t.recompute_activations, "rm_type": c.reward.rm_type}


def is_spec(data) -> bool:
    from rlvr.data.reasoning_gym import is_spec as spec

    return spec(str(data))


def prepare(recipe: str) -> None:
    """Write a demo recipe's data (and the tiny demo's SFT bootstrap) when they are missing."""
    if recipe == RG_RECIPE:
        return  # generated by reasoning-gym; the model comes from `make smollm2`
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
        self.prev = {"t": 0.0, "cpu": 0.0, "step": 0, "state": self._copy(model)}
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()

    def after_step(self, model) -> bool:
        """Note a step's end; True when the budget is spent (stop training)."""
        now, cpu = time.perf_counter(), time.process_time()
        t = now - self.t0 - self.paused
        while len(self.kept) < len(self.marks) and t > self.marks[len(self.kept)]:
            self.kept.append({"mark": self.marks[len(self.kept)], **self.prev})
        self.prev = {"t": t, "cpu": cpu - self.cpu0, "step": self.prev["step"] + 1, "state": self._copy(model)}
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
        rows = [{"mark": k["mark"], "t": k["t"], "cpu": k["cpu"], "step": k["step"], "dir": f"mark_{i:02d}"}
                for i, k in enumerate(self.kept)]
        (out / "marks.json").write_text(json.dumps({"steps": steps, "marks": rows}))


class BudgetSpent(Exception):
    pass


def run_rlvr(s: dict, model: Path, data: Path, out: Path, budget: float, every: float, seed: int) -> None:
    """rlvr's real loop (``rlvr.runtime.loop.run``), stopped once the budget is spent."""
    from rlvr.runtime.configure import parse_config
    from rlvr.runtime.loop import Step, run

    marks, steps = WallMarks(budget, every), [0]
    cfg = parse_config([
        "--hf-checkpoint", str(model), "--prompt-data", str(data), "--rm-type", s["rm_type"],
        "--rollout-batch-size", str(s["prompts"]), "--n-samples-per-prompt", str(s["samples"]),
        "--rollout-max-response-len", str(s["max_len"]), "--rollout-temperature", str(s["temperature"]),
        "--lr", str(s["lr"]), "--lr-decay-style", "constant", "--adam-beta2", str(s["beta2"]),
        "--clip-grad", str(s["clip_grad"]), "--eps-clip", str(s["eps"]), "--eps-clip-high", str(s["eps_high"]),
        *(["--use-kl-loss", "--kl-loss-coef", str(s["kl_coef"]), "--kl-loss-type", "low_var_kl"] if s["kl_coef"] else []),
        "--advantage-estimator", "grpo", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096",
        "--num-rollout", "1000000", "--seed", str(seed), "--rollout-seed", str(seed), "--output-dir", str(out / "run"),
        "--no-rollout-shuffle",
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


def training_rows(s: dict, data, rows_needed: int) -> list[dict]:
    """The training prompts in rlvr's order: a JSONL file's rows, or the first draws of a
    reasoning-gym stream (``TaskStream``, the data source rlvr's side reads), each with its label and
    the metadata the reward reads (as JSON: the tasks' configs do not share one Arrow schema)."""
    from rlvr.core.jsonl import iter_objects

    chat = lambda p: ([{"role": "user", "content": p}] if isinstance(p, str) else p) if s["chat"] else p  # noqa: E731
    if not is_spec(data):
        return [{"prompt": chat(r["prompt"]), "label": str(r["label"]), "meta": "{}"} for _, r in iter_objects(data)]
    from rlvr.data.reasoning_gym import TaskStream, parse_spec

    return [{"prompt": chat(r.prompt), "label": str(r.label), "meta": json.dumps(r.metadata)}
            for r in TaskStream(parse_spec(str(data))).next_prompts(rows_needed)]


def run_trl(s: dict, model: Path, data, out: Path, budget: float, every: float, seed: int) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.core.types import Sample, Status
    from rlvr.rewards import score
    from rlvr.rewards.reasoning_gym import reasoning_gym_reward

    marks = WallMarks(budget, every)
    tokenizer = AutoTokenizer.from_pretrained(model)
    # more steps than either side reaches in the budget (rlvr's best is under 2 s a step here)
    rows = training_rows(s, data, s["prompts"] * int(budget))

    def reward(prompts, completions, label, meta, completion_ids, **kwargs):
        """rlvr's reward on each completion. For reasoning-gym, a reply cut at the length limit
        without EOS is TRUNCATED, as on rlvr's side (no answer is read from its last sentence)."""
        out = []
        for c, y, m, ids in zip(completions, label, meta, completion_ids):
            text = c[0]["content"] if isinstance(c, list) else c
            if s["rm_type"] != "reasoning_gym":
                out.append(score(s["rm_type"], text, y))
                continue
            cut = len(ids) >= s["max_len"] and ids[-1] != tokenizer.eos_token_id
            out.append(reasoning_gym_reward(Sample("", [], label=y, metadata=json.loads(m), response=text,
                                                   status=Status.TRUNCATED if cut else Status.COMPLETED)))
        return out

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            marks.start(model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if marks.after_step(model):
                control.should_training_stop = True

    # One generation of the whole batch per optimizer step (TRL's steps_per_generation defaults to the
    # accumulation steps), trained in micro-batches of <= 16 sequences: the whole 64 at once holds
    # ~16 GB of logits and activations on the reasoning-gym recipe's prompts (out of memory here).
    batch = s["prompts"] * s["samples"]
    micro = next(m for m in range(min(batch, 16), 0, -1) if batch % m == 0)
    args = GRPOConfig(
        output_dir=str(out / "run"), per_device_train_batch_size=micro,
        num_generations=s["samples"], max_completion_length=s["max_len"], temperature=s["temperature"], top_p=1.0,
        top_k=0, learning_rate=s["lr"], lr_scheduler_type="constant", adam_beta2=s["beta2"],
        max_grad_norm=s["clip_grad"] or 1e9, beta=s["kl_coef"], epsilon=s["eps"], epsilon_high=s["eps_high"],
        loss_type="grpo", scale_rewards="group", num_iterations=1, gradient_accumulation_steps=batch // micro,
        max_steps=1_000_000, logging_steps=50, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
        seed=seed, dataloader_num_workers=0, gradient_checkpointing=s["recompute"], shuffle_dataset=False)
    policy = AutoModelForCausalLM.from_pretrained(model)
    trainer = GRPOTrainer(model=policy, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[Clock()])
    trainer.train()
    marks.save(trainer.model, tokenizer, out, trainer.state.global_step)


def evaluate(checkpoint: Path, test, train, s: dict) -> dict:
    """The one shared evaluator: rlvr's ``run_eval``, greedy, on the held-out test split.
    ``acc``: the score over the whole set (full marks, for reasoning-gym); ``tasks``: per family."""
    from rlvr.runtime.configure import parse_config
    from rlvr.entrypoints.evaluate import run_eval

    cfg = parse_config(["--hf-checkpoint", str(checkpoint), "--prompt-data", str(train), "--rm-type", s["rm_type"],
                        "--eval-prompt-data", "test", str(test), "--rollout-max-response-len", str(s["max_len"]),
                        *(["--apply-chat-template"] if s["chat"] else [])], rl=False)
    m = run_eval(cfg)
    tasks = {k.rsplit("/", 1)[1]: v for k, v in sorted(m.items()) if k.startswith("eval/test/accuracy/")}
    return {"acc": m.get("eval/test/accuracy", m["eval/test/score"]), "tasks": tasks}


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


def side_command(name: str, args, root: Path, seed: int) -> list[str]:
    return [sys.executable, __file__, "--side", name, "--recipe", args.recipe, "--model", str(args.model),
            "--data", str(args.data), "--out", str(root / name), "--budget", str(args.budget),
            "--mark-every", str(args.mark_every), "--seed", str(seed), "--threads", str(args.threads),
            *(["--recompute-activations"] if args.recompute_activations else [])]


def run_sides(args, root: Path, env: dict, seed: int) -> dict:
    """Both sides of one seed, one after the other or (``--concurrent``) at the same time."""
    t0 = time.perf_counter()
    names = ("rlvr", "trl")
    if args.concurrent:
        procs = {n: subprocess.Popen(side_command(n, args, root, seed), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env) for n in names}
        outcomes = {n: (p, p.communicate()[1]) for n, p in procs.items()}
    else:
        outcomes = {}
        for n in names:
            p = subprocess.run(side_command(n, args, root, seed), capture_output=True, text=True, env=env)
            outcomes[n] = (p, p.stderr)
    sides = {}
    for n, (p, err) in outcomes.items():
        if p.returncode or not (root / n / "marks.json").is_file():
            sys.exit(f"{n} (seed {seed}) failed:\n{err[-4000:]}")
        sides[n] = json.loads((root / n / "marks.json").read_text())
    print(f"seed {seed}: both sides trained for the budget in {time.perf_counter() - t0:.0f} s", flush=True)
    return sides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=240, help="training wall seconds per side")
    ap.add_argument("--mark-every", type=float, default=30, help="seconds between kept checkpoints")
    ap.add_argument("--recipe", default=ARITH_RECIPE, help=f"the GRPO recipe both sides follow ({ARITH_RECIPE} or "
                    f"{SMOLLM2_RECIPE}); its checkpoint, training and held-out data unless given below")
    ap.add_argument("--model", default=None, help="the checkpoint both start from (default: the recipe's)")
    ap.add_argument("--data", default=None, help="training prompts (default: the recipe's)")
    ap.add_argument("--test", default=None, help="held-out prompts (default: the recipe's first eval set; "
                    "for the reasoning-gym recipe, its mix's test split)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seeds", type=int, nargs="+", help="several seeds (instead of --seed): each mark's mean and "
                    "spread per side")
    ap.add_argument("--concurrent", action="store_true", help="run a seed's two sides at the same time")
    ap.add_argument("--eval-workers", type=int, default=1, help="processes evaluating the kept policies after "
                    "all training (each with --threads threads)")
    ap.add_argument("--recompute-activations", action="store_true",
                    help="both sides recompute activations in backward (default: the recipe's choice, on both sides)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--png", default=None, help="the plot (default: docs/learning_vs_trl.png, "
                    "docs/learning_vs_trl_smollm2.png for the SmolLM2 recipe; *_seeds.png with --seeds)")
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
    stem = {SMOLLM2_RECIPE: "docs/learning_vs_trl_smollm2", RG_RECIPE: "docs/learning_vs_trl_reasoning_gym"}.get(
        args.recipe, "docs/learning_vs_trl")
    args.png = args.png or str(ROOT / (stem + ("_seeds.png" if args.seeds else ".png")))
    s["test"] = HELD_OUT.get(args.recipe, s["test"])
    args.model, args.data, args.test = (getattr(args, k) or s[k] for k in ("model", "data", "test"))
    args.model = Path(args.model).resolve()
    args.data, args.test = (x if is_spec(x) else Path(x).resolve() for x in (args.data, args.test))
    if not (args.model / "config.json").is_file():
        sys.exit(f"--model: {args.model} has no config.json (the SmolLM2 recipe needs `make smollm2` first)")
    if args.side:
        fn = run_rlvr if args.side == "rlvr" else run_trl
        return fn(s, args.model, args.data, Path(args.out), args.budget, args.mark_every, args.seed)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="rlvr-learning-"))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    seeds = args.seeds or [args.seed]
    trained = {seed: run_sides(args, root / f"seed{seed}", env, seed) for seed in seeds}
    kept = [args.model] + [root / f"seed{seed}" / name / m["dir"] for seed, sides in trained.items()
                           for name, side in sides.items() for m in side["marks"]]
    scores = dict(zip(kept, evaluate_all(args, s, kept)))
    start = scores[args.model]
    per_seed = {seed: report(args, s, root / f"seed{seed}", sides, scores, seed, plot_png=not args.seeds)
                for seed, sides in trained.items()}
    if args.seeds:
        report_seeds(args, start, per_seed)


def evaluate_all(args, s: dict, checkpoints: list[Path]) -> list[dict]:
    """``evaluate`` on every checkpoint, after all training, in ``--eval-workers`` processes of
    ``--threads`` threads each (evaluation is not timed)."""
    if args.eval_workers <= 1:
        return [evaluate(c, args.test, args.data, s) for c in checkpoints]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from itertools import repeat

    from common import set_threads

    with ProcessPoolExecutor(args.eval_workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=set_threads, initargs=(args.threads,)) as pool:
        return list(pool.map(evaluate, checkpoints, repeat(args.test), repeat(args.data), repeat(s)))


def report(args, s: dict, root: Path, sides: dict, scores: dict, seed: int, plot_png: bool) -> dict:
    """One seed: every kept policy's scores; a table, the plot (one seed), one JSON line."""
    start = scores[args.model]
    curves = {name: [{"t": 0.0, "step": 0, **start}] +
              [{"t": m["t"], "step": m["step"], **scores[root / name / m["dir"]]} for m in side["marks"]]
              for name, side in sides.items()}
    print(f"\nseed {seed}: held-out accuracy (greedy, {args.test}) at each wall-time mark; start {start['acc']:.3f}")
    print("| mark (s) | rlvr: time of kept policy (s) | step | rlvr acc | TRL: time of kept policy (s) | step | TRL acc |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for i, m in enumerate(sides["rlvr"]["marks"]):
        r, t = curves["rlvr"][i + 1], curves["trl"][i + 1]
        print(f"| {m['mark']:.0f} | {r['t']:.1f} | {r['step']} | {r['acc']:.3f} | {t['t']:.1f} | {t['step']} | {t['acc']:.3f} |")
    for task in start["tasks"]:
        print(f"{task}: rlvr " + " / ".join(f"{p['tasks'][task]:.3f}" for p in curves["rlvr"]) +
              "; TRL " + " / ".join(f"{p['tasks'][task]:.3f}" for p in curves["trl"]))
    print(f"steps in the budget: rlvr {sides['rlvr']['steps']}, TRL {sides['trl']['steps']}")
    rlvr_acc, trl_acc = curves["rlvr"][-1]["acc"], curves["trl"][-1]["acc"]
    reach = next((p["t"] for p in curves["rlvr"] if p["acc"] >= trl_acc), None)
    if plot_png:
        png = plot({f"rlvr ({sides['rlvr']['steps']} steps)": [(p["t"], p["acc"]) for p in curves["rlvr"]],
                    f"TRL GRPOTrainer ({sides['trl']['steps']} steps)": [(p["t"], p["acc"]) for p in curves["trl"]]},
                   Path(args.png), f"GRPO from {args.model.name}, {args.budget:.0f} s per side, {args.threads} thread(s)")
        print(f"plot: {png}")
    summary = {"bench": "learning_vs_trl", "recipe": args.recipe, "budget_s": args.budget, "start_acc": start["acc"],
               "recompute_activations": s["recompute"], "seed": seed, "concurrent": args.concurrent,
               "rlvr_acc": rlvr_acc, "trl_acc": trl_acc,
               "rlvr_time_to_trl_final_s": None if reach is None else round(reach, 1),
               "rlvr_steps": sides["rlvr"]["steps"], "trl_steps": sides["trl"]["steps"], "curves": curves}
    print(json.dumps(summary), flush=True)
    return summary


def spread(values: list[float]) -> dict:
    import statistics

    return {"mean": statistics.mean(values), "min": min(values), "max": max(values)}


def report_seeds(args, start: dict, per_seed: dict[int, dict]) -> None:
    """Across seeds: each mark's mean and min-max per side (overall and per family), by wall time and
    by steps; the plot."""
    n_marks = len(next(iter(per_seed.values()))["curves"]["rlvr"])
    table = {}
    for i in range(n_marks):
        row = {}
        for side in ("rlvr", "trl"):
            points = [r["curves"][side][i] for r in per_seed.values()]
            steps = spread([p["step"] for p in points])
            row[side] = {**spread([p["acc"] for p in points]), **{f"steps_{k}": v for k, v in steps.items()},
                         "tasks": {t: spread([p["tasks"][t] for p in points]) for t in start["tasks"]}}
        table[0 if i == 0 else i * args.mark_every] = row
    cell = lambda d: f"{d['mean']:.3f} [{d['min']:.3f}, {d['max']:.3f}]"  # noqa: E731
    steps = lambda d: f"{d['steps_mean']:.0f} [{d['steps_min']}, {d['steps_max']}]"  # noqa: E731
    print(f"\n{len(per_seed)} seeds ({', '.join(map(str, per_seed))}): held-out accuracy at each mark, mean [min, max]")
    print("| mark (s) | rlvr acc | rlvr steps | TRL acc | TRL steps |")
    print("| --- | --- | --- | --- | --- |")
    for mark, row in table.items():
        print(f"| {mark:.0f} | {cell(row['rlvr'])} | {steps(row['rlvr'])} | {cell(row['trl'])} | {steps(row['trl'])} |")
    if start["tasks"]:
        print("\nper family, rlvr | TRL, mean [min, max]")
        print("| mark (s) | " + " | ".join(start["tasks"]) + " |")
        print("| --- |" + " --- |" * len(start["tasks"]))
        for mark, row in table.items():
            print(f"| {mark:.0f} | " + " | ".join(f"{cell(row['rlvr']['tasks'][t])} \\| {cell(row['trl']['tasks'][t])}"
                                                 for t in start["tasks"]) + " |")
    png = plot_seeds(per_seed, table, Path(args.png), f"GRPO from {args.model.name}, {args.budget:.0f} s per side, "
                     f"{len(per_seed)} seeds, {args.threads} thread(s) each" + (", sides concurrent" if args.concurrent else ""))
    print(f"plot: {png}")
    print(json.dumps({"bench": "learning_vs_trl_seeds", "recipe": args.recipe, "budget_s": args.budget,
                      "seeds": list(per_seed), "start": start, "concurrent": args.concurrent, "marks": table}))


def plot_seeds(per_seed: dict[int, dict], table: dict, out: Path, title: str) -> Path:
    """Accuracy against wall time (mean, min-max band; then one such panel per family) and against
    optimizer steps (every seed's marks)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tasks = list(next(iter(table.values()))["rlvr"]["tasks"])
    n = 2 + len(tasks)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig = Figure(figsize=(5.5 * cols, 4.2 * rows))
    FigureCanvasAgg(fig)
    by_time, by_step = fig.add_subplot(rows, cols, 1), fig.add_subplot(rows, cols, 2)
    by_task = {t: fig.add_subplot(rows, cols, 3 + i) for i, t in enumerate(tasks)}
    marks = sorted(table)
    for side, label, color in (("rlvr", "rlvr", "C0"), ("trl", "TRL GRPOTrainer", "C1")):
        for ax, task in [(by_time, None), *((ax, t) for t, ax in by_task.items())]:
            cells = [table[m][side] if task is None else table[m][side]["tasks"][task] for m in marks]
            ax.plot(marks, [c["mean"] for c in cells], marker="o", color=color, label=f"{label} (mean)")
            ax.fill_between(marks, [c["min"] for c in cells], [c["max"] for c in cells], color=color, alpha=0.2)
        for k, run in enumerate(per_seed.values()):
            pts = run["curves"][side]
            by_step.plot([p["step"] for p in pts], [p["acc"] for p in pts], marker=".", color=color, alpha=0.6,
                         label=label if k == 0 else None)
    for t, ax in by_task.items():
        ax.set_title(t, fontsize=9)
    for ax in (by_time, *by_task.values()):
        ax.set_xlabel("training wall time (s)")
    by_step.set_xlabel("optimizer steps")
    by_step.set_xscale("symlog", linthresh=10)
    for ax in (by_time, by_step, *by_task.values()):
        ax.set_ylabel("held-out accuracy (greedy)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    main()
