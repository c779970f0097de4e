"""reasoning-gym's procedural task families as prompt data (``--prompt-data reasoning_gym:...``).

A spec names one task or a weighted mix, each with its own generator configuration, a split and
a size. It is written inline (``reasoning_gym:chain_sum,products=2?split=val&size=64``) or as a
YAML file (``reasoning_gym:mix.yaml?split=test``); docs/tasks.md has the grammar. Every record's
metadata carries ``task`` (the family's name: per-task metrics key on it), ``entry`` (the
generator's entry as JSON) and ``reasoning_gym`` (where the entry comes from: task, configuration,
curriculum level, generator seed, size and index), which the ``reasoning_gym`` reward uses to
rebuild the entry exactly and score a reply with that task's own ``score_answer``.

Train, validation and test are disjoint by construction, twice over: each split draws from
generators seeded differently (``generator_seed``), and each question belongs to exactly one split
by a hash of its text (``split_of``), so a question a held-out generator also happens to produce
is never trained on, whatever the sizes or curriculum levels.

Held-out splits (``val``, ``test``) are fixed lists of distinct questions (``held_out_records``).
The training split is an endless stream (``TaskStream``): draw ``p`` picks its task by weight with
a generator keyed by ``(seed, p)``; with a curriculum (reasoning-gym's own definitions, one global
level per task) the task's level rises when its rolling training accuracy reaches ``raise_at`` and
falls when it drops to ``lower_at``; levels, windows and counters are part of the data source's
checkpoint state, so ``--load`` restores them exactly.

reasoning-gym is an optional extra (``pip install rlvr[tasks]``), imported on first use.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
from collections import deque
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import yaml

from rlvr.core.errors import DataError
from rlvr.data.dataset import DataSource, PromptRecord

PREFIX = "reasoning_gym:"
SPLITS = ("train", "val", "test")
# split_of: hash buckets out of 16 per split (test 2, val 2, train 12).
_BUCKETS = {"test": range(0, 2), "val": range(2, 4), "train": range(4, 16)}
# The instruction the answer_tag prompt form adds as a system turn (the reward reads the tag).
TAG_INSTRUCTION = ("Think about the problem step by step, then give your final answer inside "
                   "<answer></answer> tags, for example <answer>42</answer>.")
# Tasks whose generators cannot score their own stored answer (score_answer(answer, entry) < 1),
# measured on reasoning-gym 0.1.25; tests/test_reasoning_gym.py re-measures every task.
UNSCORABLE = frozenset({"boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"})
# Tasks whose score_answer gives a wrong answer full marks: game_of_life_halting compares
# bool(answer) with bool(stored answer), and both are non-empty strings, so any non-empty reply
# scores 1. Measured on reasoning-gym 0.1.25 with "123456789" and the opposite True/False or Yes/No;
# tests/test_reasoning_gym.py re-measures every task.
FALSE_CREDIT = frozenset({"game_of_life_halting"})
# Tasks whose generated questions depend on Python's string hash seed (ransom_note and
# isomorphic_strings draw with rng.choice from list(a set of letters), whose order follows that
# seed), so one generator seed gives other questions in another process: found by generating
# every task's first 8 entries under PYTHONHASHSEED=1 and =2 (reasoning-gym 0.1.25; codeio only at
# curriculum level 0). tests/test_reasoning_gym.py checks each of them, and the recipe's families.
HASH_SEEDED = frozenset({"codeio", "isomorphic_strings", "knight_swap", "polynomial_multiplication", "ransom_note",
                         "word_ladder"})


def is_spec(text: str | None) -> bool:
    """Whether a ``--prompt-data`` / ``--eval-prompt-data`` value is a reasoning-gym spec."""
    return isinstance(text, str) and text.startswith(PREFIX)


def on_training_mix(spec: str, training: str | None) -> str:
    """An eval spec with no tasks (``reasoning_gym:?split=val&size=96``) names the training mix:
    ``training``'s tasks and query keys, its own keys over them; any other spec is returned as is.
    So a recipe's eval sets follow whatever mix ``--prompt-data`` gives it.

    >>> on_training_mix("reasoning_gym:?split=val&size=8", "reasoning_gym:chain_sum,products=2?seed=3")
    'reasoning_gym:chain_sum,products=2?seed=3&split=val&size=8'
    >>> on_training_mix("reasoning_gym:gcd?split=test", "reasoning_gym:chain_sum")
    'reasoning_gym:gcd?split=test'
    """
    if not is_spec(spec) or spec[len(PREFIX):].partition("?")[0].strip():
        return spec
    if not is_spec(training):
        raise DataError(spec, None, f"a spec without tasks takes them from --prompt-data, which is {training!r}, "
                                    "not a reasoning_gym: spec; name the tasks")
    body, _, query = training[len(PREFIX):].partition("?")
    keys = dict(parse_qsl(query, keep_blank_values=True)) | dict(
        parse_qsl(spec.partition("?")[2], keep_blank_values=True))
    return PREFIX + body + ("?" + urlencode(keys, safe=",/:") if keys else "")


def rg():
    """The ``reasoning_gym`` module, or one clear error naming the extra to install."""
    try:
        import reasoning_gym
    except ImportError:
        raise DataError(PREFIX, None, "needs the reasoning-gym package: pip install 'rlvr[tasks]' "
                                      "(or pip install 'reasoning-gym>=0.1.25')") from None
    return reasoning_gym


@dataclass
class TaskSpec:
    name: str
    weight: float = 1.0
    config: dict = field(default_factory=dict)  # generator fields (difficulty parameters)
    level: int | None = None  # a curriculum level's configuration (reasoning-gym's definition)


@dataclass
class CurriculumSpec:
    """Per-task levels moved by rolling training accuracy (over the last ``window`` samples)."""

    window: int = 64
    raise_at: float = 0.7
    lower_at: float | None = None  # None: levels never go down


@dataclass
class MixSpec:
    tasks: list[TaskSpec]
    split: str = "train"
    size: int = 1000  # held-out splits: questions in the set; train: generator size (a chunk)
    seed: int = 0
    prompt: str = "question"  # or "answer_tag": a system turn asks for <answer></answer>
    curriculum: CurriculumSpec | None = None
    text: str = ""  # the spec as written, for messages


# ---- parsing -----------------------------------------------------------------------------------
def parse_spec(text: str) -> MixSpec:
    """A spec (``reasoning_gym:TASKS_OR_FILE[?key=value&...]``) as a checked ``MixSpec``.

    >>> m = parse_spec("reasoning_gym:chain_sum,products=2?split=val&size=8")
    >>> [(t.name, t.weight) for t in m.tasks], m.split, m.size
    ([('chain_sum', 1.0), ('products', 2.0)], 'val', 8)
    """
    body, _, query = text[len(PREFIX):].partition("?")
    options: dict[str, Any] = {}
    if body.endswith((".yaml", ".yml")):
        path = Path(body)
        if not path.is_file():
            raise DataError(body, None, "reasoning_gym spec file not found")
        options = yaml.safe_load(path.read_text()) or {}
        if not isinstance(options, dict) or "tasks" not in options:
            raise DataError(body, None, "a reasoning_gym spec file is a mapping with a 'tasks' key")
    else:
        options["tasks"] = {}
        for item in filter(None, (p.strip() for p in body.split(","))):
            name, sep, weight = item.partition("=")
            options["tasks"][name] = {"weight": _number(text, f"weight of {name}", weight)} if sep else {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        options[key] = yaml.safe_load(value)  # numbers, booleans and strings as YAML reads them
    return _mix_of(text, options)


def _number(text: str, what: str, value: Any, kind=float):
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise DataError(text, None, f"{what} must be a number, got {value!r}") from None


def _mix_of(text: str, options: dict) -> MixSpec:
    known = {f.name for f in fields(MixSpec)} - {"text"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise DataError(text, None, f"unknown spec key(s) {unknown}; valid: {sorted(known)}")
    tasks = options.pop("tasks")
    if isinstance(tasks, list):  # a YAML list of names
        tasks = {name: {} for name in tasks}
    if not isinstance(tasks, dict) or not tasks:
        raise DataError(text, None, "name at least one task, e.g. reasoning_gym:chain_sum")
    specs = [_task_of(text, name, body or {}) for name, body in tasks.items()]
    curriculum = options.pop("curriculum", None)
    if curriculum is not None and not isinstance(curriculum, CurriculumSpec):
        curriculum = _curriculum_of(text, curriculum)
    mix = MixSpec(specs, curriculum=curriculum, text=text, **options)
    if mix.split not in SPLITS:
        raise DataError(text, None, f"split must be one of {list(SPLITS)}, got {mix.split!r}")
    if mix.prompt not in ("question", "answer_tag"):
        raise DataError(text, None, f"prompt must be 'question' or 'answer_tag', got {mix.prompt!r}")
    mix.size, mix.seed = _number(text, "size", mix.size, int), _number(text, "seed", mix.seed, int)
    if mix.size < 1:
        raise DataError(text, None, f"size must be >= 1, got {mix.size}")
    for t in specs:
        check_task(text, t, curriculum is not None and mix.split == "train")
    return mix


def _task_of(text: str, name: str, body: dict) -> TaskSpec:
    if not isinstance(body, dict):
        raise DataError(text, None, f"task {name}: expected a mapping (weight, config, level), got {body!r}")
    unknown = sorted(set(body) - {"weight", "config", "level"})
    if unknown:
        raise DataError(text, None, f"task {name}: unknown key(s) {unknown}; valid: ['config', 'level', 'weight']")
    weight = _number(text, f"task {name}: weight", body.get("weight", 1.0))
    if weight <= 0:
        raise DataError(text, None, f"task {name}: weight must be > 0, got {weight}")
    level = body.get("level")
    return TaskSpec(name, weight, dict(body.get("config") or {}),
                    None if level is None else _number(text, f"task {name}: level", level, int))


def _curriculum_of(text: str, body: Any) -> CurriculumSpec:
    if body is True:
        return CurriculumSpec()
    if not isinstance(body, dict):
        raise DataError(text, None, f"curriculum: expected true or a mapping (window, raise_at, lower_at), got {body!r}")
    try:
        c = CurriculumSpec(**body)
    except TypeError:
        raise DataError(text, None, f"curriculum: unknown key(s) in {sorted(body)}; valid: "
                                    "['lower_at', 'raise_at', 'window']") from None
    if c.window < 1 or not 0 < c.raise_at <= 1 or (c.lower_at is not None and not 0 <= c.lower_at < c.raise_at):
        raise DataError(text, None, f"curriculum: need window >= 1 and 0 <= lower_at < raise_at <= 1, got {body}")
    return c


def check_task(text: str, t: TaskSpec, curriculum: bool) -> None:
    """An unknown task, a task that cannot verify its own answers or credits wrong ones, a configuration field the task
    does not have (or that the curriculum sets), or a configuration its generator refuses: one
    ``DataError`` naming the task and the field."""
    rg()  # a missing package is one clear error, before anything imports from it
    from reasoning_gym.factory import CURRICULA, DATASETS

    if t.name not in DATASETS or t.name == "composite":
        near = sorted(n for n in DATASETS if n != "composite" and (t.name[:3] in n))[:8]
        raise DataError(text, None, f"unknown reasoning-gym task {t.name!r}" + (f"; similar: {near}" if near else "")
                        + f" ({len(DATASETS) - 1} tasks: python -c 'import reasoning_gym.factory as f; "
                          "print(sorted(f.DATASETS))')")
    if t.name in UNSCORABLE:
        raise DataError(text, None, f"task {t.name!r} cannot verify its own answers (its score_answer gives "
                                    "its stored answer < 1): it cannot be a reward")
    if t.name in FALSE_CREDIT:
        raise DataError(text, None, f"task {t.name!r} gives wrong answers full marks (its score_answer scores any "
                                    "non-empty answer 1): it cannot be a reward")
    if t.name in HASH_SEEDED and os.environ.get("PYTHONHASHSEED", "random") in ("", "random"):
        raise DataError(text, None, f"task {t.name}: its questions depend on Python's string hash seed, which differs "
                                    "from process to process, so the training stream, the held-out sets and the "
                                    "reward's rebuilt entries would not agree between runs or processes; run with "
                                    "PYTHONHASHSEED=0 (any fixed value) in the environment")
    config_fields = {f.name for f in fields(DATASETS[t.name][1])} - {"seed", "size"}
    for key in t.config:
        if key not in config_fields:
            raise DataError(text, None, f"task {t.name}: unknown config field {key!r}; valid: {sorted(config_fields)}")
    if (curriculum or t.level is not None) and t.name not in CURRICULA:
        raise DataError(text, None, f"task {t.name}: reasoning-gym defines no curriculum for it; drop 'level' "
                                    "(or the curriculum) for this task")
    if curriculum or t.level is not None:
        owned = curriculum_fields(t.name) & set(t.config)
        if owned:
            raise DataError(text, None, f"task {t.name}: config field(s) {sorted(owned)} are set by the curriculum "
                                        "level; drop them or drop 'level'/'curriculum'")
    levels = range(t.level or 0, max_level(t.name) + 1) if curriculum else [t.level]
    for level in levels:  # every level the curriculum can reach
        refusal = generation_refusal(t.name, t.config, level)
        if refusal is not None:
            at = f" at curriculum level {level}" if level is not None else ""
            culprit = refused_fields(t.name, t.config, level)
            named = f"config field(s) {culprit}" if culprit else f"config {t.config}"
            raise DataError(text, None, f"task {t.name}: the generator refuses {named}{at}: {refusal}")


# The entries drawn to check a configuration: some generators refuse one only while generating
# (simple_equations' ``operators`` without matching ``operators_weights`` fails inside
# ``random.choices``), and a draw can pass by chance, so several are drawn.
PROBE_DRAWS = 8


def generation_refusal(name: str, config: dict, level: int | None) -> str | None:
    """reasoning-gym's own message (``Type: text``) where building ``name``'s dataset from
    ``config`` at ``level`` or drawing its first ``PROBE_DRAWS`` entries fails, else None.

    Any exception counts: a generator's refusal is whatever its code raises."""
    try:
        dataset = task_dataset(name, json.dumps(config, sort_keys=True), level, 0, PROBE_DRAWS)
        for index in range(PROBE_DRAWS):
            dataset[index]
    except Exception as e:  # noqa: BLE001 - see the docstring
        return f"{type(e).__name__}: {e}"
    return None


def refused_fields(name: str, config: dict, level: int | None) -> list[str]:
    """The fields of ``config`` each of which, set back to its default alone, makes the generator
    accept the rest; none where no single field is to blame."""
    return [key for key in sorted(config)
            if generation_refusal(name, {k: v for k, v in config.items() if k != key}, level) is None]


def curriculum_fields(name: str) -> set[str]:
    """The configuration fields reasoning-gym's curriculum for ``name`` sets."""
    from reasoning_gym.coaching.attributes import RangeAttributeDefinition
    from reasoning_gym.factory import CURRICULA

    out = set()
    for a in CURRICULA[name]().attributes.values():
        out |= {a.lower_field_name, a.upper_field_name} if isinstance(a, RangeAttributeDefinition) else {a.field_name}
    return out


def max_level(name: str) -> int:
    """The highest global level of ``name``'s curriculum (its longest attribute's last level)."""
    from reasoning_gym.factory import CURRICULA

    return max(len(a.levels) for a in CURRICULA[name]().attributes.values()) - 1


# ---- generation ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def task_dataset(name: str, config_json: str, level: int | None, seed: int, size: int):
    """reasoning-gym's dataset for ``name``: the configuration ``config_json`` (a JSON object), at
    curriculum ``level`` when given (the curriculum sets its fields, the rest come from the
    configuration), with generator ``seed`` and ``size``. Cached: the reward rebuilds entries here."""
    config = json.loads(config_json)
    rg()
    from reasoning_gym.factory import CURRICULA, DATASETS

    dataset_cls, config_cls = DATASETS[name]
    if level is None:
        cfg = config_cls(**config, seed=seed, size=size)
    else:
        curriculum = CURRICULA[name]()
        curriculum.set_global_level(level)
        cfg = curriculum.generate_configuration({**config, "seed": seed, "size": size})
    if hasattr(cfg, "validate"):
        cfg.validate()
    return dataset_cls(cfg)


def generator_seed(base: int, split: str, task: str, level: int | None, chunk: int) -> int:
    """The generator seed of one chunk of a task's stream: different for every split (and level
    and chunk), the same in every process.

    >>> generator_seed(0, "train", "gcd", None, 0) != generator_seed(0, "test", "gcd", None, 0)
    True
    """
    digest = hashlib.sha256(f"{base}/{split}/{task}/{level}/{chunk}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def split_of(task: str, question: str) -> str:
    """The one split a question may appear in (a hash of the task and the text).

    >>> split_of("chain_sum", "2 + 2 =") in SPLITS
    True
    """
    bucket = hashlib.sha256(f"{task}\0{question}".encode()).digest()[0] % 16
    return next(s for s, r in _BUCKETS.items() if bucket in r)


def entry_at(locator: dict) -> dict:
    """The generator's entry a record's ``metadata["reasoning_gym"]`` points at, rebuilt exactly
    (entries do not survive JSON unchanged in every task: arc_agi's grids are tuples)."""
    ds = task_dataset(locator["task"], json.dumps(locator["config"], sort_keys=True), locator["level"],
                      locator["seed"], locator["size"])
    return ds[locator["index"]]


def _record(mix: MixSpec, t: TaskSpec, level: int | None, seed: int, index: int, entry: dict, position: int
            ) -> PromptRecord:
    question = entry["question"]
    prompt: str | list[dict] = question if mix.prompt == "question" else [
        {"role": "system", "content": TAG_INSTRUCTION}, {"role": "user", "content": question}]
    locator = {"task": t.name, "config": t.config, "level": level, "seed": seed, "size": mix.size, "index": index}
    metadata = {"task": t.name, "split": mix.split, "answer_format": "tag" if mix.prompt == "answer_tag" else "final",
                "reasoning_gym": locator, "entry": json.loads(json.dumps(entry, default=str))}
    return PromptRecord(position, prompt, entry["answer"], metadata)


def _counts(tasks: list[TaskSpec], size: int) -> list[int]:
    """``size`` split by weight, largest remainders first (exact proportions, sum = size)."""
    total = sum(t.weight for t in tasks)
    raw = [size * t.weight / total for t in tasks]
    counts = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: counts[i] - raw[i])[: size - sum(counts)]:
        counts[i] += 1
    return counts


def held_out_records(mix: MixSpec) -> list[PromptRecord]:
    """A fixed set of ``size`` distinct questions of ``mix.split``, split among the tasks by weight
    (tasks interleaved). A task whose question space at this configuration cannot fill its share
    with distinct questions of this split is a ``DataError`` naming it."""
    per_task = []
    for t, count in zip(mix.tasks, _counts(mix.tasks, mix.size)):
        per_task.append(_distinct(mix, t, count))
    out, position = [], 0
    for i in range(max(map(len, per_task))):
        for records in per_task:
            if i < len(records):
                out.append(PromptRecord(position, *[getattr(records[i], k) for k in ("prompt", "label", "metadata")]))
                position += 1
    return out


def _distinct(mix: MixSpec, t: TaskSpec, count: int) -> list[PromptRecord]:
    seen, out, tried = set(), [], 0
    config_json = json.dumps(t.config, sort_keys=True)
    while len(out) < count:
        chunk, index = divmod(tried, mix.size)
        seed = generator_seed(mix.seed, mix.split, t.name, t.level, chunk)
        entry = task_dataset(t.name, config_json, t.level, seed, mix.size)[index]
        tried += 1
        if entry["question"] not in seen and split_of(t.name, entry["question"]) == mix.split:
            seen.add(entry["question"])
            out.append(_record(mix, t, t.level, seed, index, entry, len(out)))
        if tried > 50 * count + 2000:
            raise DataError(mix.text, None, f"task {t.name}: only {len(out)} distinct {mix.split} questions in "
                                            f"{tried} draws at config {t.config} level {t.level}; lower size or "
                                            "make the task harder")
    return out


# ---- the training stream and its curriculum ----------------------------------------------------
class TaskStream(DataSource):
    """The training split of a mix as a data source: endless, resumable, with a curriculum.

    Draw ``p`` picks its task by weight (a generator keyed by ``(seed, p)``) and takes that task's
    next generator entry whose question belongs to the train split (``split_of``; the others are
    skipped and counted). With a curriculum, entries come from the task's current level, and
    ``observe`` moves each level by the rolling accuracy of the samples drawn at it.
    ``state_dict`` holds the draw count, each task's generator position, level and window.
    """

    def __init__(self, mix: MixSpec):
        super().__init__([], shuffle=False)
        if mix.split != "train":
            raise DataError(mix.text, None, f"--prompt-data trains on the train split; this spec asks for {mix.split!r}")
        self.mix, self.drawn, self.skipped = mix, 0, 0
        self.tasks = {t.name: t for t in mix.tasks}
        self.tried = {name: 0 for name in self.tasks}  # generator entries taken per task
        curriculum = mix.curriculum is not None
        self.levels = {name: (t.level or 0) if curriculum else t.level for name, t in self.tasks.items()}
        window = mix.curriculum.window if curriculum else 1
        self.windows = {name: deque(maxlen=window) for name in self.tasks}
        self.longest_prompt = 0  # set by whoever measures rendered prompts (rlvr.runtime.build)

    def __len__(self) -> int:  # one "epoch" (slime's --num-epoch) is `size` prompts
        return self.mix.size

    @property
    def position(self) -> int:
        return self.drawn

    def next_prompts(self, n: int) -> list[PromptRecord]:
        names, weights = list(self.tasks), [t.weight for t in self.tasks.values()]
        out = []
        for p in range(self.drawn, self.drawn + n):
            name = random.Random(f"{self.mix.seed}/{p}").choices(names, weights)[0]
            out.append(self._next_entry(self.tasks[name], p))
        self.drawn += n
        return out

    def _next_entry(self, t: TaskSpec, position: int) -> PromptRecord:
        level, config_json = self.levels[t.name], json.dumps(t.config, sort_keys=True)
        for _ in range(10_000):
            chunk, index = divmod(self.tried[t.name], self.mix.size)
            seed = generator_seed(self.mix.seed, "train", t.name, level, chunk)
            try:
                entry = task_dataset(t.name, config_json, level, seed, self.mix.size)[index]
            except Exception as e:  # noqa: BLE001 - a generator's refusal is whatever its code raises
                raise DataError(self.mix.text, None, f"task {t.name}: the generator refused config {t.config} at "
                                f"level {level}, generator seed {seed}, entry {index}: {type(e).__name__}: {e}") from None
            self.tried[t.name] += 1
            if split_of(t.name, entry["question"]) == "train":
                return _record(self.mix, t, level, seed, index, entry, position)
            self.skipped += 1
        raise DataError(self.mix.text, None, f"task {t.name}: 10000 generated questions in a row are held-out ones")

    def observe(self, samples) -> dict[str, float]:
        """Feed the graded samples of a rollout to the curriculum: each task's window takes the
        accuracy (score 1) of its samples drawn at the current level; a full window at or above
        ``raise_at`` raises the level, at or below ``lower_at`` lowers it (the window then starts
        again). Returns ``curriculum/<task>/level`` and ``/accuracy`` (the window's mean)."""
        c = self.mix.curriculum
        if c is None:
            return {}
        for s in samples:
            locator = s.metadata.get("reasoning_gym") or {}
            name = locator.get("task")
            if name in self.levels and locator.get("level") == self.levels[name]:
                self.windows[name].append(float(task_score(s) >= 1.0))
        out = {}
        for name, window in self.windows.items():
            accuracy = sum(window) / len(window) if window else 0.0
            out[f"curriculum/{name}/accuracy"] = accuracy
            if len(window) == window.maxlen:
                level = self.levels[name]
                if accuracy >= c.raise_at and level < max_level(name):
                    self.levels[name], _ = level + 1, window.clear()
                elif c.lower_at is not None and accuracy <= c.lower_at and level > 0:
                    self.levels[name], _ = level - 1, window.clear()
            out[f"curriculum/{name}/level"] = float(self.levels[name])
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), "drawn": self.drawn, "skipped": self.skipped, "tried": dict(self.tried),
                "levels": dict(self.levels), "windows": {k: list(w) for k, w in self.windows.items()}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict({**state, "epoch": 0, "offset": 0})
        if set(state["levels"]) != set(self.tasks):
            raise DataError(self.mix.text, None, f"the checkpoint's tasks {sorted(state['levels'])} are not this "
                                                 f"spec's {sorted(self.tasks)}")
        self.drawn, self.skipped, self.tried = state["drawn"], state["skipped"], dict(state["tried"])
        self.levels = dict(state["levels"])
        for name, values in state["windows"].items():
            self.windows[name].clear()
            self.windows[name].extend(values)


def task_score(sample) -> float:
    """The task's own score of a graded sample: the ``reasoning_gym`` part of a composite reward,
    else the reward itself."""
    reward = sample.reward
    if isinstance(reward, dict):
        return float(reward.get("reasoning_gym", reward.get("score", 0.0)))
    return float(reward or 0.0)
