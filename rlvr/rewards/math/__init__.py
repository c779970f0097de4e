"""``--rm-type math``: 1.0 when the response's final answer equals the label, else 0.0.

Two layers (rules stated in full in ``docs/rewards.md``):

- **Which text is the final answer** (``math_extract``): the part after ``</think>`` (an unclosed
  ``<think>`` has none); there the last group of ``\\boxed{}``, else a GSM8K ``####`` line, else
  the text after "answer is"/"answer:", else the values of the last sentence when the response
  ends like a finished statement. A response truncated at ``--rollout-max-response-len``
  (``Sample.status == TRUNCATED``) is credited only for an answer completed before the cut, never
  by the last-number fallback.
- **Whether it equals the label** (``math_equiv``): presentation and units removed, scale words
  and percent as values (``--math-percent-policy``), lists / tuples / vectors / interval unions /
  the empty set compared as such, numbers exactly unless the prompt asks for an approximation
  or ``--math-tolerance`` is set, the algebra decided by math-verify.

**Anti-hedging**: a response that states several different final answers gets 0 unless the
label is that very collection: "A, C" or "A or C" for label A, "6 (or 4 if ...)", "either 12
or 15", ``\\pm 3`` for 3. A label that is a single letter A-J (``B``, ``(B)``, ``\\text{(B)}``)
or an option with its content (``(C) 24``) is graded as a multiple-choice letter: exactly one
option letter may be named ("B, not C" names one), case-insensitive; a last line that is only an
option ("**B**", "D)", "Option C: 24") is the final answer; a response that ends by listing the
options commits to none; for ``(C) 24`` the content alone (``\\boxed{24}``) also counts, and
content written next to the letter must be the option's ("Option B: 24" gets 0), and so must a letter
named beside a value ("24, which is option B" gets 0 for ``(C) 24``). Against a label that is only the
value, a reading "(C) 24" is its value 24. A label that is a word or short name ("yes", "parabola") is
also credited by a finished last sentence that ends by naming it ("... so the curve is a parabola."),
and a yes/no label by one that opens with it and restates it ("No, it cannot be done."; "No, or
maybe yes" qualifies it and gets 0). A True/False label is answered by yes/no only where the
prompt's last question is a yes/no question ("Is 91 prime?"); without a prompt, it is not.

Safety: only the last ``MAX_SCAN_CHARS`` of a response are searched; huge powers, towers,
factorials and over-long answers never reach sympy. math-verify enforces its time limits with
``signal.alarm``, which works only in the main thread; elsewhere we call it with its timeouts
off and the grader around every reward call owns the deadline.
"""

from __future__ import annotations

import re

from rlvr.rewards.grader import inline
from rlvr.rewards.math.equiv import (  # noqa: F401  (re-exported: the math grader's public names)
    DEFAULT,
    MAX_ANSWER_CHARS,
    PERCENT_POLICIES,
    MathOptions,
    arity,
    is_equivalent,
    is_unsafe,
    normalize,
)
from rlvr.rewards.math.extract import (  # noqa: F401
    FALLBACK_TAIL,
    MAX_SCAN_CHARS,
    extract_answer,
    final_answers,
    last_boxed,
    split_thinking,
)
from rlvr.rewards.registry import REWARDS
from rlvr.core.types import Sample, Status

__all__ = [  # the math grader's public names, some defined in math_extract / math_equiv
    "DEFAULT", "FALLBACK_TAIL", "MAX_ANSWER_CHARS", "MAX_SCAN_CHARS", "PERCENT_POLICIES", "MathOptions",
    "MathReward", "arity", "choice_letters", "extract_answer", "final_answers", "grade_math", "is_equivalent",
    "is_unsafe", "label_choice", "label_option", "last_boxed", "math_reward", "normalize", "split_thinking",
]

# --- multiple choice ----------------------------------------------------------------------------

_WRAPPERS = re.compile(r"\\(?:textbf|textrm|text|mathrm|mathbf|mbox|operatorname|displaystyle)\s*")
_CHOICE_LABEL = re.compile(r"^\(?([A-J])\)?$")
# A label that is an option with its content: "(C) 24", "C) 24", "C: 24".
_OPTION_LABEL = re.compile(r"^(?:\(([A-J])\)|([A-J])[):.])\s*(\S.*)$")
_SINGLE_LETTER = re.compile(r"\s*\(?([A-Ja-j])\)?[.:]?\s*")
# A letter the response rejects ("B, not C") is not a second answer.
_REJECTED = re.compile(r"\b(?:not|except|rather than|instead of)\s+\(?[A-J]\)?(?![A-Za-z])")
_LETTERS = re.compile(r"\(([A-J])\)|(?<![A-Za-z\\])([A-J]{1,4})(?![A-Za-z])")
_CHOICE_IN_TEXT = re.compile(r"\(([A-J])\)")


def _plain(text: str) -> str:
    return _WRAPPERS.sub("", text).replace("$", "").replace("{", "").replace("}", "")


def choice_letters(answer: str) -> set[str]:
    """The option letters an answer names: ``\\boxed{(B)}`` -> {B}; "A, C", "AC", "B/D" name two.

    >>> sorted(choice_letters("\\\\textbf{(B)} 5")), sorted(choice_letters("A \\\\text{ or } C"))
    (['B'], ['A', 'C'])
    >>> sorted(choice_letters("b"))
    ['B']
    >>> sorted(choice_letters("B, not C")), sorted(choice_letters("AC")), sorted(choice_letters("12"))
    (['B'], ['A', 'C'], [])
    """
    plain = _REJECTED.sub("", _plain(answer))
    single = _SINGLE_LETTER.fullmatch(plain)
    if single:
        return {single.group(1).upper()}
    letters: set[str] = set()
    for m in _LETTERS.finditer(plain):
        token = m.group(1) or m.group(2)
        if token == "I" and re.match(r"\s+[a-z']", plain[m.end() :]):
            continue  # the pronoun: "I think B"
        letters.update(token)
    return letters


def label_choice(label: str) -> str | None:
    """The option letter when ``label`` is a multiple-choice label (``B``, ``(B)``, ``\\text{(B)}``, ``(C) 24``).

    >>> label_choice("(B)"), label_choice("\\\\text{(C)}"), label_choice("e"), label_choice("12"), label_choice("(C) 24")
    ('B', 'C', None, None, 'C')
    """
    option = label_option(label)
    return option[0] if option else None


def label_option(label: str) -> tuple[str, str | None] | None:
    """``(letter, content)`` of a multiple-choice label: ``(B)`` -> ``('B', None)``, ``(C) 24`` -> ``('C', '24')``.

    >>> label_option("(C) 24"), label_option("\\\\text{(D) } 7"), label_option("(A) and (C)"), label_option("(3, 4)")
    (('C', '24'), ('D', '7'), None, None)
    """
    plain = _plain(label).strip()
    m = _CHOICE_LABEL.match(plain)
    if m:
        return m.group(1), None
    m = _OPTION_LABEL.match(plain)
    if m is None or _CHOICE_IN_TEXT.search(m.group(3)):
        return None
    return m.group(1) or m.group(2), m.group(3).strip()


# An option named in a sentence: "(C)", "**C**", "option C", "choice (E)", "the correct option is B".
_NAMED_OPTION = re.compile(
    r"\(([A-J])\)|\*\*\(?([A-J])\)?[.):]?\*\*|\b(?:option|choice)\s+(?:is\s+)?\(?([A-J])\)?(?![A-Za-z])", re.IGNORECASE)
# A last line that commits to one option: "**B**", "D)", "Option C: 24".
_OPTION_LINE = re.compile(r"(?:option|choice)\s+\(?([A-J])\)?(?:\s*[:.)-]\s*\S.*)?", re.IGNORECASE)
_LISTED = re.compile(r"^\s*(?:\*\*)?(?:(?:option|choice)\s+)?\(?[A-J]\s*[).:]", re.IGNORECASE)  # "(B) 18", "Option C: 24"
# A sentence that examines an option rather than choosing it: "Let me check option C: ...".
_EXAMINES = re.compile(r"\b(?:check|try|test|consider|evaluat|examin|look at)\w*", re.IGNORECASE)


def _last_line_option(final: str) -> str | None:
    """The last line when it is nothing but one option: "**B**", "D)", "Option C: 24"; not the end
    of a list of options."""
    lines = [line.strip().strip("*#_> ").rstrip(".") for line in final[-FALLBACK_TAIL:].splitlines() if line.strip()]
    if not lines or _ends_with_list(lines):
        return None
    line = _plain(lines[-1]).strip()
    if _SINGLE_LETTER.fullmatch(line) or _OPTION_LINE.fullmatch(line):
        return line
    return None


def _ends_with_list(lines: list[str]) -> bool:
    return len(lines) >= 2 and all(_LISTED.match(line) for line in lines[-2:])


def _choice_readings(response: str, truncated: bool) -> list[str]:
    _, final = split_thinking(response)
    committed = None if final is None or truncated else _last_line_option(final)
    if committed:
        return [committed]
    found = final_answers(response, truncated, fallback=False)
    if found:
        return found
    if final is None or truncated:
        return []
    tail = final[-FALLBACK_TAIL:].rstrip()
    if _ends_with_list([line for line in tail.splitlines() if line.strip()]):
        return []  # the response ends by listing the options: no commitment
    last = _REJECTED.sub("", re.split(r"(?<=[.!?])\s+|\n", tail.rstrip(".!"))[-1])
    named = _NAMED_OPTION.finditer(last) if not _EXAMINES.search(last) else _CHOICE_IN_TEXT.finditer(last)
    letters = [next(g for g in m.groups() if g) for m in named]
    letters = letters or _CHOICE_IN_TEXT.findall(tail)[-1:]
    return [", ".join(letter.upper() for letter in letters)] if letters else []


def _names_option(reading: str, letter: str, content: str | None, opts: MathOptions) -> bool:
    """Whether one reading commits to the label's option: its letter alone (any content it adds must be
    the option's), or, for a label with content, that content without a letter (``\\boxed{24}`` for ``(C) 24``)."""
    letters = choice_letters(reading)
    if not letters:
        return content is not None and is_equivalent(reading.strip(), content, opts)
    if letters != {letter}:
        return False
    rest = re.sub(r"^.*?\(?(?<![A-Za-z])[A-J]\)?(?![A-Za-z])\s*[:.)-]?\s*", "", _plain(reading), count=1).strip()
    return content is None or not re.search(r"\d", rest) or is_equivalent(rest, content, opts)


# --- a value given with its option letter, against a label that is the value ------------------

# "(C) 24", "C) 24", "**(C)** 24": one option letter in front of the value.
_LETTER_THEN_VALUE = re.compile(r"^\s*(?:\(([A-J])\)|([A-J])\))\s*[:.-]?\s*(\S.*)$")


def _without_option_letter(reading: str) -> str | None:
    """The value of a reading that is one option letter followed by it ("(C) 24" -> "24"), else None.

    >>> _without_option_letter("(C) 24"), _without_option_letter("(a) 3, (b) 4"), _without_option_letter("24")
    ('24', None, None)
    """
    m = _LETTER_THEN_VALUE.match(_plain(reading).replace("*", ""))
    if m is None or re.search(r"\(\s*[A-Ja-j]\s*\)|\b[A-J]\)", m.group(3)):
        return None  # not one option: "(A) 3 (B) 4" lists options
    return m.group(3).strip()


# --- answers in words: "yes", "no", the name of a curve or shape ---------------------------------

_NAME = r"[A-Za-z][A-Za-z'-]*(?: [A-Za-z][A-Za-z'-]*){0,2}"  # "parabola", "yes", "right triangle"
_WORD_LABEL = re.compile(_NAME)
# The last sentence names one thing: "So the curve is a parabola.", "The shape formed is an ellipse."
_NAMED_THING = re.compile(rf"\b(?:is|are|was|forms?|makes?|gives?)\s+(?:(?:a|an|the)\s+)?({_NAME})$", re.IGNORECASE)


# A sentence that asks, supposes or doubts names nothing: "check whether ... is a parabola".
_TENTATIVE = re.compile(r"\b(?:if|whether|check\w*|determine|decide|suppose|assum\w*|let|could|might|may|would|"
                        r"maybe|perhaps|possibly|probably|likely|not|either|or)\b", re.IGNORECASE)


def word_label(label: str) -> str | None:
    """The label in lower case when it is a word or a short name ("yes", "\\\\text{parabola}", "right triangle").

    >>> word_label("\\\\text{Parabola}"), word_label("yes"), word_label("12"), word_label("x + 1")
    ('parabola', 'yes', None, None)
    """
    plain = re.sub(r"\s+", " ", _plain(label)).strip().rstrip(".")
    return plain.lower() if _WORD_LABEL.fullmatch(plain) and label_option(label) is None else None


# The last question of a prompt: from the start of its sentence or line to its "?".
_QUESTION = re.compile(r"[^.!?\n]*\?")
_AUXILIARY = r"(?:is|are|was|were|am|do|does|did|can|could|will|would|shall|should|may|might|must|has|have|had)"
# A yes/no question opens with an auxiliary verb, at its start or after a comma ("If n is even, is n^2 even?"),
# does not open with a question word, and offers no alternatives ("Is 91 prime or composite?"; "or not" is none).
_YES_NO_QUESTION = re.compile(
    rf"(?!\s*(?:how|what|which|who|whom|whose|when|where|why)\b)(?:\s*|.*,\s*){_AUXILIARY}\b(?!.*\bor\b(?!\s+not\b))",
    re.IGNORECASE | re.DOTALL)
_YES_NO_OF = {"true": "yes", "false": "no"}


def asks_yes_no(prompt: str) -> bool:
    """Whether the prompt's last question is a yes/no question ("Is 91 prime?"); False without a question.

    >>> asks_yes_no("Is 91 prime?"), asks_yes_no("If n is even, is n^2 even? Explain."), asks_yes_no("")
    (True, True, False)
    >>> asks_yes_no("Is 91 prime or composite?"), asks_yes_no("How many primes are there, are they odd?")
    (False, False)
    """
    questions = _QUESTION.findall(prompt or "")
    return bool(questions) and _YES_NO_QUESTION.match(questions[-1]) is not None


def label_words(label: str, prompt: str) -> set[str]:
    """The words that answer with ``label`` (``word_label``), and for a True/False label the yes or no
    that answers the same yes/no question: True is "yes" only where the prompt asks a yes/no question.

    >>> sorted(label_words("\\\\text{No}", "")), sorted(label_words("True", "Is 7 prime?")), sorted(label_words("True", ""))
    (['no'], ['true', 'yes'], ['true'])
    """
    word = word_label(label)
    if word is None:
        return set()
    return {word, _YES_NO_OF[word]} if word in _YES_NO_OF and asks_yes_no(prompt) else {word}


# A sentence that opens with yes or no and then a comma, full stop, colon or dash: "No, it cannot be done."
_OPENS_YES_NO = re.compile(r"(yes|no)(?:\s*[,.!:;]|\s+[-—–]\s|$)", re.IGNORECASE)
# What follows the yes or no qualifies or withdraws it instead of restating it: a second answer ("yes, no"),
# an alternative, a condition, doubt or a correction ("No, or maybe yes", "Yes, if n is even", "No, wait").
_QUALIFIED = re.compile(
    r"^\W*no\b|\b(?:yes|or|either|if|unless|but|whether|depend\w*|maybe|perhaps|possibly|probably|likely|might|"
    r"not sure|unsure|unclear|wait|actually|hmm|let|check\w*|suppose|assum\w*)\b", re.IGNORECASE)


def _yes_no(sentence: str) -> str | None:
    """"yes" or "no" when ``sentence`` opens with it and the rest restates it, else None.

    >>> _yes_no("No, it cannot be done"), _yes_no("Yes"), _yes_no("No, or maybe yes"), _yes_no("Yes, no, maybe")
    ('no', 'yes', None, None)
    >>> _yes_no("No one can do it"), _yes_no("Yes, if n is even"), _yes_no("No, it is not possible")
    (None, None, 'no')
    """
    m = _OPENS_YES_NO.match(sentence)
    if m is None or _QUALIFIED.search(sentence[m.end(1) :]):
        return None
    return m.group(1).lower()


def named_in_last_sentence(response: str, truncated: bool) -> str | None:
    """The word or short name that a finished response ends by stating ("... the curve is a parabola.",
    or a last sentence that opens with yes or no: "No, it cannot be done."), in lower case; None for a
    cut response, a question, a list, a hedge or a negation ("is not a", "is either", "No, or maybe yes").

    >>> named_in_last_sentence("Since B^2 - 4AC = 0, the curve is a parabola.", False)
    'parabola'
    >>> named_in_last_sentence("It is a circle, ellipse, or parabola.", False) is None
    True
    >>> named_in_last_sentence("Removing them leaves unequal colors.\\n\\n**No**, it cannot be done.", False)
    'no'
    >>> named_in_last_sentence("No?", False), named_in_last_sentence("No, it cannot be done.", True)
    (None, None)
    """
    _, final = split_thinking(response)
    if final is None or truncated:
        return None
    tail = final[-FALLBACK_TAIL:].rstrip().rstrip("*").rstrip()
    if not tail.endswith((".", "!")):
        return None
    sentence = re.split(r"(?<=[.!?])\s+|\n", tail.rstrip(".!").rstrip())[-1]
    plain = _plain(sentence.replace("*", "")).strip()
    if _OPENS_YES_NO.match(plain):
        return _yes_no(plain)
    if _TENTATIVE.search(sentence):
        return None  # "Let me check whether the curve is a parabola.": a question, not an answer
    m = _NAMED_THING.search(_plain(sentence.replace("*", "")).strip())
    return m.group(1).lower() if m else None


# --- the reward ---------------------------------------------------------------------------------

# The prompt asks for an approximate answer: then a rounded decimal is what it wants.
_ASKS_APPROXIMATION = re.compile(
    r"\b(?:round(?:ed)?|nearest|decimal places?|significant (?:figures|digits)|approximate(?:ly)?|"
    r"estimate|to \w+ decimal)\b",
    re.IGNORECASE,
)


def _letters_beside(response: str) -> set[str]:
    """The option letters that the last sentence names beside a value ("24, which is option C" -> {C})."""
    _, final = split_thinking(response)
    if final is None:
        return set()
    sentence = re.split(r"(?<=[.!?])\s+|\n", final[-FALLBACK_TAIL:].strip().rstrip(".!").rstrip())[-1]
    sentence = _REJECTED.sub("", _plain(sentence))
    first = _NAMED_OPTION.search(sentence)
    return choice_letters(sentence[first.start():]) if first else set()  # "option C or D" names two


def _grade_choice(response: str, truncated: bool, letter: str, content: str | None, opts: MathOptions) -> float:
    """A multiple-choice label: the readings must name its option (see ``_names_option``)."""
    readings = _choice_readings(response, truncated)
    named = named_in_last_sentence(response, truncated) if content and not readings else None
    readings = readings or ([named] if named else [])  # "... the curve is a parabola." for "(C) parabola"
    if readings and not any(choice_letters(r) for r in readings) and not truncated:
        beside = _letters_beside(response)  # "The answer is 24, which is option C.": letter and value
        if beside and beside != {letter}:
            return 0.0  # the value and the letter disagree, or two letters
        if beside and content is None:
            return 1.0
    return 1.0 if any(_names_option(r, letter, content, opts) for r in readings) else 0.0


def grade_math(sample: Sample, opts: MathOptions = DEFAULT) -> float:
    """1.0 when the final answer of ``sample.response`` equals ``sample.label``, else 0.0."""
    if sample.label is None or str(sample.label).strip() == "":
        raise ValueError("math reward needs a non-empty label per sample (--label-key names its field)")
    label = str(sample.label)
    truncated = sample.status == Status.TRUNCATED
    option = label_option(label)
    if option is not None:
        return _grade_choice(sample.response, truncated, *option, opts)
    if opts.tolerance == 0 and _ASKS_APPROXIMATION.search(sample.prompt or ""):
        opts = MathOptions(opts.percent_policy, opts.tolerance, approximate=True)
    readings = final_answers(sample.response, truncated, arity(label))
    if any(is_equivalent(r.strip(), label, opts) for r in readings):
        return 1.0
    values = [v for v in map(_without_option_letter, readings) if v]  # "(C) 24" for the label 24
    if any(is_equivalent(v, label, opts) for v in values):
        return 1.0
    words = label_words(label, sample.prompt)  # "... the curve is a parabola." for parabola; "No, it cannot."
    if not words:
        return 0.0
    committed = final_answers(sample.response, truncated, fallback=False)
    if committed:  # a box or marker committed to an answer: it is the answer ("The answer is yes." for True)
        return 1.0 if any(word_label(r) in words for r in committed) else 0.0
    return 1.0 if named_in_last_sentence(sample.response, truncated) in words else 0.0


@inline  # cheap pure CPU: runs on the event-loop thread, where math-verify's alarm works
def math_reward(sample: Sample) -> float:
    """``grade_math`` with the default options (``--math-percent-policy value``, exact numbers).

    >>> from rlvr.core.types import Sample, Status
    >>> math_reward(Sample(prompt="", prompt_ids=[], label="0.5", response="so \\\\boxed{\\\\frac12}"))
    1.0
    >>> math_reward(Sample("", [], label="A", response="The answer is \\\\boxed{A, C}."))
    0.0
    >>> math_reward(Sample("", [], label="42", response="6 * 7 = 42. Next we", status=Status.TRUNCATED))
    0.0
    """
    return grade_math(sample)


@REWARDS.register("math")
class MathReward:
    """``--rm-type math`` built with the reward config (percent policy, tolerance)."""

    inline = True  # the grader runs it on the event-loop thread (see ``grader.inline``)

    def __init__(self, cfg):
        self.opts = MathOptions(cfg.math_percent_policy, cfg.math_tolerance)

    def __call__(self, sample: Sample) -> float:
        return grade_math(sample, self.opts)

