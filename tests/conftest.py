"""Shared fixtures: tiny checkpoints and task files built by the project's own code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.data.arith import make_splits, write_jsonl
from rlvr.models.tiny import build_tiny_model

SMALL = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1)


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
