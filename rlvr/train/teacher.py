"""The on-policy-distillation teacher: its log-probs of the student's sampled tokens (``rlvr.algo.opd``).

Two kinds, by ``--opd-type`` (slime's names), with one method the trainer calls per micro-batch,
``log_probs(samples, temperature, width, chunk_size, layout) -> [b, width]``:

* ``LoadedTeacher`` (``megatron``): a Hugging Face model from ``--opd-teacher-load`` in the trainer
  process, frozen, run like the reference model (packed, chunked output layer).
* ``ServedTeacher`` (``sglang``): an engine at ``--rm-url`` (``rlvr serve`` or SGLang) asked, one
  request per sample, for the input log-probs of prompt + response with zero new tokens
  (``"sampling_params": {"max_new_tokens": 0, "temperature": T}, "return_logprob": true``); the
  last ``response_length`` entries of ``meta_info.input_token_logprobs`` are the response's, and
  their token ids must be the response's (else the reply is refused as misaligned). Requests are
  retried as ``--rm-retries`` / ``--rm-deadline`` say; a sample still without an answer comes
  back as a row of NaN, which the trainer counts and leaves out of the OPD term (its advantages
  stay the estimator's).

Both score at the rollout temperature, the temperature of the student's log-probs.
"""

from __future__ import annotations

import asyncio
import logging
import math
from concurrent.futures import ThreadPoolExecutor

import torch

from rlvr.core.http import post_json
from rlvr.train.logprobs import response_log_probs
from rlvr.train.packing import Layout
from rlvr.core.types import Sample

log = logging.getLogger(__name__)


class LoadedTeacher:
    """``--opd-type megatron``: the teacher model in this process."""

    def __init__(self, model: torch.nn.Module):
        self.model = model.requires_grad_(False)

    @torch.no_grad()
    def log_probs(self, samples: list[Sample], temperature: float, width: int, chunk_size: int,
                  layout: Layout) -> torch.Tensor:
        lp, _ = response_log_probs(self.model, samples, temperature, width, False, chunk_size, layout.packed,
                                   layout.share_prompts)
        return lp


def response_logprobs_of(reply: dict, response_ids: list[int]) -> list[float]:
    """The response's entries of an SGLang ``/generate`` reply's ``input_token_logprobs``.

    >>> reply = {"meta_info": {"input_token_logprobs": [[None, 1, None], [-0.5, 2, None], [-1.5, 3, None]]}}
    >>> response_logprobs_of(reply, [2, 3])
    [-0.5, -1.5]
    """
    entries = reply["meta_info"]["input_token_logprobs"]
    n = len(response_ids)
    if len(entries) < n:
        raise ValueError(f"{len(entries)} input log-probs for a response of {n} tokens")
    tail = entries[len(entries) - n:]
    if [int(e[1]) for e in tail] != list(response_ids):
        raise ValueError("the input log-probs' token ids are not the response's (misaligned reply)")
    if any(e[0] is None for e in tail):
        raise ValueError("a response token has no input log-prob (logprob_start_len too late?)")
    return [float(e[0]) for e in tail]


class ServedTeacher:
    """``--opd-type sglang``: the teacher served at ``url`` (SGLang's ``/generate``)."""

    def __init__(self, url: str, retries: int, deadline: float):
        self.url, self.retries, self.deadline = url, retries, deadline
        self.failures = 0  # samples left without a teacher answer, over the run

    async def _one(self, sample: Sample, temperature: float) -> list[float]:
        payload = {"input_ids": list(sample.prompt_ids) + list(sample.response_ids),
                   "sampling_params": {"max_new_tokens": 0, "temperature": temperature},
                   "return_logprob": True, "logprob_start_len": 0}
        return await post_json(self.url, payload, self.retries, self.deadline,
                               parse=lambda reply: response_logprobs_of(reply, sample.response_ids))

    async def _all(self, samples: list[Sample], temperature: float) -> list:
        return await asyncio.gather(*(self._one(s, temperature) for s in samples if s.response_ids),
                                    return_exceptions=True)

    def log_probs(self, samples: list[Sample], temperature: float, width: int, chunk_size: int,
                  layout: Layout) -> torch.Tensor:
        # Its own event loop in a worker thread: the caller may be inside one (the async driver).
        with ThreadPoolExecutor(1) as pool:
            answers = iter(pool.submit(asyncio.run, self._all(samples, temperature)).result())
        out = torch.zeros(len(samples), width)
        for row, s in enumerate(samples):
            if not s.response_ids:
                continue
            got = next(answers)
            if isinstance(got, BaseException):
                self.failures += 1
                log.warning("OPD teacher at %s gave no log-probs for a sample: %s", self.url, got)
                out[row] = math.nan
            else:
                out[row, : len(got)] = torch.tensor(got)
        return out


def teacher_of(algo, reward, train) -> LoadedTeacher | ServedTeacher | None:
    """The teacher ``--use-opd --opd-type`` asks for (None without --use-opd): ``algo`` an
    ``AlgoConfig``, ``reward`` a ``RewardConfig`` (--rm-url and its retries), ``train`` a ``TrainConfig``."""
    if not algo.use_opd:
        return None
    if algo.opd_type == "sglang":
        return ServedTeacher(reward.rm_url, reward.rm_retries, reward.rm_deadline)
    from transformers import AutoConfig

    from rlvr.core.errors import ConfigError
    from rlvr.train.trainer import load_policy

    model = load_policy(algo.opd_teacher_load, train.bf16)
    student_vocab = AutoConfig.from_pretrained(train.hf_checkpoint).vocab_size
    if model.config.vocab_size != student_vocab:
        raise ConfigError("--opd-teacher-load", f"the teacher's vocabulary ({model.config.vocab_size}) is not the "
                                                f"student's ({student_vocab}); OPD scores the student's token ids, so "
                                                "both need one tokenizer")
    return LoadedTeacher(model)
