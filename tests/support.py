"""Helpers several test modules share (conftest.py holds the shared fixtures): waiting on a
condition with a deadline, the ledger checks of async runs, engine processes and their chaos,
``rlvr serve`` started and stopped, CLI runs, scripted engines for agent tests, cgroup fences for
hostile programs. Test modules import these from here, never from one another."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from rlvr.core.testing import InjectedFault
from rlvr.core.types import Sample
from rlvr.engine.base import Engine, GenerateRequest, GenerateResult, SamplingParams
from rlvr.sandbox.runner import CGROUP_ROOT

ROOT = Path(__file__).resolve().parents[1]


# ---- from test_supervisor.py ------------------------------------------------------------------------
def wait_until(condition, what: str, timeout: float = 60.0, poll: float = 0.01) -> None:
    """Poll ``condition()`` until it holds; fail naming ``what`` after ``timeout`` seconds (tests
    wait on the state they need, never on a sleep that races the system)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting until {what}")
        time.sleep(poll)


# ---- from test_async.py -----------------------------------------------------------------------------
def read_ledger(run_dir) -> list[dict]:
    return [json.loads(line) for line in open(run_dir / "ledger.jsonl")]


def check_exactly_once(rows: list[dict], n: int, batch: int) -> None:
    """Every group drawn is trained once (n samples, one rollout) or still pending at the end."""
    trained = [r for r in rows if r["trained"]]
    uids = [r["uid"] for r in trained]
    assert len(uids) == len(set(uids)), "a sample was trained twice"
    groups: dict[str, set] = {}
    for r in trained:
        groups.setdefault(r["uid"].split("/")[0], set()).add(r["rollout_id"])
    assert all(len(v) == 1 for v in groups.values()), "a group was split across rollouts"
    per_rollout = {}
    for r in trained:
        per_rollout[r["rollout_id"]] = per_rollout.get(r["rollout_id"], 0) + 1
    assert set(per_rollout.values()) == {n * batch}
    pending = {r["uid"].split("/")[0] for r in rows if not r["trained"]}
    assert not pending & set(groups), "a pending group was also trained"
    drawn = sorted(int(g) for g in pending | set(groups))
    assert drawn == list(range(len(drawn))), "a drawn group is neither trained nor pending (lost)"


# ---- from test_fault_tolerance.py -------------------------------------------------------------------
def rollouts_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    return sum('"rollout/step"' in line for line in path.read_text().splitlines())


def killer(pids: Callable[[], list[int]], in_flight: Callable[[int], bool], run_dir: Path, rng: random.Random,
           log: list, stop: threading.Event) -> None:
    """SIGKILL the two engines the run started with (``pids()``), in random order, each at a
    random moment (0-0.4 s) after the next rollout is logged -- and once that engine has requests
    in flight (``in_flight(pid)``), so that the kill cuts work off whatever the moment fell on
    (training, a weight push). The second may die before the first one's replacement is up: then
    no engine is left for a while, and the run must wait, not fail."""
    while not stop.is_set() and len(pids()) < 2:
        time.sleep(0.05)
    victims = pids()
    rng.shuffle(victims)
    for pid in victims:
        seen = rollouts_logged(run_dir)
        while not stop.is_set() and rollouts_logged(run_dir) <= seen:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))
        while not stop.is_set() and not in_flight(pid):
            time.sleep(0.005)
        if stop.is_set():
            return
        os.kill(pid, signal.SIGKILL)
        log.append((time.time(), pid))


def hold_rollout_until(monkeypatch, targets, rollout_id: int, condition: Callable[[], bool], what: str) -> None:
    """Rollout ``rollout_id`` is asked of each ``(class, method name)`` of ``targets`` (a method taking
    the rollout id) only once ``condition()`` holds: a chaos run's last rollout waits for the
    recovery it checks, so its metrics are the state after recovery, not a race with the run's end."""
    for cls, method in targets:
        def held(self, i, *args, _real=getattr(cls, method), **kwargs):  # noqa: B008 (bound once, at definition)
            if i == rollout_id:
                wait_until(condition, what, timeout=240, poll=0.2)
            return _real(self, i, *args, **kwargs)

        monkeypatch.setattr(cls, method, held)


def run_under_kills(cfg, out: Path, pids: Callable[[], list[int]], in_flight: Callable[[int], bool],
                    seed: int) -> tuple[Path, list]:
    """``run(cfg)`` (its output directory ``out``) while ``killer`` SIGKILLs the two engines a
    probe of the run sees (``pids``, ``in_flight``); the run directory and the kills, ``(time,
    pid)``, once both happened."""
    from rlvr.runtime.loop import run

    kills: list = []
    stop = threading.Event()
    chaos = threading.Thread(target=killer, args=(pids, in_flight, out, random.Random(seed), kills, stop), daemon=True)
    chaos.start()
    try:
        run_dir = run(cfg, console=False)
    finally:
        stop.set()
        chaos.join(5)
    assert len(kills) == 2, "the run ended before both kills"
    return run_dir, kills


def check_trained_once_none_failed(run_dir: Path, rollouts: int) -> dict:
    """Every prompt group of a run of ``rollouts`` rollouts (4 groups of 2) was trained exactly
    once and no trained sample failed; the last rollout's metrics."""
    from rlvr.observe import read_metrics

    rows = read_ledger(run_dir)
    check_exactly_once(rows, n=2, batch=4)
    trained = [r for r in rows if r["trained"]]
    assert len(trained) == rollouts * 8 and all(r["status"] != "failed" for r in trained)
    return [r for r in read_metrics(run_dir) if "rollout/step" in r][-1]


def generate_requests(n: int, max_new: int) -> list[GenerateRequest]:
    return [GenerateRequest([40, 41, 42, 43], SamplingParams(max_new_tokens=max_new), rid=f"r{i}") for i in range(n)]


def check_monitor_survives_a_kill(sup, caplog) -> None:
    """The shared scenario: errors injected before and after the SIGKILL of engine 0 while idle
    (only the monitor can see that death), then a restart and answered requests."""
    def injected() -> int:
        return sum(bool(r.exc_info) and isinstance(r.exc_info[1], InjectedFault) for r in caplog.records)

    wait_until(lambda: injected() >= 2, "the monitor has raised twice")
    killed = sup.slots[0].pid
    os.kill(killed, signal.SIGKILL)
    t_kill = time.time()
    errors_before = injected()
    wait_until(lambda: any(e["event"] == "restarted" for e in sup.events), "engine 0 is restarted", timeout=120)
    down = next(e for e in sup.events if e["event"] == "down")
    assert down["pid"] == killed and down["time"] >= t_kill
    wait_until(lambda: injected() > errors_before, "the monitor raises again after the kill")
    assert sup._monitor.is_alive() and sup.slots[0].pid != killed
    results = asyncio.run(sup.generate(generate_requests(4, 8)))
    assert [r.rid for r in results] == [f"r{i}" for i in range(4)]
    assert all(r.finish_reason in ("stop", "length") and r.token_ids for r in results)
    assert sup.stats()["rollout/engine_restarts"] == 1.0 and sup.stats()["rollout/engines_up"] == 1.0


# ---- from test_server.py ----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(ckpt, port: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlvr", "serve", "--hf-checkpoint", str(ckpt), "--port", str(port),
         "--device", "cpu", "--mem-fraction-static", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rlvr serve exited: {proc.stdout.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("rlvr serve did not come up")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def served(ckpt):
    """``rlvr serve`` of ``ckpt`` on a free port for the ``with`` block: ``(port, process)``."""
    port = free_port()
    proc = start_server(ckpt, port)
    try:
        yield port, proc
    finally:
        stop_server(proc)


@contextlib.contextmanager
def vllm_server(model: Path, log_path: Path, max_lora_rank: int = 8):
    """A real vLLM OpenAI API server (dev mode, LoRA enabled, float32, one thread) of ``model`` on a
    free port for the ``with`` block: its ``host:port``. Fails the test with its log if it does not come up."""
    import pytest

    from rlvr.engine.remote.sglang_http import health

    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "OMP_NUM_THREADS": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--enforce-eager", "--block-size", "32", "--max-num-seqs", "16",
           "--logprobs-mode", "processed_logprobs", "--kv-cache-memory-bytes", str(512 << 20),
           "--enable-lora", "--max-lora-rank", str(max_lora_rank)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while not health(url, 2.0):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"vLLM server did not come up: {log_path.read_text()[-3000:]}")
        time.sleep(0.5)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def post(port: int, route: str, payload: dict, timeout: float = 120) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{route}", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            return r.status, json.loads(text) if text[:1] in "{[" else {"text": text}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


# ---- from test_packing.py ---------------------------------------------------------------------------
def packing_samples(n=6, seed=0, group=1, min_prompt=1):
    """``n`` samples; ``group`` consecutive ones share a prompt (as a GRPO group does) of at least
    ``min_prompt`` tokens."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % group == 0:
            prompt = [rng.randrange(256) for _ in range(rng.randint(min_prompt, 9))]
        out.append(Sample("", prompt, response_ids=[rng.randrange(256) for _ in range(rng.randint(1, 12))]))
    return out


# ---- from test_resume.py ----------------------------------------------------------------------------
def resume_args(ckpt, train, test, out: Path, *extra) -> list[str]:
    """``rlvr train`` of the resume tests: 6 rollouts, checkpoints every 2 under ``out/ckpt``, loaded from there."""
    return ["train", "--hf-checkpoint", str(ckpt), "--prompt-data", str(train), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6", "--num-rollout", "6",
            "--lr", "1e-3", "--use-kl-loss", "--kl-loss-coef", "0.01", "--global-batch-size", "4",
            "--eval-prompt-data", "arith", str(test), "--eval-interval", "3", "--n-samples-per-eval-prompt", "2",
            "--eval-temperature", "1.0", "--save-interval", "2", "--output-dir", str(out),
            "--save", str(out / "ckpt"), "--load", str(out / "ckpt"), *extra]


def run_rlvr(*args, kill_at: str | None = None) -> subprocess.CompletedProcess:
    """``python -m rlvr ARGS`` on one thread; ``kill_at`` SIGKILLs it at that crash point (rlvr.core.testing)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RLVR_TEST_SIGKILL_AT", None)
    if kill_at:
        env["RLVR_TEST_SIGKILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", "rlvr", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def logged_values(run_dir: Path) -> dict[tuple[str, int], dict]:
    """{(step key, step): record without wall-clock fields}; a duplicated step fails the test."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        key = next((k, r[k]) for k in ("rollout/step", "train/step", "eval/step") if k in r)
        assert key not in out, f"{key} logged twice"
        out[key] = {k: v for k, v in r.items() if k != "time" and not k.startswith("perf/")}
    return out


# ---- from test_agents_cli.py ------------------------------------------------------------------------
def cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m rlvr ARGS`` from the repository root, with it on the path (``tests.x:fn`` plugins import)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "rlvr", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=600)


def train_openai_agent(ckpt, train: Path, out: Path, *engine_flags: str) -> tuple[list[dict], list[Sample]]:
    """``rlvr train`` of ``tests.test_agents_openai:openai_agent`` (two turns, the second streamed)
    for two rollouts of 2 prompts x 2 samples, on the engine ``engine_flags`` pick: the train
    records (checked: two steps) and the samples trained (checked: the turns' segments, two calls)."""
    from rlvr.core.types import RolloutBatch

    r = cli("train", *engine_flags, "--hf-checkpoint", str(ckpt), "--prompt-data", str(train),
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "96",
            "--num-rollout", "2", "--lr", "1e-3", "--output-dir", str(out),
            "--custom-generate-function-path", "tests.test_agents_openai:openai_agent",
            "--save-debug-rollout-data", str(out / "dump" / "r{rollout_id}.pt"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/step" in r]
    assert [r["train/step"] for r in train_rows] == [1, 2]
    samples = [s for k in range(2) for s in RolloutBatch.load(out / "dump" / f"r{k}.pt").samples]
    for s in samples:
        assert [t for _, _, t in s.segments()] == [True, False, True] and s.metadata["openai_calls"] == 2
    return train_rows, samples


# ---- from test_agent_tools.py -----------------------------------------------------------------------
class ScriptedEngine(Engine):
    """The ``Engine`` protocol answering each session's k-th call with ``script[k]`` (+ eos
    unless the turn ends with a tool call), log-prob -0.5 per token."""

    weight_version = 0

    def __init__(self, tok, script: list[str]):
        self.tok, self.script, self.turn, self.prompts = tok, script, {}, []

    async def generate(self, requests):
        out = []
        for r in requests:
            k = self.turn.get(r.session, 0)
            self.turn[r.session] = k + 1
            self.prompts.append(list(r.prompt_ids))
            text = self.script[min(k, len(self.script) - 1)]
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
            if not text.endswith("</tool_call>"):
                ids.append(self.tok.eos_token_id)
            ids = ids[: r.params.max_new_tokens]
            reason = "length" if len(ids) == r.params.max_new_tokens and ids[-1] != self.tok.eos_token_id else "stop"
            out.append(GenerateResult(r.rid, ids, [-0.5] * len(ids), reason, 0, {}, [0] * len(ids)))
        return out

    def abort(self, rid=None):
        pass


def agent_rollout(tiny_qwen2, script, tools="tests.test_agent_tools:TOOLS", rm_type: str = "math", **agent_kw):
    import dataclasses

    from rlvr.config import Config
    from rlvr.data.dataset import PromptRecord
    from rlvr.runtime.build import load_tokenizer, make_rollout

    tok = load_tokenizer(str(tiny_qwen2))
    engine = ScriptedEngine(tok, script)
    cfg = Config()
    cfg.data.apply_chat_template = True
    cfg.agent.tools = tools
    for k, v in agent_kw.items():
        setattr(cfg.agent, k, v)
    cfg.rollout.n_samples_per_prompt, cfg.rollout.rollout_max_response_len = 2, 2000
    cfg.reward = dataclasses.replace(cfg.reward, rm_type=rm_type)
    records = [PromptRecord(prompt="What is 12*34?", label="408", metadata={}, index=0)]
    rollout = make_rollout(cfg, engine, tok, records)  # as a run builds it: prompts rendered with the tools
    return rollout, engine, tok


# ---- from test_sandbox.py ---------------------------------------------------------------------------
HOSTILE_DIR = Path(__file__).parent / "hostile"


FAST = dict(code_timeout=3.0, code_cpu_time=1.0, code_memory_mb=256, code_max_processes=16,
            code_max_file_mb=2, code_max_output_kb=16, code_max_concurrency=2)


# CPU 1 s but wall 5 s, so that a busy machine still hits the CPU limit before the timeout.
HOSTILE_CFG = dict(FAST, code_timeout=5.0, code_max_concurrency=1)


FENCE_PIDS, FENCE_MEMORY = 128, 2 * 2**30


def own_cgroup_dir(controller: str) -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            d = CGROUP_ROOT / controller / path.lstrip("/")
            return d if os.access(d, os.W_OK) else None
    return None


def make_fence() -> dict[str, Path] | None:
    """A pids + memory cgroup for the driver, or None where cgroups cannot be written."""
    fence = {}
    for controller, file, value in (("pids", "pids.max", FENCE_PIDS),
                                    ("memory", "memory.limit_in_bytes", FENCE_MEMORY)):
        base = own_cgroup_dir(controller)
        if base is None:
            return None
        d = base / f"rlvr-test-fence-{os.getpid()}"
        d.mkdir(exist_ok=True)
        (d / file).write_text(str(value))
        fence[controller] = d
    return fence


def cgroup_tree_pids(root: Path) -> set[int]:
    pids: set[int] = set()
    for procs in root.rglob("cgroup.procs"):
        try:
            pids.update(int(p) for p in procs.read_text().split())
        except (OSError, ValueError):
            pass
    return pids


PF_EXITING = 0x4  # the kernel's task flag for a process inside exit(2)
SIGKILL_BIT = 1 << (signal.SIGKILL - 1)  # its bit in /proc/PID/status's pending-signal masks


def can_still_act(pid: int) -> bool:
    """Whether ``pid`` can still run code of its own: it exists, is not a zombie, is not inside
    exit(2) and has no SIGKILL pending. A process killed a moment ago may stay listed in /proc for
    a while on a loaded machine (exiting, or waiting to be scheduled to die); it can do nothing."""
    proc = Path("/proc", str(pid))
    try:
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        status = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines() if ":" in line)
    except (OSError, IndexError, ValueError):
        return False
    state, flags = fields[0], int(fields[6])
    pending = int(status.get("SigPnd", "0"), 16) | int(status.get("ShdPnd", "0"), 16)
    return state not in ("Z", "X") and not flags & PF_EXITING and not pending & SIGKILL_BIT


def nobody_pids() -> set[int]:
    """Processes of uid nobody (what the sandbox runs programs as when root) that can still act."""
    found = set()
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and p.stat().st_uid == 65534 and can_still_act(int(p.name)):
                found.add(int(p.name))
        except OSError:
            pass
    return found


def destroy_fence(fence: dict[str, Path]) -> set[int]:
    """Kill whatever is left in the fence, remove it; returns the pids that were left."""
    left = set()
    for d in fence.values():
        left |= cgroup_tree_pids(d)
    for _ in range(100):
        pids = set().union(*(cgroup_tree_pids(d) for d in fence.values()))
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    for d in fence.values():
        for sub in sorted(d.rglob("*"), reverse=True):
            if sub.is_dir():
                sub.rmdir()
        d.rmdir()
    return left


# ---- SmolLM2 against an engine (tests/test_vllm_engine.py, tests/test_vllm_server.py) ------------
def chat_prompt_ids(model_dir: Path, question: str = "What is 12 + 30? Answer briefly.") -> list[int]:
    """``question`` as one user turn through the model's chat template, ready for the assistant."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return tok(tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                       tokenize=False))["input_ids"]


def hf_log_probs(model, prompt: list[int], tokens: list[int], temperature: float):
    """transformers' log softmax(logits / T) of each of ``tokens`` after ``prompt``."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def lora_policy(model_dir: Path, rank: int):
    """The checkpoint with PEFT's LoRA layers of ``rank`` on every linear layer, in place under the HF
    names, as the trainer wraps its model (``rlvr.train.lora.add_adapter``); B = 0 until
    ``randomize_adapters``."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.train import lora

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora.add_adapter(model, SimpleNamespace(lora_adapter_path=None, target_modules=["all-linear"], lora_rank=rank,
                                            lora_alpha=None, lora_dropout=0.0))
    return model


def randomize_adapters(model, generator) -> None:
    """Every adapter tensor drawn anew from ``generator``: a visible effect, different on each call."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=generator) * (0.02 if ".lora_A." in name else 0.05))
