"""``--rm-type reasoning_gym``: a reasoning-gym task's own verifier on the reply's final answer.

The sample's metadata says which entry it answers (``rlvr.data.reasoning_gym``: the locator under
``reasoning_gym`` rebuilds the generator's entry exactly; ``task`` plus ``entry`` also works, for
prompt files written from entries). The answer is read from the reply the way a careful grader
reads it (``final_answer``), then scored by that task's ``score_answer(answer, entry)``: whatever
partial credit the task gives is kept, and none is added.

Reading the final answer (tested on real SmolLM2-135M-Instruct replies,
``tests/data/reasoning_gym_replies.jsonl``):

1. the last ``<answer>...</answer>`` block, when the reply has one (the ``answer_tag`` prompt
   form asks for it);
2. else the last ``\\boxed{...}``;
3. else what follows an answer statement ("The answer is 15.", "Final answer: 20", "The answer
   to this problem is 12") up to the end of its sentence or clause; several statements that
   disagree are a hedge and get no answer;
4. else, for a reply that ran to its end (not truncated), its last sentence: the value after its
   last ``=`` or its last " is ", or the sentence itself (a text answer only from a one-line reply).

When the task's answer is a number, the reading must hold exactly one number, which becomes the
answer ("There are 6 legs." reads 6; "5 or 16" reads nothing), so a listed or hedged reply never
collects the partial credit some tasks give to answers that merely contain the right one.
"""

from __future__ import annotations

import json
import re

from rlvr.core.types import Sample, Status
from rlvr.rewards.grader import inline
from rlvr.rewards.registry import REWARDS

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
# "answer is X", "answer: X", "answer to this problem is X", "answer equals X"
_STATED = re.compile(r"\banswer\b(?:[^\n.:=]{0,60}?\b(?:is|was|equals)\b|\s*[:=])\s*:?\s*([^\n]*)", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?=\s|$)|;|,\s|\s\(|\s(?:which|because|since|so|if|when)\b")
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")
_NUMERIC = re.compile(r"[-+]?\d+(?:\.\d+)?")


def _clause(text: str) -> str:
    """``text`` up to the end of its first sentence or clause."""
    m = _SENTENCE_END.search(text)
    return text[: m.start()] if m else text


def _clean(text: str) -> str:
    text = text.replace("\u2212", "-").replace("**", "").replace("`", "").replace("$", "").strip()
    return text.strip(" \t\"'").rstrip(".!:;,").strip(" \t\"'")


def _last_statement(reply: str, numeric: bool) -> str | None:
    """The reading of a reply's last sentence: the value after its last ``=``, else after its last
    " is " / " are " / " equals " (to the end of that clause), else the whole sentence (which, for
    a number, must then hold exactly one). A text answer is read this way only from a one-line
    reply: in a longer one, a last sentence is no more an answer than any other."""
    lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
    if not lines or (not numeric and len(lines) > 1):
        return None
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", lines[-1]) if re.search(r"\w", s)]
    sentence = sentences[-1] if sentences else lines[-1]
    if "=" in sentence:
        return _clause(sentence.rsplit("=", 1)[1])
    parts = re.split(r"\s(?:is|are|equals)\s", sentence)
    return _clause(parts[-1]) if len(parts) > 1 else sentence


def _as_answer(reading: str, oracle: str, numeric: bool, explicit: bool = False) -> str | None:
    """The answer in ``reading``; an ``explicit`` one (a tag's or box's content) is taken as
    written, only trimmed, since a text answer may end in a full stop or hold quotes. A text
    answer read from a sentence has at most two words more than the oracle's: a longer reading
    is a sentence, not an answer."""
    reading = reading.strip() if explicit else _clean(reading)
    if not numeric or not reading:
        if not explicit and len(reading.split()) > len(oracle.split()) + 2:
            return None
        return reading or None
    numbers = _NUMBER.findall(reading)
    return numbers[0].replace(",", "").lstrip("+") if len(numbers) == 1 else None


def final_answer(reply: str, oracle: str, truncated: bool = False) -> str | None:
    """The reply's committed final answer, in the form of the task's ``oracle`` answer (a number
    when the oracle is one), or None when there is none or it is hedged.

    >>> final_answer("5 * 5 = 25\\n\\nThe answer is 25.", "25")
    '25'
    >>> final_answer("The GCD of 255 and 414 is 1.", "3")
    '1'
    >>> final_answer("1. The answer is 1.\\n2. The answer is 2.", "2") is None  # listed: a hedge
    True
    >>> final_answer("The answer is: \\"nus\\"", "uah")
    'nus'
    >>> final_answer("Let me think. 4 + 9 = 1", "13", truncated=True) is None  # cut before committing
    True
    """
    numeric = _NUMERIC.fullmatch(oracle.strip()) is not None
    tags = _TAG.findall(reply)
    if tags:
        return _as_answer(tags[-1], oracle, numeric, explicit=True)
    boxed = _BOXED.findall(reply)
    if boxed:
        return _as_answer(boxed[-1], oracle, numeric, explicit=True)
    stated = [_as_answer(_clause(m.group(1)), oracle, numeric) for m in _STATED.finditer(reply)]
    if stated:
        return stated[-1] if len(set(stated)) == 1 else None
    if truncated:
        return None
    reading = _last_statement(reply, numeric)
    return None if reading is None else _as_answer(reading, oracle, numeric)


def entry_and_scorer(metadata: dict):
    """(the generator's entry, that task's ``score_answer``) for a sample's metadata."""
    from rlvr.data import reasoning_gym as data

    locator = metadata.get("reasoning_gym")
    if isinstance(locator, dict) and "task" in locator:
        dataset = data.task_dataset(locator["task"], json.dumps(locator["config"], sort_keys=True),
                                    locator["level"], locator["seed"], locator["size"])
        return dataset[locator["index"]], dataset.score_answer
    if "task" in metadata and isinstance(metadata.get("entry"), dict):
        data.rg()
        from reasoning_gym import get_score_answer_fn

        return metadata["entry"], get_score_answer_fn(metadata["task"])
    raise ValueError("--rm-type reasoning_gym: the sample's metadata has neither a 'reasoning_gym' locator nor "
                     "'task' and 'entry'; use --prompt-data reasoning_gym:... (docs/tasks.md)")


@inline  # pure CPU and quick once the task's generator is cached
@REWARDS.register("reasoning_gym")
def reasoning_gym_reward(sample: Sample) -> float:
    """The task's own ``score_answer`` on the reply's final answer (``final_answer``).

    >>> from rlvr.data.reasoning_gym import held_out_records, parse_spec
    >>> record = held_out_records(parse_spec("reasoning_gym:products?split=test&size=1"))[0]
    >>> s = Sample("", [], label=record.label, metadata=record.metadata, response=f"The answer is {record.label}.")
    >>> reasoning_gym_reward(s)
    1.0
    """
    entry, score_answer = entry_and_scorer(sample.metadata)
    answer = final_answer(sample.response, str(entry["answer"]), truncated=sample.status == Status.TRUNCATED)
    return float(score_answer(answer, entry))
