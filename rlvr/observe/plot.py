"""A PNG dashboard of one or more runs, read from their ``metrics.jsonl``.

``plot_runs(run_dirs, out)`` draws six panels (reward, eval score, KL, entropy, response
length, time split), then one per task for runs whose samples name a ``task`` (``task_panels``),
one colour per run (legend = the run directory's name), one line style per metric within a
panel. Each metric is plotted against the step key of the records it was logged in
(``rollout/step``, ``train/step`` or ``eval/step``). A panel without data says "no data". The
PNG's ``Description`` text chunk lists each panel and the series drawn in it (``reward: run_a,
run_b | eval score: ...``). It uses matplotlib's Agg canvas directly (no pyplot), so it needs no
display and leaves matplotlib's global backend alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlvr.observe.metrics import METRICS_FILE, STEP_KEYS, eval_score_name, read_metrics

# (title, metric keys); "eval/*" stands for every eval score key (see metrics.eval_scores).
PANELS: list[tuple[str, list[str]]] = [
    ("reward", ["rollout/raw_reward"]),
    ("eval score", ["eval/*"]),
    ("KL", ["train/kl_loss", "train/ppo_kl"]),
    ("entropy", ["train/entropy_loss"]),
    ("response length (mean)", ["rollout/response_len/mean"]),
    ("time split (s)", ["perf/rollout_time", "perf/train_time", "perf/update_weights_time", "perf/eval_time"]),
]
_STYLES = ["-", "--", ":", "-."]


def _series(records: list[dict[str, Any]], key: str) -> tuple[str, list[float], list[float]]:
    """(step key, xs, ys) of ``key``; ``key == "eval/*"`` is expanded by the caller."""
    step_key, xs, ys = "step", [], []
    for r in records:
        if r.get(key) is None:
            continue
        sk = next((k for k in STEP_KEYS if k in r), None)
        if sk is None:
            continue
        step_key = sk
        xs.append(r[sk])
        ys.append(r[key])
    return step_key, xs, ys


def _run_names(run_dirs: list[Path]) -> list[str]:
    names = [d.name for d in run_dirs]
    if len(set(names)) < len(names):  # two runs called "run": add the parent folder
        names = [f"{d.parent.name}/{d.name}" for d in run_dirs]
    return names


def task_panels(runs: list[list[dict[str, Any]]]) -> list[tuple[str, list[str]]]:
    """One panel per task that the records name (``rollout/raw_reward/<task>``, from samples'
    ``task`` metadata): its training reward, every eval set's score on it (``eval/<set>/<task>``)
    and its curriculum level (``rollout/curriculum/<task>/level``, on the right-hand axis)."""
    keys = {k for run in runs for r in run for k in r}
    tasks = sorted({k.split("/", 2)[2] for k in keys if k.startswith("rollout/raw_reward/")})
    panels = []
    for task in tasks:
        evals = sorted(k for k in keys if k.startswith("eval/") and k.count("/") == 2 and k.endswith(f"/{task}"))
        panels.append((f"task {task}", [f"rollout/raw_reward/{task}", *evals, f"rollout/curriculum/{task}/level"]))
    return panels


def _draw_panel(ax, title: str, keys: list[str], runs, names, colors) -> str:
    """Draw ``keys`` of every run on ``ax``; curriculum levels go on a right-hand axis. Returns the
    panel's entry of the PNG's description."""
    from matplotlib.ticker import MaxNLocator

    if keys == ["eval/*"]:
        keys = sorted({k for run in runs for r in run for k in r if eval_score_name(k)})
        # slime's eval/<name> duplicates eval/<name>/score: draw one line per dataset.
        keys = [k for k in keys if not (k.count("/") == 1 and f"{k}/score" in keys)]
    drawn, x_label, labels, right = 0, set(), [], None
    for records, name, color in zip(runs, names, colors):
        for i, key in enumerate(keys):
            step_key, xs, ys = _series(records, key)
            if not xs:
                continue
            label = name if len(keys) == 1 else f"{name}: {key}"
            target = ax
            if "/curriculum/" in key:  # levels are small integers, rewards are in [0, 1]
                right = right or ax.twinx()
                right.set_ylabel("curriculum level")
                target = right
            target.plot(xs, ys, _STYLES[i % len(_STYLES)], color=color, label=label, marker=".")
            drawn += 1
            labels.append(label)
            x_label.add(step_key)
    ax.set_title(title)
    if drawn:
        ax.set_xlabel(" / ".join(sorted(x_label)))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.grid(alpha=0.3)
        handles = [h for a in (ax, right) if a is not None for h in a.get_legend_handles_labels()[0]]
        ax.legend(handles=handles, fontsize="small")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_xticks([])
        ax.set_yticks([])
    return f"{title}: {', '.join(labels) if labels else 'no data'}"


def plot_runs(run_dirs: list[str | Path], out: str | Path | None = None) -> Path:
    """Write the dashboard PNG and return its path (default: ``run_dirs[0]/curves.png``): the six
    panels of ``PANELS``, then one per task (``task_panels``)."""
    # Imported here: matplotlib takes ~0.7 s to import and only plotting needs it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not run_dirs:
        raise ValueError("plot_runs needs at least one run directory")
    dirs = [Path(d) for d in run_dirs]
    for d in dirs:
        if not (d / METRICS_FILE).is_file():
            raise FileNotFoundError(f"{d}: no {METRICS_FILE} here; is this a run directory?")
    runs = [read_metrics(d) for d in dirs]
    names = _run_names(dirs)
    panels = PANELS + task_panels(runs)
    rows = -(-len(panels) // 3)
    fig = Figure(figsize=(16, 4.5 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, 3).flat)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    # "title: label, label" per panel, stored in the PNG's metadata
    contents = [_draw_panel(ax, title, keys, runs, names, colors) for ax, (title, keys) in zip(axes, panels)]
    for ax in axes[len(panels):]:  # the last row's unused places
        ax.set_axis_off()

    out = Path(out) if out is not None else dirs[0] / "curves.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    # The panel list goes into the PNG's text chunk, so a reader (or a test) can tell what is drawn.
    fig.savefig(out, dpi=100, metadata={"Title": "rlvr dashboard", "Description": " | ".join(contents)})
    return out
