"""Shared fixtures: tiny checkpoints and task files built by the project's own code."""

from __future__ import annotations

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

def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: skipped (with the reason) on a machine without it."""
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
