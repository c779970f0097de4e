"""Shared fixtures: tiny checkpoints and task files built by the project's own code."""

from __future__ import annotations

import ast
import functools
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from rlvr.data.arith import make_splits, write_jsonl
from rlvr.models.tiny import build_tiny_model
from rlvr.core.types import Sample

# Under pytest-xdist (``make test`` runs ``-n 2``), the modules that declare the same top-level
# ``SERIAL_GROUP = "<name>"`` run on one worker, one test after another: "ray" (each cluster's
# actors take both cores and several GB; a module using the ``ray_cluster`` fixture must declare
# it, which collection checks) and "sandbox" (test_sandbox.py counts the uid-nobody processes that
# appear while it runs, which another worker's sandboxed programs would add to). Every other test
# is its own unit.
SERIAL_GROUPS = ("ray", "sandbox")


@functools.lru_cache(maxsize=None)
def serial_group(path: Path) -> str | None:
    """A module's top-level ``SERIAL_GROUP = "<name>"``, read from its source without importing it
    (the xdist controller schedules from node ids and never imports the tests)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SERIAL_GROUP" for t in node.targets)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``-n N`` (xdist's default ``--dist load``) schedules through xdist's load-scope scheduler
    with each ``SERIAL_GROUP`` as a scope and every other test a scope of its own. (``--dist
    loadgroup`` would take groups from marks, but pytest-xdist 3.8 renames grouped tests through
    ``Item._nodeid``, which pytest 9 no longer reads, so its groups never form.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = serial_group(root / nodeid.split("::", 1)[0])
            return f"serial group {group}" if group is not None else nodeid

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """A module's ``SERIAL_GROUP`` must be one of ``SERIAL_GROUPS``, and a module whose tests use
    the ``ray_cluster`` fixture must declare "ray" (else the run stops with the module named).
    Tests marked ``gpu`` need CUDA: skipped (with the reason) on a machine without it."""
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        group = getattr(module, "SERIAL_GROUP", None)
        if group is not None and group not in SERIAL_GROUPS:
            raise pytest.UsageError(f"{module.__file__}: SERIAL_GROUP = {group!r} is none of {SERIAL_GROUPS} "
                                    "(tests/conftest.py)")
        if "ray_cluster" in getattr(item, "fixturenames", ()) and group != "ray":
            raise pytest.UsageError(f"{module.__file__}: its tests start a Ray cluster (the ray_cluster fixture), so "
                                    "it must declare SERIAL_GROUP = \"ray\" to run beside no other Ray test "
                                    "(tests/conftest.py)")
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (pytest -m gpu on a GPU machine; scripts/gpu_check.py)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


SMALL = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1)


def random_samples(n: int, seed: int, reward: Callable[[int, random.Random], float]) -> list[Sample]:
    """``n`` samples of random byte tokens (prompts 3-7, responses 1-9 long) with rollout
    log-probs -1; ``reward(i, rng)`` gives sample ``i``'s reward."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(0, 256) for _ in range(rng.randint(3, 7))]
        resp = [rng.randrange(0, 256) for _ in range(rng.randint(1, 9))]
        out.append(Sample("", prompt, response_ids=resp, loss_mask=[1] * len(resp),
                          rollout_log_probs=[-1.0] * len(resp), reward=reward(i, rng), index=i))
    return out


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), arch="qwen2", **SMALL)


@pytest.fixture(scope="session")
def arith_files(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("arith")
    train, test = make_splits(n_test=200)
    return write_jsonl(train[:500], d / "train.jsonl"), write_jsonl(test, d / "test.jsonl")


@pytest.fixture(scope="module")
def small_eval(arith_files, request, tmp_path_factory) -> Path:
    """The first rows of the arithmetic test split as a small eval set: the module's
    ``SMALL_EVAL_ROWS`` of them (default 8)."""
    path = tmp_path_factory.mktemp("eval") / "test.jsonl"
    rows = getattr(request.module, "SMALL_EVAL_ROWS", 8)
    path.write_text("".join(arith_files[1].read_text().splitlines(keepends=True)[:rows]))
    return path


@pytest.fixture(scope="module")
def ray_cluster(request):
    """A local Ray cluster for the module's tests, shut down after them: the module's
    ``RAY_NUM_CPUS`` CPUs (default 5: 2 training ranks + 2 engines, and slack)."""
    ray = pytest.importorskip("ray")
    from rlvr.distributed.placement import ACTOR_ENV, LOCAL_RAY_SYSTEM_CONFIG

    ray.init(num_cpus=getattr(request.module, "RAY_NUM_CPUS", 5), include_dashboard=False,
             runtime_env={"env_vars": dict(ACTOR_ENV)}, log_to_driver=False,
             _system_config=dict(LOCAL_RAY_SYSTEM_CONFIG))
    yield
    ray.shutdown()


def write_lines(path: Path, lines: list[str | dict]) -> Path:
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    return path


@pytest.fixture()
def busy_cpu():
    """A process spinning on the CPU for the whole test: the contention under which thread timing,
    and with it the order requests reach an engine, changes from run to run."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield spinner.pid
        assert spinner.poll() is None, "the busy process stopped before the test ended"
    finally:
        spinner.kill()
        spinner.wait()
