"""QA and structure rewards: ``f1``, ``exact_match`` (SQuAD's normalisation) and ``format``.

The answer is read from the response the way the math reward reads it: the last ``\\boxed{}``,
else the text of an ``<answer>...</answer>`` block, else what follows the last "answer is" /
"Answer:", else the whole response. The label is one reference answer or a list of them; the
best match counts (as in SQuAD's evaluation script).

Normalisation (SQuAD v1.1): lower-case, drop punctuation, drop the articles a/an/the, collapse
whitespace.
"""

from __future__ import annotations

import collections
import re
import string

from rlvr.rewards.grader import inline
from rlvr.rewards.registry import REWARDS
from rlvr.core.types import Sample

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_IS = re.compile(r"(?:answer is|answer:)\s*(.+)", re.IGNORECASE | re.DOTALL)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation.

    >>> normalize_answer("The  Eiffel-Tower!")
    'eiffeltower'
    >>> normalize_answer("an apple, a day")
    'apple day'
    """
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def extract_qa_answer(response: str) -> str:
    """The answer part of a free-text response.

    >>> extract_qa_answer("I think... The answer is Paris.")
    'Paris.'
    >>> extract_qa_answer("<think>hmm</think><answer> Paris </answer>")
    'Paris'
    """
    from rlvr.rewards.math import last_boxed

    boxed = last_boxed(response)
    if boxed is not None:
        return boxed.strip()
    tags = _ANSWER_TAG.findall(response)
    if tags:
        return tags[-1].strip()
    matches = list(_ANSWER_IS.finditer(response))
    if matches:
        return matches[-1].group(1).strip().splitlines()[0].strip()
    return response.strip()


def _references(label) -> list[str]:
    if label is None:
        raise ValueError("QA reward needs a label: the reference answer or a list of them (--label-key)")
    refs = [str(x) for x in label] if isinstance(label, (list, tuple)) else [str(label)]
    if not refs:
        raise ValueError("QA reward got an empty list of reference answers")
    return refs


def f1_score(prediction: str, reference: str) -> float:
    """Token-level F1 between normalised strings.

    >>> f1_score("the cat sat", "a cat sat down")
    0.8
    >>> f1_score("", "")
    1.0
    """
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


@inline
@REWARDS.register("f1")
def f1_reward(sample: Sample) -> float:
    answer = extract_qa_answer(sample.response)
    return max(f1_score(answer, ref) for ref in _references(sample.label))


@inline
@REWARDS.register("exact_match")
def exact_match_reward(sample: Sample) -> float:
    """
    >>> exact_match_reward(Sample("", [], label=["Paris", "City of Paris"], response="Answer: paris."))
    1.0
    """
    answer = normalize_answer(extract_qa_answer(sample.response))
    return float(any(answer == normalize_answer(ref) for ref in _references(sample.label)))


_FORMAT = re.compile(r"^\s*<think>(?:(?!</?think>).)*</think>\s*<answer>(?:(?!</?answer>).)*</answer>\s*$", re.DOTALL)


@inline
@REWARDS.register("format")
def format_reward(sample: Sample) -> float:
    """1.0 when the response is exactly ``<think>...</think><answer>...</answer>`` (whitespace
    allowed between and around), else 0.0. Combine with a correctness reward:
    ``--rm-type math=0.9,format=0.1``.

    >>> format_reward(Sample("", [], response="<think>2+2</think>\\n<answer>4</answer>"))
    1.0
    >>> format_reward(Sample("", [], response="<think>a</think><answer>4</answer> extra"))
    0.0
    """
    return 1.0 if _FORMAT.match(sample.response) else 0.0
