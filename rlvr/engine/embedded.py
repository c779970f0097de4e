"""The embedded engine: in-process PyTorch sampling on any Hugging Face causal LM.

Contract: ``generate`` samples each request independently with its own temperature / top-p /
top-k / max-new-tokens / stop ids, and returns the sampled token ids with the log-prob of each
token under softmax(logits / temperature) over the full vocabulary — the same quantity the
trainer recomputes (it divides logits by ``--rollout-temperature`` too), so train-vs-rollout
log-prob differences measure real train/inference mismatch, not a definition gap. Top-p/top-k
restrict *which* tokens can be drawn; the returned log-prob is not renormalised over the kept
set (slime/SGLang convention). Greedy (temperature 0) returns log-probs at temperature 1.

Simplifications of this first version (the engine issue replaces them): requests are run as
one left-padded batch with a shared KV cache; finished rows keep decoding padding until every
row is done; no continuous batching.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from typing import Iterable, Mapping

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from rlvr.engine.base import GenerateRequest, GenerateResult, SamplingParams


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside each row's top-k and nucleus (top-p). ``logits``: [B, V];
    ``top_k``: [B] (<= 0 = off); ``top_p``: [B] in (0, 1]. Returns logits with -inf where cut."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).unsqueeze(-1)
    cut = ranks >= k
    probs = sorted_logits.softmax(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass strictly
    # before it already reaches top_p (the first token is always kept).
    mass_before = probs.cumsum(dim=-1) - probs
    cut |= mass_before >= top_p.unsqueeze(-1)
    cut[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(cut, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class EmbeddedEngine:
    """In-process engine. Holds its own copy of the weights (the trainer pushes new ones)."""

    def __init__(
        self,
        model: str | PreTrainedModel,
        pad_token_id: int,
        seed: int = 0,
        max_batch_size: int = 256,
        device: str = "cpu",
    ):
        if isinstance(model, PreTrainedModel):
            self.model = copy.deepcopy(model)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        self.model.to(device).eval().requires_grad_(False)
        self.device = device
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._version = 0
        self._abort = threading.Event()

    # ---- protocol -------------------------------------------------------------------------
    @property
    def weight_version(self) -> int:
        return self._version

    async def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        self._abort.clear()
        # Each call draws its own seed here, on the event loop and in call order, then samples
        # from a generator of its own in a worker thread: concurrent calls sharing one generator
        # would draw in thread-scheduling order, and a run would not repeat (nor resume) exactly.
        seed = int(torch.randint(0, 2**62, (1,), generator=self.generator))
        return await asyncio.to_thread(self.generate_sync, requests, seed)

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        seen = set()
        with torch.no_grad():
            for name, tensor in items:
                if name not in params:
                    raise KeyError(f"update_weights: engine model has no parameter {name!r}")
                params[name].copy_(tensor)
                seen.add(name)
        missing = {n for n, _ in self.model.named_parameters()} - seen
        if missing:
            raise KeyError(f"update_weights: no tensor sent for {sorted(missing)[:5]} ...")
        self._version = version

    def abort(self) -> None:
        self._abort.set()

    def health(self) -> bool:
        return True

    # ---- checkpoint: the sampling generator, so a resumed run draws the same tokens --------
    def rng_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

    # ---- sampling -------------------------------------------------------------------------
    def generate_sync(self, requests: list[GenerateRequest], seed: int | None = None) -> list[GenerateResult]:
        """Sample ``requests``; with ``seed``, from a generator of that seed instead of the engine's."""
        generator = self.generator if seed is None else torch.Generator(device=self.device).manual_seed(seed)
        results: list[GenerateResult] = []
        for start in range(0, len(requests), self.max_batch_size):
            results.extend(self._generate_batch(requests[start : start + self.max_batch_size], generator))
        return results

    @torch.no_grad()
    def _generate_batch(self, requests: list[GenerateRequest], generator: torch.Generator) -> list[GenerateResult]:
        if not requests:
            return []
        dev, n = self.device, len(requests)
        lens = [len(r.prompt_ids) for r in requests]
        if min(lens) == 0:
            raise ValueError("generate: a request has an empty prompt")
        width = max(lens)
        ids = torch.full((n, width), self.pad_token_id, dtype=torch.long, device=dev)
        mask = torch.zeros((n, width), dtype=torch.long, device=dev)
        for i, r in enumerate(requests):  # left padding: the next token is always at the end
            ids[i, width - lens[i] :] = torch.tensor(r.prompt_ids, device=dev)
            mask[i, width - lens[i] :] = 1

        params = [r.params for r in requests]
        temp = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev)
        greedy = temp <= 0
        temp = torch.where(greedy, torch.ones_like(temp), temp).unsqueeze(-1)
        top_k = torch.tensor([p.top_k for p in params], device=dev)
        top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev)
        max_new = torch.tensor([p.max_new_tokens for p in params], device=dev)
        stops = [set(p.stop_token_ids) for p in params]
        filtering = bool((top_k > 0).any() or (top_p < 1).any())

        out_tokens: list[list[int]] = [[] for _ in range(n)]
        out_logps: list[list[float]] = [[] for _ in range(n)]
        finish: list[str | None] = [None] * n
        done = torch.zeros(n, dtype=torch.bool, device=dev)

        cache = DynamicCache()
        position = (mask.cumsum(-1) - 1).clamp(min=0)
        step_ids, step_pos = ids, position
        for step in range(int(max_new.max())):
            logits = self.model(
                input_ids=step_ids, attention_mask=mask, position_ids=step_pos, cache=cache, use_cache=True
            ).logits[:, -1, :].float()
            scaled = logits / temp
            logp = scaled.log_softmax(-1)
            draw_from = filter_logits(scaled, top_k, top_p) if filtering else scaled
            sampled = torch.multinomial(draw_from.softmax(-1), 1, generator=generator).squeeze(-1)
            token = torch.where(greedy, logits.argmax(-1), sampled)
            token_logp = logp.gather(-1, token.unsqueeze(-1)).squeeze(-1)

            for i in (~done).nonzero().flatten().tolist():
                t = int(token[i])
                out_tokens[i].append(t)
                out_logps[i].append(float(token_logp[i]))
                if t in stops[i]:
                    finish[i], done[i] = "stop", True
                elif len(out_tokens[i]) >= int(max_new[i]):
                    finish[i], done[i] = "length", True
            if bool(done.all()):
                break
            if self._abort.is_set():
                for i in (~done).nonzero().flatten().tolist():
                    finish[i], done[i] = "abort", True
                break
            token = token.masked_fill(done, self.pad_token_id)
            step_ids = token.unsqueeze(-1)
            mask = torch.cat([mask, (~done).long().unsqueeze(-1)], dim=-1)
            step_pos = step_pos[:, -1:] + 1

        return [
            GenerateResult(r.rid, out_tokens[i], out_logps[i], finish[i] or "length", self._version)
            for i, r in enumerate(requests)
        ]


__all__ = ["EmbeddedEngine", "SamplingParams", "filter_logits"]
