"""The embedded engine: in-process continuous-batching sampler on any Hugging Face causal LM.

Contract (rlvr.engine.base): every request is sampled independently with its own temperature,
top-p, top-k, max new tokens, stop ids, stop strings and seed; each token comes back with its
log-prob under softmax(logits / T) (``rlvr.engine.sampling``) and the weight version that
produced it. ``generate`` may be called many times concurrently; all calls share one batch and
each returns when its own requests are done.

How it is fast for RL's shape (n samples of one prompt, very uneven lengths):
- **Shared prefill.** Requests of one call with the same prompt form a group: the prompt is
  run through the model once and its KV cache fanned out to the group's rows.
- **Finished rows leave at once** and **waiting requests join** the running batch as soon as
  there are free slots (``max_batch_size`` rows), so no slot idles through the long tail.
A single worker thread owns the model and the batch (``rlvr.engine.local.kv``); it decodes one token
for every row per step. Callers only touch queues under a condition variable.

Deterministic mode (``deterministic=True``, ``--deterministic-mode``): which rows share a forward
changes how the matmuls are blocked, and so the last bits of every row's logits (measured on the
tiny Qwen2: up to ~1e-6 in a log-prob), and continuous batching forms its batch from whatever has
arrived. In this mode the decode schedule is fixed by each call alone: a call's requests, grouped by
prompt in call order, are cut into *packs* that each fit an empty engine (``max_batch_size`` rows
and the KV budget; a group is split only when it cannot fit an empty pack), and every pack is a
lane of its own: prefilled together, decoded in a forward of its own rows only, never joined by
rows of another call or pack, started whole or not at all. A request's tokens and log-probs are
then a function of its call, the weights and the seeds, whatever other calls run and whenever
they arrived (bit for bit on one machine and thread count). The rollout makes that schedule
reproducible by sending each round of groups (and each evaluation) as one call in index order.
The cost is one forward per pack per step instead of one per step, and a pack waits for room for
all its rows (``benchmarks/rollout_throughput.py --deterministic-mode``).

Abort: ``abort()`` finishes every request submitted before the call, ``abort(rid)`` one
request; they come back with their tokens so far and reason ``abort`` after at most the decode
step that was running. ``update_weights`` takes effect between two decode steps: a request in
flight keeps its KV cache and continues under the new weights, and ``weight_versions`` records
which version sampled each token.

Device: the engine computes on ``device`` (default: the given module's device, or CPU
for a checkpoint path). The batch's tensors, the per-request sampling generators and every
sampling input live there; the host sees one copy per decode step (the step's sampled tokens and
their log-probs together, ``_to_host``: stop checks and results need them), never one per row or
per token. The stream that draws each request's seed stays a CPU generator, so a checkpoint's
engine state is the same kind of tensor on every device.

Memory budget (``kv_budget_bytes``, from ``--sglang-mem-fraction-static``; ``rlvr.runtime.build``): the
KV cache may hold at most this many bytes, charged as ``kv.footprint`` (rows x their widest
prompt + max new tokens x bytes per cached token, measured on the model, doubled for the growing
buffer). Admission takes rows only while the charge fits; a request that cannot fit even alone
ends with reason ``error`` and a message to raise the fraction.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Iterable, Mapping

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from rlvr.engine.local import fused, kv
from rlvr.engine.base import GenerateRequest, GenerateResult, SamplingParams
from rlvr.engine.local.worker import Call, WorkerEngine, check_requests
from rlvr.engine.sampling import filter_logits, sample_next, top_log_probs
from rlvr.models.moe import RoutingRecorder

# Prompt tokens one prefill forward takes at most (admitted groups x their longest prompt, left
# padding included): past it, the admitted groups are prefilled in chunks of similar lengths
# (``prefill_chunks``). In one forward, 192 evaluation prompts of 52-182 tokens were 34,944 tokens
# for 18,159 real ones, and their activations' fresh pages cost a fifth of the time in page faults
# (docs/engine.md).
PREFILL_TOKENS = 8192

log = logging.getLogger(__name__)


@dataclass
class _Row:
    req: GenerateRequest
    call: Call
    index: int  # position in the call
    seq: int  # submission order, for abort()
    generator: torch.Generator  # this request's own sampling stream
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    routes: list[torch.Tensor] = field(default_factory=list)  # R3: [positions, MoE layers, k] pieces
    top_ids: list[list[int]] = field(default_factory=list)  # score centering: q's head per token
    top_log_probs: list[list[float]] = field(default_factory=list)
    done: bool = False  # finished; the row stays in the batch until the next compaction
    on_token: Callable[[int, float, int], None] | None = None  # stream(): called (worker thread) per token


@dataclass
class _Group:
    """Rows waiting to start that share a prompt (prefilled once)."""

    prompt: list[int]
    rows: list[_Row]
    pack: int = -1  # deterministic mode: the groups of one pack start together, as one lane


@dataclass
class _Lane:
    """Rows decoded together, one forward per step, in batch order: the whole running batch, or
    in deterministic mode one pack's rows."""

    rows: list[_Row] = field(default_factory=list)
    batch: kv.KVBatch | None = None


class EmbeddedEngine(WorkerEngine):
    """In-process engine on ``rlvr.engine.local.worker``'s skeleton, its step a decode step. Holds
    its own copy of the weights (the trainer pushes new ones), except a
    LoRA policy's frozen base, which it shares with the trainer; with ``share_weights`` it samples
    from the trainer's module itself (``_shared_model``) and a weight update only moves the version."""

    def __init__(
        self,
        model: str | PreTrainedModel,
        pad_token_id: int,
        seed: int = 0,
        max_batch_size: int = 256,
        device: str | torch.device | None = None,
        tokenizer=None,
        return_routed_experts: bool = False,
        dtype: torch.dtype | None = None,
        kv_budget_bytes: int | None = None,
        mem_fraction: float | None = None,
        deterministic: bool = False,
        share_weights: bool = False,
        fuse_projections: bool = False,
    ):
        super().__init__()
        self.shares_weights = share_weights
        # _shared: the trainer's own tensors (never written here); _synced: what a weight update must bring
        self.model, self._shared, self._synced, device = _engine_model(model, device, dtype, share_weights)
        # q/k/v and gate/up as one GEMM each (rlvr.engine.local.fused), in a module the engine owns
        # whole: never the trainer's module nor one sharing the trainer's frozen LoRA base.
        self.fused = fused.fuse_projections(self.model) if fuse_projections and not self._shared else []
        # R3 (--enable-return-routed-experts): every result carries the experts each MoE layer's
        # router chose for every position it ran (prompt and sampled tokens): rlvr.models.moe.
        self.routing = RoutingRecorder(self.model) if return_routed_experts else None
        self.device, self.pad_token_id, self.max_batch_size = device, pad_token_id, max_batch_size
        self.deterministic = deterministic  # one lane per pack (module docstring)
        self.tokenizer = tokenizer  # needed only for stop strings
        self.generator = torch.Generator().manual_seed(seed)  # CPU: draws each request's seed
        if mem_fraction is not None:  # --sglang-mem-fraction-static: weights + KV within this share
            kv_budget_bytes = kv_budget_from_fraction(mem_fraction, self.model, device)
        self.kv_budget_bytes = kv_budget_bytes
        self.kv_token_bytes = kv.bytes_per_token(self.model, device) if kv_budget_bytes is not None else 0
        self.steps = 0  # decode steps run so far (tests measure abort latency with it)
        self.peak_running = 0  # most rows ever in the batch at once (tests check the KV budget with it)
        self._step_lock = threading.Lock()  # held for one model step; weight updates wait for it
        self._pending: deque[_Group] = deque()
        self._lanes: list[_Lane] = []  # the running rows: one lane, or one per pack in deterministic mode
        self._pack_ids = itertools.count()
        self._asleep: dict[str, torch.Size] | None = None
        self._needs_weights = False

    @property
    def routing_shape(self) -> tuple[int, int]:
        """(MoE layers, experts per token) of the recorded routing."""
        return len(self.routing.routers), int(self.routing.routers[0].top_k)

    # ---- protocol (generate, generate_sync, abort, close: rlvr.engine.local.worker) -------------
    def _cancel(self, call: Call) -> None:
        call.cancelled = True  # the worker aborts its rows at the next step
        self._wake_worker()

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateResult]:
        """``request``'s tokens as they are sampled: one increment per token (a ``GenerateResult``
        of that token, its log-prob and weight version; finish reason ``""``), then a last one
        with the finish reason and no token. The increments add up to ``generate``'s result."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def on_token(token: int, log_prob: float, version: int) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (token, log_prob, version))

        call = self._submit([request], lambda outcome: loop.call_soon_threadsafe(queue.put_nowait, outcome), on_token)
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, tuple):
                    token, log_prob, version = item
                    yield GenerateResult(request.rid, [token], [log_prob], "", version, {}, [version])
                elif isinstance(item, BaseException):
                    finished = True
                    raise item
                else:
                    finished = True
                    r = item[0]
                    yield GenerateResult(r.rid, [], [], r.finish_reason, r.weight_version, r.meta, [])
        finally:
            if not finished:  # the consumer stopped reading (client gone): abort the row
                self._cancel(call)

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        # state_dict names include tied aliases (lm_head.weight when tied to the embeddings),
        # so a checkpoint read from disk applies as is.
        params = dict(self.model.state_dict(keep_vars=True))
        params.update(dict(self.model.named_parameters()))
        with self._step_lock, torch.no_grad():
            seen = set()
            for name, tensor in items:
                if name not in params:
                    raise KeyError(f"update_weights: engine model has no parameter {name!r}")
                if name in self._shared:
                    _check_is_shared(name, tensor, params[name], self.shares_weights)
                    continue  # the trainer's own tensor: already current
                params[name].copy_(tensor)
                seen.add(name)
            missing = self._synced - seen
            if missing:
                raise KeyError(f"update_weights: no tensor sent for {sorted(missing)[:5]} ...")
            self._version = version
            self._needs_weights = False

    def score(self, sequences: list[list[int]], temperature: float = 1.0) -> list[list[float | None]]:
        """Input log-probs of each sequence (``rlvr.engine.local.scoring``), between two decode steps."""
        from rlvr.engine.local.scoring import input_log_probs

        with self._step_lock:
            if self._asleep is not None:
                raise RuntimeError("score: the engine is asleep; wake it first")
            return [input_log_probs(self.model, ids, temperature) for ids in sequences]

    def load(self) -> dict[str, int]:
        """What the engine is doing now (SGLang's ``/get_load`` fields, plus decode steps so far)."""
        with self._cv:
            waiting = sum(len(g.rows) for g in self._pending)
            running = sum(len(lane.rows) for lane in self._lanes)
        return {"num_reqs": running + waiting, "num_waiting_reqs": waiting, "decode_steps": self.steps}

    def health(self) -> bool:
        return self._worker_ok() and not self._closed and self._asleep is None

    # ---- checkpoint: the sampling generator, so a resumed run continues the same stream ------
    def rng_state(self) -> torch.Tensor:
        with self._cv:  # requests draw their seeds from it under the queue lock
            return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        with self._cv:
            self.generator.set_state(state)

    def sleep(self) -> None:
        """Free the weights (they are the trainer's to keep); ``wake`` + ``update_weights`` restore them."""
        with self._step_lock, self._cv:  # lock order as in the worker: step, then queue
            if self._asleep is not None:  # already asleep: the shapes it keeps must stay the real ones
                return
            if self._pending or self._live():
                raise RuntimeError("sleep: requests are in flight; abort() or wait for them first")
            shapes = {}
            for name, p in self.model.named_parameters():
                if name not in self._synced:
                    continue
                shapes[name] = p.shape
                p.data = torch.empty(0, dtype=p.dtype, device=self.device)
            for group in self.fused:
                group.release()
            self._asleep, self._lanes = shapes, []

    def wake(self) -> None:
        with self._step_lock, self._cv:  # lock order as in the worker: step, then queue
            if self._asleep is None:
                return
            for name, p in self.model.named_parameters():
                if name not in self._asleep:
                    continue
                p.data = torch.empty(self._asleep[name], dtype=p.dtype, device=self.device)
            for group in self.fused:  # the fused members' weights: views into a new fused tensor
                group.rebind()
            self._asleep, self._needs_weights = None, True
            self._cv.notify_all()

    # ---- submission (caller threads) ---------------------------------------------------------
    def _submit(self, requests: list[GenerateRequest], done, on_token=None) -> Call:
        check_requests(requests)
        if any(r.params.stop for r in requests) and self.tokenizer is None:
            raise ValueError("generate: stop strings need an engine built with tokenizer=")
        if self._asleep is not None or self._needs_weights:
            raise RuntimeError("generate: the engine is asleep or woke without weights; wake() + update_weights()")
        call = Call.of(requests, done)
        groups: dict[tuple[int, ...], list[_Row]] = {}
        with self._cv:
            if self._closed:
                raise RuntimeError("generate: the engine is closed")
            for i, r in enumerate(requests):
                # Every request samples from a generator of its own, seeded with the request's seed
                # (the rollout derives it from the sample's identity: rlvr.engine.sampling.request_seed)
                # or, without one, from the engine's stream in submission order.
                seed = r.params.seed
                if seed is None:
                    seed = int(torch.randint(0, 2**62, (1,), generator=self.generator, device="cpu"))
                row = _Row(r, call, i, next(self._seq), torch.Generator(device=self.device).manual_seed(seed),
                           on_token=on_token)
                groups.setdefault(tuple(r.prompt_ids), []).append(row)
            if self.deterministic:
                self._pending.extend(self._packs(groups))
            else:
                self._pending.extend(_Group(list(prompt), rows) for prompt, rows in groups.items())
            self._start_worker()
            self._cv.notify_all()
        return call

    def _packs(self, groups: dict[tuple[int, ...], list[_Row]]) -> list[_Group]:
        """Deterministic mode: one call's groups, in call order, cut into packs that each fit an
        empty engine (``max_batch_size`` rows, the KV budget), so a lane's rows depend on the call
        alone, never on what else is running when it starts. A group that does not fit whole beside
        the pack's others opens the next pack; one too big for an empty pack is split."""
        out: list[_Group] = []
        pack, widths = next(self._pack_ids), []
        for prompt, rows in groups.items():
            while rows:
                need = [len(prompt) + r.req.params.max_new_tokens for r in rows]
                take = min(len(rows), self.max_batch_size - len(widths))
                if self.kv_budget_bytes is not None:
                    take = min(take, kv.rows_within_budget(widths, need, self.kv_token_bytes, self.kv_budget_bytes))
                if take < len(rows) and widths:  # not whole beside the pack's others: the next pack
                    pack, widths = next(self._pack_ids), []
                    continue
                take = max(take, 1)  # a row that cannot fit even alone is refused at admission
                out.append(_Group(list(prompt), rows[:take], pack))
                widths, rows = widths + need[:take], rows[take:]
        return out

    def _wake_worker(self) -> None:
        with self._cv:
            self._cv.notify_all()

    # ---- the worker's step (its loop: rlvr.engine.local.worker) --------------------------------
    def _has_work(self) -> bool:
        return bool(self._pending or self._live())

    def _take_work(self) -> list[_Group]:
        self._apply_aborts()
        return self._admit()

    def _step(self, admitted: list[_Group]) -> None:
        if not (admitted or self._live()):
            return
        try:
            with self._step_lock:
                self._decode_step(admitted)
        except Exception as e:  # contained: the requests in flight end with "error", the engine goes on
                log.exception("engine step failed; %d requests in flight end with finish reason 'error'",
                              self._live() + sum(len(g.rows) for g in admitted))
                with self._cv:
                    for r in [r for r in self._running() if not r.done] + [r for g in admitted for r in g.rows]:
                        self._finish(r, "error", {"error": repr(e)})
                    self._lanes = []

    def _aborted(self, row: _Row) -> bool:
        return row.seq < self._abort_before or row.req.rid in self._abort_rids or row.call.cancelled

    def _running(self) -> list[_Row]:
        return [r for lane in self._lanes for r in lane.rows]

    def _live(self) -> int:
        return sum(not r.done for r in self._running())

    def _apply_aborts(self) -> None:
        """Finish aborted rows (running and waiting) with their tokens so far. Holds ``_cv``."""
        for lane in self._lanes:
            aborted = [r for r in lane.rows if not r.done and self._aborted(r)]
            for r in aborted:
                self._finish(r, "abort")
            if aborted:
                self._compact(lane)
        self._lanes = [lane for lane in self._lanes if lane.rows]
        for g in self._pending:
            for r in [r for r in g.rows if self._aborted(r)]:
                self._finish(r, "abort")
            g.rows = [r for r in g.rows if not self._aborted(r)]
        self._pending = deque(g for g in self._pending if g.rows)
        self._abort_rids.clear()

    def _admit(self) -> list[_Group]:
        """Take waiting groups into the free slots. Holds ``_cv``.

        Joining copies the running batch's cache, so rows join in waves: when the batch is empty,
        when an eighth of the slots are free, or when everything waiting fits. A group that does
        not fit is split, except in deterministic mode, where packs start whole and in submission
        order (``_admit_packs``)."""
        live = self._live()
        free = self.max_batch_size - live
        waiting = sum(len(g.rows) for g in self._pending)
        if not waiting or free <= 0 or (live and free < self.max_batch_size // 8 and waiting > free):
            return []
        if self.deterministic:
            return self._admit_packs(free)
        admitted: list[_Group] = []
        while self._pending and free > 0:
            g = self._pending[0]
            take = min(len(g.rows), free, self._fits(admitted, g))
            if take == 0 and not self._lanes and not admitted:  # alone in an empty engine and still too big
                self._refuse_over_budget(g)
                continue
            if take == 0:
                break
            if take == len(g.rows):
                admitted.append(self._pending.popleft())
            else:
                admitted.append(_Group(g.prompt, g.rows[:take]))
                g.rows = g.rows[take:]
            free -= take
        return admitted

    def _admit_packs(self, free: int) -> list[_Group]:
        """Deterministic mode's admission: whole packs, in submission order, while they fit."""
        admitted: list[_Group] = []
        while self._pending:
            pack = list(itertools.takewhile(lambda g, head=self._pending[0].pack: g.pack == head, self._pending))
            rows = sum(len(g.rows) for g in pack)
            fits = all(self._fits(admitted + pack[:i], g) == len(g.rows) for i, g in enumerate(pack))
            if not fits and not self._lanes and not admitted and rows == 1:  # one row too big for an empty engine
                self._refuse_over_budget(pack[0])
                continue
            if rows > free or not fits:
                break
            for _ in pack:
                admitted.append(self._pending.popleft())
            free -= rows
        return admitted

    def _fits(self, admitted: list[_Group], g: _Group) -> int:
        """Rows of ``g`` that fit the KV budget beside the batch and ``admitted`` (no budget: all)."""
        if self.kv_budget_bytes is None:
            return len(g.rows)
        widths = [len(r.req.prompt_ids) + r.req.params.max_new_tokens for r in self._running()]
        widths += [len(a.prompt) + r.req.params.max_new_tokens for a in admitted for r in a.rows]
        return kv.rows_within_budget(widths, [len(g.prompt) + r.req.params.max_new_tokens for r in g.rows],
                                     self.kv_token_bytes, self.kv_budget_bytes)

    def _refuse_over_budget(self, g: _Group) -> None:
        """End the first row of ``g`` (it cannot fit even alone) with a message. Holds ``_cv``."""
        r = g.rows.pop(0)
        need = kv.footprint([len(g.prompt) + r.req.params.max_new_tokens], self.kv_token_bytes)
        self._finish(r, "error", {"error": f"the engine's KV budget is {self.kv_budget_bytes / 2**20:.1f} MiB and this "
                                           f"request needs {need / 2**20:.1f} MiB; raise --sglang-mem-fraction-static "
                                           "or lower --rollout-max-response-len"})
        if not g.rows:
            self._pending.popleft()

    def _fail_all(self, error: BaseException) -> None:
        with self._cv:
            calls = {id(r.call): r.call for r in self._running()}
            calls |= {id(r.call): r.call for g in self._pending for r in g.rows}
            self._lanes, self._pending = [], deque()
            for call in calls.values():
                call.fail(error)

    def _finish(self, row: _Row, reason: str, meta: dict | None = None) -> None:
        if row.done:
            return
        row.done = True
        result = GenerateResult(
            row.req.rid, row.tokens, row.log_probs, reason,
            row.versions[-1] if row.versions else self._version, meta or {}, row.versions,
            routed_experts=torch.cat(row.routes) if self.routing is not None and row.routes else None,
            top_token_ids=row.top_ids, top_log_probs=row.top_log_probs,
        )
        row.call.finish(row.index, result)

    def _compact(self, lane: _Lane, new: tuple[list[_Row], kv.KVBatch] | None = None) -> None:
        """Drop finished rows from ``lane`` and append ``new`` rows. Holds ``_cv``."""
        keep = [i for i, r in enumerate(lane.rows) if not r.done]
        if len(keep) < len(lane.rows):
            lane.batch = kv.select(lane.batch, self._index(keep)) if keep else None
            lane.rows = [lane.rows[i] for i in keep]
        if new is not None and new[0]:
            lane.batch = kv.concat(lane.batch, new[1])
            lane.rows = lane.rows + new[0]

    @torch.no_grad()
    def _decode_step(self, admitted: list[_Group]) -> None:
        """One decode step for the running rows (a forward per lane), then prefill + first token for
        the admitted groups: joining the running lane, or in deterministic mode each pack a new lane."""
        for lane in self._lanes:
            if lane.rows:
                self._decode(lane)
        if self.deterministic:
            joining = [list(pack) for _, pack in itertools.groupby(admitted, key=lambda g: g.pack)]
        else:
            joining = [admitted] if admitted else []
        new = []
        for groups in joining:
            rows, parts = [], []
            for chunk in prefill_chunks([len(g.prompt) for g in groups], PREFILL_TOKENS):
                chunk_rows, batch = self._prefill([groups[i] for i in chunk])
                keep = self._retire(chunk_rows)
                rows += [chunk_rows[i] for i in keep]
                parts.append(batch if len(keep) == len(chunk_rows) else
                             kv.select(batch, self._index(keep)) if keep else None)
            new.append((rows, kv.concat(*parts)))
        with self._cv:
            for rows_batch in new:  # without deterministic mode there is one lane at most
                if self.deterministic or not self._lanes:
                    self._lanes.append(_Lane())
                self._compact(self._lanes[-1], rows_batch)
            for lane in self._lanes:
                # Dead rows still ride along (wasted compute) until an eighth of the lane is dead:
                # compacting copies the whole cache, so doing it on every finish costs more.
                dead = sum(r.done for r in lane.rows)
                if dead and dead >= max(1, len(lane.rows) // 8):
                    self._compact(lane)
            self._lanes = [lane for lane in self._lanes if lane.rows]
            self.peak_running = max(self.peak_running, len(self._running()))

    def _decode(self, lane: _Lane) -> None:
        """One token for every row of ``lane``: a forward over its cache."""
        b = lane.batch
        mask = torch.cat([b.mask, b.mask.new_ones(len(b), 1)], dim=1)
        logits = self.model(
            input_ids=b.last.unsqueeze(-1), attention_mask=mask, position_ids=b.next_pos.unsqueeze(-1),
            **kv.cache_arg(self.model, b.cache), use_cache=True,
        ).logits[:, -1, :].float()
        self.steps += 1
        if self.routing is not None:  # the routing of each row's last token, fed this step
            routes = self.routing.take()
            for i, r in enumerate(lane.rows):
                if not r.done:
                    r.routes.append(routes[i : i + 1])
        b = kv.KVBatch(b.cache, mask, b.next_pos + 1, b.last)
        b.last = self._sample_rows(lane.rows, logits)
        lane.batch = b
        self._retire(lane.rows)

    def _prefill(self, groups: list[_Group]) -> tuple[list[_Row], kv.KVBatch]:
        """Run each group's prompt once (left-padded together), fan the cache out to its rows
        and sample every row's first token."""
        lens = [len(g.prompt) for g in groups]
        width = max(lens)
        ids = torch.full((len(groups), width), self.pad_token_id, dtype=torch.long, device="cpu")
        mask = torch.zeros((len(groups), width), dtype=torch.long, device="cpu")
        for i, g in enumerate(groups):
            ids[i, width - lens[i]:] = torch.tensor(g.prompt, device="cpu")
            mask[i, width - lens[i]:] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)  # one copy each per prefill
        position = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self.model(
            input_ids=ids, attention_mask=mask, position_ids=position, **kv.cache_arg(self.model, cache), use_cache=True,
            logits_to_keep=1
        ).logits[:, -1, :].float()
        fan = self._index([i for i, g in enumerate(groups) for _ in g.rows])
        rows = [r for g in groups for r in g.rows]
        if self.routing is not None:  # the prompt's routing, computed once, shared by the group's rows
            routes = self.routing.take().view(len(groups), width, *self.routing_shape)
            for i, g in enumerate(groups):
                for r in g.rows:
                    r.routes = [routes[i, width - lens[i]:]]
        batch = kv.select(kv.KVBatch(cache, mask, self._index(lens), mask.new_zeros(len(groups))), fan)
        batch.last = self._sample_rows(rows, logits[fan])
        return rows, batch

    def _sample_rows(self, rows: list[_Row], logits: torch.Tensor) -> torch.Tensor:
        params = [r.req.params for r in rows]
        tokens, logp = sample_next(
            logits,
            torch.tensor([p.temperature for p in params], dtype=torch.float32, device=self.device),
            self._index([p.top_k for p in params]),
            torch.tensor([p.top_p for p in params], dtype=torch.float32, device=self.device),
            [r.generator for r in rows],
        )
        host_tokens, host_logp = _to_host(tokens, logp)
        for r, t, lp in zip(rows, host_tokens, host_logp, strict=True):
            if r.done:
                continue
            r.tokens.append(t)
            r.log_probs.append(lp)
            r.versions.append(self._version)
            if r.on_token is not None:
                r.on_token(t, lp, self._version)
        k = max(p.top_logprobs_num for p in params)
        if k:  # score centering's head: the top-k of q with every sampled token
            ids, lps = top_log_probs(logits, torch.tensor([p.temperature for p in params], device=self.device), k)
            for r, i, lp in zip(rows, ids.tolist(), lps.tolist(), strict=True):
                if not r.done and r.req.params.top_logprobs_num:
                    r.top_ids.append(i[: r.req.params.top_logprobs_num])
                    r.top_log_probs.append(lp[: r.req.params.top_logprobs_num])
        return tokens

    def _index(self, values: list[int]) -> torch.Tensor:
        """A long tensor on the engine's device (row indices, lengths, top-k)."""
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _retire(self, rows: list[_Row]) -> list[int]:
        """Finish rows that hit a stop or their length; return the indices of the others."""
        keep = []
        for i, r in enumerate(rows):
            p = r.req.params
            if r.done:
                continue
            if r.tokens[-1] in p.stop_token_ids or (p.stop and _hits_stop_string(self.tokenizer, r.tokens, p.stop)):
                self._finish(r, "stop")
            elif len(r.tokens) >= p.max_new_tokens:
                self._finish(r, "length")
            else:
                keep.append(i)
        return keep


def prefill_chunks(lengths: list[int], budget: int) -> list[list[int]]:
    """The groups (by index; ``lengths`` are their prompts') prefilled in one forward each. All
    of them in their order when they fit ``budget`` tokens (groups x the longest prompt, the
    left-padded forward's size); else by length, each chunk at most ``budget`` (a longer prompt
    alone), so a long prompt does not pad many short ones to its width.

    >>> prefill_chunks([5, 3, 4], 15)
    [[0, 1, 2]]
    >>> prefill_chunks([100, 10, 90, 12, 300], 200)
    [[1, 3], [2, 0], [4]]
    """
    if len(lengths) * max(lengths, default=0) <= budget:
        return [list(range(len(lengths)))]
    chunks: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if chunks and (len(chunks[-1]) + 1) * lengths[i] <= budget:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


def _engine_model(model: str | PreTrainedModel, device, dtype, share_weights: bool
                  ) -> tuple[PreTrainedModel, set[str], set[str], torch.device]:
    """The module the engine samples from, the names of the trainer's tensors it shares, the names a
    weight update must bring, and its device. The module is the trainer's own (``share_weights``:
    it keeps its precision, mode and trainable flags), a copy of a given module, or a checkpoint
    loaded from disk; a copy or a checkpoint moves to ``device`` and ``dtype`` (the engine's
    precision when it differs from the model's, e.g. bfloat16 sampling for a float32 trainer, the
    train-inference mismatch R3 and TIS correct) and is frozen in eval mode. A weight update brings
    every parameter, or only the adapters of a LoRA-wrapped model (rlvr.train.lora: its frozen base
    never changes, so it is neither sent nor freed); nothing when the engine samples from the
    trainer's own tensors."""
    shared: set[str] = set()
    if share_weights:
        model, shared = _shared_model(model, device, dtype)
    elif isinstance(model, PreTrainedModel):
        model, shared = _copied_model(model, device, dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    synced = {n for n, p in model.named_parameters() if p.requires_grad and n not in shared}
    if not share_weights:
        model.to(device, dtype=dtype).eval()
        model.requires_grad_(False)
    return model, shared, synced, device


def _copied_model(model: PreTrainedModel, device, dtype) -> tuple[PreTrainedModel, set[str]]:
    """A copy on the model's own device (colocated on one GPU: no host round trip). A LoRA
    policy's frozen base is shared, not copied, when device and dtype already match: it never
    changes, so the process keeps one copy of the base weights."""
    same = (device is None or torch.device(device) == next(model.parameters()).device) and dtype is None
    frozen = {n: p for n, p in model.named_parameters() if not p.requires_grad} if same else {}
    if len(frozen) == sum(1 for _ in model.parameters()):
        frozen = {}  # a frozen model is not a LoRA policy: copy it whole
    return copy.deepcopy(model, memo={id(p): p for p in frozen.values()}), set(frozen)


def _shared_model(model, device, dtype) -> tuple[PreTrainedModel, set[str]]:
    """The trainer's own module, for an engine that samples from it (``share_weights``): a
    synchronous local run, where sampling and training take turns and every rollout is sampled from
    the latest weights, so a copy would only hold the same numbers twice (4 bytes per parameter in
    float32). Its decode steps run under ``no_grad`` in the module's eval mode (the trainer keeps
    it there); layers with recomputation enabled run plainly without gradients (transformers'
    ``GradientCheckpointingLayer``), cache included."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError("share_weights needs the trainer's module, not a checkpoint path")
    own = next(model.parameters())
    if (device is not None and torch.device(device) != own.device) or (dtype is not None and dtype != own.dtype):
        raise ValueError(f"share_weights: the engine computes on the module's own {own.device} / {own.dtype}; "
                         f"got device={device}, dtype={dtype}")
    if model.training:
        raise ValueError("share_weights: the module is in training mode (dropout on); the engine samples in eval mode")
    return model, set(model.state_dict(keep_vars=True))  # tied aliases (lm_head.weight) included


def _check_is_shared(name: str, tensor: torch.Tensor, own: torch.Tensor, shares_weights: bool) -> None:
    """A weight update's tensor for a parameter the engine shares must be that parameter (the
    trainer sending its own weights: nothing to copy); any other tensor is refused, before anything
    is written, since writing it would change the trainer's weights."""
    if tensor.data_ptr() == own.data_ptr() and tensor.shape == own.shape:
        return
    if shares_weights:
        raise KeyError(f"update_weights: {name!r}: this engine samples from the trainer's own weights "
                       "(share_weights) and takes no other tensors")
    raise KeyError(f"update_weights: {name!r} is the trainer's frozen LoRA base, shared with this engine; "
                   "send the adapters only")


def kv_budget_from_fraction(fraction: float, model: torch.nn.Module, device: torch.device) -> int:
    """KV bytes left when the engine may hold ``fraction`` of the device's memory
    (``rlvr.core.device.total_memory_bytes``) and its weights take their share first."""
    from rlvr.core.device import module_bytes, total_memory_bytes

    total, weights = total_memory_bytes(device), module_bytes(model)
    budget = int(fraction * total) - weights
    if budget <= 0:
        raise ValueError(f"--sglang-mem-fraction-static {fraction}: {fraction * total / 2**30:.2f} GiB of the "
                         f"{device} memory ({total / 2**30:.1f} GiB) cannot hold the engine's weights "
                         f"({weights / 2**30:.2f} GiB) and a KV cache; raise it")
    return budget


def _to_host(tokens: torch.Tensor, log_probs: torch.Tensor) -> tuple[list[int], list[float]]:
    """One device-to-host copy for a step's tokens [B] and log-probs [B] (float64 holds every
    token id exactly)."""
    both = torch.stack([tokens.double(), log_probs.double()]).cpu()
    return [int(t) for t in both[0].tolist()], both[1].tolist()


def _hits_stop_string(tokenizer, tokens: list[int], stops: tuple[str, ...]) -> bool:
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    return any(s in text for s in stops)


__all__ = ["EmbeddedEngine", "SamplingParams", "filter_logits"]
