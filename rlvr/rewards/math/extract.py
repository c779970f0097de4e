"""Final-answer selection for ``--rm-type math``: which text of a response is its final answer.

Rules, in order (``docs/rewards.md`` states them for users):

1. **Thinking.** With ``</think>``, the final answer is looked for after the last ``</think>``;
   only when nothing there is an answer, a box or "answer is" *inside* the thinking is used
   (a model that put its answer in the thinking and wrote nothing after). A ``<think>`` that is
   never closed means the model never finished: no final answer.
2. **Where.** In that part, the first of these that exists: the last group of ``\\boxed{}``; the
   last closed ``<answer>...</answer>``; the last GSM8K ``#### x`` line; the text after the last
   "answer is" / "answer:" marker, cut at the end of its sentence; the values of the final
   statement (last sentence) when the response ends like a finished statement.
3. **Groups, not hedges, are combined.** Boxes separated only by connectors ("," "and" "or"
   ``x =``) form one answer that lists values (``x = \\boxed{2}`` or ``x = \\boxed{-3}``); boxes
   in different sentences are a correction and the last one counts. When the label lists ``k``
   values and the last group has fewer, the last ``k`` boxes are offered as a second reading
   (``(a) \\boxed{12}. (b) \\boxed{7}.``). An alternative written right after the answer
   ("6 (or 4 if ...)", "100, or maybe 120") is appended with "or": the equivalence layer then
   sees several candidates and gives credit only when they all are the label (anti-hedging).
   "or about 0.67" / "or equivalently" annotate the answer and are not alternatives.
4. **Truncation.** A response cut at the length limit (``truncated=True``) is credited only for a
   final answer completed before the cut: a closed box, a ``####`` or marker answer followed by
   more text. The last-number fallback is never used for it.
5. **No final statement, no answer.** The last-number fallback reads only the last sentence,
   and only when the response ends like a finished statement (a period, a number, a closed math
   span); reasoning that stops mid-sentence ("... so 3x = 15 and") has no final answer however
   many numbers it contains. The final statement's value may be a set of reals in words ("... is
   all real numbers except $x = 2$"), a plain-text expression that ends it ("... simplifies to
   (x + 1)/x", with a variable or function; "4 x 6 = 24" is arithmetic), a number with an
   ellipsis or a modulus ("0.1666...", "3 (mod 7)"), a number and the unit word after it
   ("350 cents"), or, when it has no digits, a number in words ("... twelve apples left";
   not the pronoun in "each one").

Everything here is string work on the response; what counts as *equal* is ``math_equiv``.
"""

from __future__ import annotations

import re

from rlvr.rewards.math.units import DEGREE_MARK, UNIT_WORDS
from rlvr.rewards.math.words import (
    set_phrase_at,
    spell_numbers,
    words_to_number,
    words_to_set,
)

MAX_SCAN_CHARS = 20_000  # markers and boxes are searched in this tail of the response
FALLBACK_TAIL = 300  # the final statement is read only in this tail
ALT = " \\text{ or } "  # how candidates that a response offers side by side are joined

_END_TOKENS = re.compile(r"(?:\s|<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>|</s>|<eos>)+$")
_BOX = re.compile(r"\\(?:boxed|fbox)\s*(\{|[^\s{\\$])")
_MARKER = re.compile(r"\banswer\b\s*(?:is\b\s*:?|:|=)[\s*]*", re.IGNORECASE)
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
# A number of a final statement: "1,250", "3 1/2", "25%", "0.1666\ldots" (with the adverb that makes it
# approximate, "approximately 0.333\ldots"), "3 (mod 7)".
_NUMBER = re.compile(
    r"(?:(?:approximately|about|roughly|around|nearly|≈)\s*(?=-?\d*\.\d+\\ldots))?"
    r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:\s+\d+/\d+|/\d+)?%?(?:\\ldots)?(?:\s*\(\s*mod\s+\d+\s*\))?"
)
_ELLIPSIS_AFTER_DECIMAL = re.compile(r"(\d\.\d+)\s*(?:\.{3}|…)")
_UNIT_NAMES = "|".join(sorted(UNIT_WORDS, key=len, reverse=True))
# A unit right after the last number of a final statement, a mark or a unit word ("90°", "40¢", "350 cents"):
# math_units converts it. A degree mark before C or F is a temperature ("30°C") and stays out.
_UNIT_AFTER = re.compile(rf"\s*({DEGREE_MARK}|¢)(?!\s*(?:\\text\s*\{{\s*)?[CF]\b)|\s+({_UNIT_NAMES})\b", re.IGNORECASE)
# The unit of the value before a gap ("80° or 90°", "50 cents and 40 cents"): no part of the connector's text.
_UNIT_IN_GAP = re.compile(rf"^\s*(?:{DEGREE_MARK}|¢|(?:{_UNIT_NAMES})\b)", re.IGNORECASE)
_ENDS_IN_DEGREES = re.compile(rf"\d\s*{DEGREE_MARK}$")
# Where an answer after a marker stops: a sentence end, a new line, or an explanation.
_SENTENCE_END = re.compile(  # an ellipsis ("0.1666...") and "(mod 7)" do not end the answer
    r"(?<!\.)\.(?:\s|$)|\n|;|,\s+(?=[a-z]{2,})|\s+\((?!\w\)|\s*mod\b)|"
    r"\s+(?:because|since|which|as|where|so|but|depending|if|when|assuming)\b"
)
# An explanation clause in a final statement: what follows it is not the answer.
_CLAUSE = re.compile(r",?\s+(?:because|since|which|as|where|depending|if|when|assuming|given|for)\b")
# An alternative offered right after an answer: "(or 4 if ...)", ", or maybe 120", "(possibly 8)",
# ", but it might be 8".
_ALTERNATIVE = re.compile(
    r"^\s*\$?\s*[,;]?\s*\(?\s*(?:or|possibly|maybe|perhaps|alternatively|"
    r"(?:but|though|although)?\s*(?:it|this|that)?\s*(?:might|could|may)\s+(?:also\s+)?be)\b[\s,]*"
    r"(?:maybe|possibly|perhaps|else)?\s*"
    r"(?!(?:equivalently|about|approximately|roughly|around|simplified|written|expressed|in\b|as\b|equal|i\.e))",
    re.IGNORECASE,
)
# "..., though D is also possible": a second candidate named after the answer.
_ALSO_POSSIBLE = re.compile(
    r"^\s*\$?\s*[,;]?\s*\(?\s*(?:but|though|although|and|or)\s+(?=\S{1,40}?\s+(?:is|are|could be|might be|may be|"
    r"would be|seems)\s+(?:also\s+)?(?:possible|correct|valid|right|plausible|an option))",
    re.IGNORECASE,
)
# Text allowed between two boxes (or two values of a final statement) of one answer.
_CONNECTOR = re.compile(r"(?:,|;|&|and|or|either|both|[A-Za-z]\w{0,2}(?:_\{?\w+\}?)?(?:=|\\in))*")
_GAP_NOISE = re.compile(r"\$|\\[()\[\]]|\\q?quad|\\[,;:! ]|\\\\|[\s()]|\\text\s*\{|\\mathrm\s*\{|\}|\{")


def _balanced(text: str, open_at: int) -> tuple[str, int]:
    """The contents of the brace group opening at ``text[open_at]`` and the index after it.

    An unclosed group runs to the end of the text (a response cut off mid-answer).

    >>> _balanced("{a{b}c}d", 0)
    ('a{b}c', 7)
    >>> _balanced("{\\\\frac{1}{2}", 0)
    ('\\\\frac{1}{2}', 12)
    """
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : j], j + 1
    return text[open_at + 1 :], len(text)


def boxes(text: str) -> list[tuple[int, int, str, bool]]:
    """Every ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed 5``: (start, end, contents, closed).

    >>> [b[2:] for b in boxes("\\\\boxed{1} and \\\\boxed 2 and \\\\boxed{3")]
    [('1', True), ('2', True), ('3', False)]
    """
    found, pos = [], 0
    while True:
        m = _BOX.search(text, pos)
        if m is None:
            return found
        if m.group(1) != "{":  # \boxed 5: one token, as TeX reads it
            found.append((m.start(), m.end(), m.group(1), True))
            pos = m.end()
            continue
        inner, end = _balanced(text, m.start(1))
        closed = end == m.start(1) + len(inner) + 2
        found.append((m.start(), end, inner, closed))
        pos = end


def last_boxed(text: str, strict: bool = False) -> str | None:
    """The contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``) in ``text``.

    ``strict`` accepts only a closed ``\\boxed{...}`` (as slime's deepscaler grader does).

    >>> last_boxed("\\\\boxed{1} then \\\\boxed{\\\\frac{2}{3}}.")
    '\\\\frac{2}{3}'
    >>> last_boxed("\\\\boxed 5"), last_boxed("\\\\fbox{9}"), last_boxed("\\\\fbox{9}", strict=True)
    ('5', '9', None)
    >>> last_boxed("\\\\boxed{\\\\frac{1}{2}"), last_boxed("\\\\boxed{\\\\frac{1}{2}", strict=True)
    ('\\\\frac{1}{2}', None)
    """
    found = boxes(text)
    if not found:
        return None
    start, _, inner, closed = found[-1]
    if strict and (not closed or not text.startswith("\\boxed{", start)):
        return None
    return inner


def split_thinking(text: str) -> tuple[str, str | None]:
    """``(thinking, final part)``; the final part is None when a ``<think>`` was never closed.

    >>> split_thinking("<think>a</think> b"), split_thinking("a</think>b"), split_thinking("<think>a")
    (('<think>a', ' b'), ('a', 'b'), ('', None))
    >>> split_thinking("no tags")
    ('', 'no tags')
    """
    if "</think>" in text:
        thinking, _, final = text.rpartition("</think>")
        return thinking, final
    if "<think>" in text:
        return "", None
    return "", text


def is_connector(gap: str) -> bool:
    """Whether ``gap`` only joins two values of one answer (",", "and", "or", ``x =``, math marks).

    >>> is_connector("$ or $x = "), is_connector(", "), is_connector(".\\n(b) The second is ")
    (True, True, False)
    >>> is_connector("° or "), is_connector(" cents and "), is_connector("° / 4 = **")
    (True, True, False)
    """
    gap = _UNIT_IN_GAP.sub("", gap, count=1)  # "° or ", " cents and ": the first value's unit, then the connector
    return len(gap) <= 40 and _CONNECTOR.fullmatch(_GAP_NOISE.sub("", gap)) is not None


def _join(values: list[str], gaps: list[str]) -> str:
    """Values of one answer as one string; "or" between them when any gap said "or"."""
    if len(values) == 1:
        return values[0]
    hedged = any(re.search(r"\bor\b", g) for g in gaps)
    return (ALT if hedged else ", ").join(v.strip() for v in values)


def _alternative(rest: str) -> str | None:
    """The alternative answer offered right after an answer ("(or 4 if ...)"), or None.

    >>> _alternative(" (or 4 if order matters)"), _alternative(", or maybe 120."), _alternative(", or about 0.67")
    ('4', '120', None)
    """
    m = _ALTERNATIVE.match(rest[:200]) or _ALSO_POSSIBLE.match(rest[:200])
    if m is None:
        return None
    tail = re.sub(r"^(?:just|only|simply|even)\s+", "", rest[m.end() : m.end() + 120])
    tail = spell_numbers(tail)  # ", or maybe twenty-two": a number in words is an alternative too
    box = boxes(tail)
    if box and box[0][0] < 5:
        return box[0][2].strip()
    span = _MATH_SPAN.match(tail)
    if span:
        return next(g for g in span.groups() if g is not None).strip()
    value = re.match(r"\(?([A-J])\)?(?![A-Za-z])|-?\d+(?:\.\d+)?(?:/\d+)?", tail)
    return (value.group(1) or value.group()) if value else None


def _span_text(m: re.Match) -> str:
    return next(g for g in m.groups() if g is not None).strip()


# A later sentence that withdraws the answer: "The answer is 7. Actually, wait, it is 8."
_CORRECTION = re.compile(
    r"\b(?:actually|wait|correction|oops|i made (?:a|an) (?:mistake|error)|that'?s (?:wrong|incorrect)|"
    r"let me (?:redo|correct|recompute))\b",
    re.IGNORECASE,
)


def _with_alternative(answer: str, rest: str) -> str:
    """``answer``, replaced by a correction that follows it, joined with an offered alternative.

    >>> _with_alternative("7", ". Actually, wait, it is 8."), _with_alternative("7", ". Wait, let me verify.")
    ('8', '7')
    """
    corrections = list(_CORRECTION.finditer(rest))
    if corrections:  # the last sentence with a correction cue, if it states a value, is the answer
        sentence = re.split(r"(?<=[.!?])\s+|\n", rest[corrections[-1].start() :].strip())[0]
        corrected = _final_statement(sentence) if _ends_a_statement(sentence) else None
        if corrected:
            return corrected
    alt = _alternative(rest)
    return answer if alt is None else answer + ALT + alt


def _from_boxes(text: str, truncated: bool, label_parts: int) -> list[str] | None:
    found = [b for b in boxes(text) if b[3] or not truncated]  # a cut box was never finished
    if not found:
        return None
    group = [found[-1]]
    gaps: list[str] = []
    for prev in reversed(found[:-1]):
        gap = text[prev[1] : group[0][0]]
        if not is_connector(gap):
            break
        group.insert(0, prev)
        gaps.insert(0, gap)
    answer = _with_alternative(_join([b[2] for b in group], gaps), text[group[-1][1] :])
    readings = [answer]
    if label_parts > len(group) and len(found) >= label_parts:  # "(a) \boxed{12}. (b) \boxed{7}."
        readings.append(", ".join(b[2].strip() for b in found[-label_parts:]))
    return readings


def _after_marker(text: str, truncated: bool) -> str | None:
    """The answer after the last "answer is" / "answer:" marker; None if absent (or cut off).

    >>> _after_marker("The answer is 42. Let me double check: 6*7=42.", False)
    '42'
    >>> _after_marker("Answer: 2/3, or about 0.67.", False)
    '2/3'
    >>> _after_marker("The answer is 6 (or 4 if order matters).", False)
    '6 \\\\text{ or } 4'
    >>> _after_marker("So the answer is 12", True) is None
    True
    """
    marks = list(_MARKER.finditer(text))
    if not marks:
        return None
    start = marks[-1].end() + len(text[marks[-1].end() :]) - len(text[marks[-1].end() :].lstrip())
    rest = text[start:]
    span = _MATH_SPAN.match(rest)
    if span:  # a closed math span is a completed answer; "$m = 2$, $n = 5$" is one answer
        values, gaps, tail = [_span_text(span)], [], rest[span.end() :]
        while (more := _MATH_SPAN.search(tail, 0, 200)) and is_connector(tail[: more.start()]):
            values.append(_span_text(more))
            gaps.append(tail[: more.start()])
            tail = tail[more.end() :]
        return _with_alternative(_join(values, gaps), tail)
    if rest.startswith("$") or rest.startswith("\\("):  # an unclosed math span: up to the line end
        if truncated:
            return None
        return rest.lstrip("$").removeprefix("\\(").split("\n")[0].strip().rstrip(".") or None
    end = _SENTENCE_END.search(rest)
    if end is None and truncated:
        return None  # "So the answer is 12" at the cut may have been "120"
    answer = (rest[: end.start()] if end else rest).strip().strip("*").strip()
    if len(answer.split()) >= 3 and not re.search(r"[\d\\$]", answer) and not _in_words(answer):
        return None  # "the answer: it must be even" is prose, not an answer
    if not answer:
        return None
    return _with_alternative(answer, rest[end.start() :]) if end else answer


def _in_words(answer: str) -> bool:
    """Whether ``answer`` is a number or a set of reals written in words ("one hundred twenty")."""
    return words_to_number(answer) is not None or words_to_set(answer) is not None


def _after_hashes(text: str, truncated: bool) -> str | None:
    marks = list(_HASHES.finditer(text))
    if not marks:
        return None
    m = marks[-1]
    if truncated and m.end() == len(text):
        return None  # "#### 18" at the cut may have been "#### 180"
    return m.group(1).strip() or None


# Words a sentence cannot end on: text that stops on one was cut or abandoned mid-thought.
_DANGLING = frozenset(
    "and or so then but to the a an of by is are was were be we it if with for from in on at as that "
    "this which let need into than plus minus times over get gives equals because since".split()
)


def _ends_a_statement(text: str) -> bool:
    """Whether ``text`` ends like a finished statement: a full stop, a number or closed math, or
    a number followed by a few unit words ("so 7 people"); not "... 3x = 15 and".

    >>> _ends_a_statement("So 23 marbles."), _ends_a_statement("so 7 people"), _ends_a_statement("3x = 15 and")
    (True, True, False)
    >>> _ends_a_statement("So x = 90°"), _ends_a_statement("so the angle is 90^\\\\circ"), _ends_a_statement("So x = 90°?")
    (True, True, False)
    """
    tail = text.rstrip("*").rstrip()
    if not tail:
        return False
    if tail[-1] in ".!$}])0123456789…" or tail.endswith("\\)") or tail.endswith("\\]") or _ENDS_IN_DEGREES.search(tail):
        return True  # a full stop, a number, closed math, or a number with its degree mark ("So x = 90°")
    if re.search(r"[-+*/^]\s*[A-Za-z]$", tail):
        return True  # an expression that ends in a variable: "... simplifies to (x + 1)/x"
    words = re.match(r".*\d((?:\s+[A-Za-z]+){1,3})$", tail[-80:], re.DOTALL)
    return bool(words) and not any(w.lower() in _DANGLING for w in words.group(1).split())


def _last_sentence(text: str) -> str:
    """The last sentence of ``text``: after the last sentence end that is outside math spans."""
    spans = [(m.start(), m.end()) for m in _MATH_SPAN.finditer(text)]
    body = text.rstrip().rstrip("*.!").rstrip()
    cut = 0
    for m in re.finditer(r"[.!?](?=\s)|\n", body):
        if not any(a <= m.start() < b for a, b in spans):
            cut = m.end()
    return body[cut:].strip()


def _final_statement(text: str) -> str | None:
    """The value(s) the last sentence states, when the response ends like a finished statement.

    >>> _final_statement("So he needs 11 more boxes, because each box holds 12.")
    '11'
    >>> _final_statement("The answer could be 3, 5, or 7.")
    '3, 5, or 7'
    >>> _final_statement("Then 12 + 5 = 17. Now we need to divide by") is None
    True
    >>> [_final_statement(t) for t in ("So the total is twelve.", "So x ≡ 3 (mod 7).", "It is 1/6 = 0.1666...")]
    ['12', '3 (mod 7)', '0.1666\\\\ldots']
    >>> _final_statement("It simplifies to (x + 1)/x."), _final_statement("So the domain is all real numbers except 2.")
    ('(x + 1)/x', 'all real numbers except 2')
    """
    tail = text[-FALLBACK_TAIL:]
    if not _ends_a_statement(tail):
        return None
    sentence = _last_sentence(_ELLIPSIS_AFTER_DECIMAL.sub(r"\1\\ldots", tail))
    in_words = _set_in_words(sentence)
    if in_words:
        return in_words
    clause = _CLAUSE.search(sentence)
    if clause and re.search(r"\d|\$|\\", sentence[: clause.start()]):
        sentence = sentence[: clause.start()]
    expression = _plain_expression(sentence)
    if expression:
        return expression
    values = _values(sentence)
    if not values:  # no digits: a number in words ("So she has twelve apples left.")
        sentence = spell_numbers(sentence, keep=_counts, plain=True)
        values = _values(sentence)
    if not values:
        if re.search(r"\bno (?:real )?(?:solutions?|roots?)\b", sentence, re.IGNORECASE):
            return "\\text{no solution}"
        return None
    return _stated(sentence, values)


def _values(sentence: str) -> list[tuple[int, int]]:
    """Where the math spans and the numbers outside them are in ``sentence``, in order."""
    spans = [(m.start(), m.end()) for m in _MATH_SPAN.finditer(sentence)]
    numbers = [(m.start(), m.end()) for m in _NUMBER.finditer(sentence)
               if not any(a <= m.start() < b for a, b in spans)]
    return sorted(spans + numbers)


def _stated(sentence: str, values: list[tuple[int, int]]) -> str:
    """The last value of the sentence, or its last values joined by connectors (a list or a hedge)."""
    first = len(values) - 1
    while first > 0 and is_connector(sentence[values[first - 1][1] : values[first][0]]):
        first -= 1
    if first < len(values) - 1:  # several values joined by connectors: a list (or a hedge)
        found = sentence[values[first][0] : values[-1][1]]
        return found.replace("$", "").replace("\\(", "").replace("\\)", "").strip()
    a, b = values[-1]
    span = _MATH_SPAN.fullmatch(sentence[a:b])
    if span:
        return next(g for g in span.groups() if g is not None).strip()
    unit = _UNIT_AFTER.match(sentence, b)  # "350 cents", "90°": a unit math_units can convert
    suffix = (unit.group(1) or " " + unit.group(2)) if unit else ""
    dollar = "\\$" if sentence[max(a - 1, 0) : a] == "$" else ""  # "\$3.50", or "$0.40" outside math
    return dollar + sentence[a:b].replace(",", "") + suffix


# Where a set in words ends: an explanation, or a new clause after a comma.
_SET_END = re.compile(r",?\s+(?:because|since|which|as|so|but|if|when|given)\b|,\s+(?!and\b|or\b)(?=[a-z]{2,})")


def _set_in_words(sentence: str) -> str | None:
    """The set of reals the sentence ends on, in words ("... is all real numbers except $x = 2$")."""
    at = set_phrase_at(sentence)
    if at is None:
        return None
    phrase = sentence[at:]
    end = _SET_END.search(phrase)
    if end:
        if re.search(r"\d|\$", phrase[end.start() :]):
            return None  # a value follows: "x can be any real number, so the minimum is 3"
        phrase = phrase[: end.start()]
    phrase = phrase.replace("$", "").strip()
    return phrase if words_to_set(phrase) else None


_DETERMINERS = frozenset("each every which the this that no any some another one someone".split())


def _counts(m: re.Match) -> bool:
    """Whether a run of number words in a final statement is a number, not the pronoun "one"
    ("each one", "one of them") or the article ("a third box")."""
    run = m.group().lower()
    before = m.string[: m.start()].split()[-1:]
    after = m.string[m.end() :].split()[:1]
    if run == "one" and (before and before[0].lower() in _DETERMINERS or after and after[0].lower() in (
            "of", "another", "by", "at", "more", "less", "way")):
        return False
    return not (run.startswith("a ") and after and after[0].lower() != "of")


_PLAIN_TOKEN = re.compile(r"\s+|\d+(?:\.\d+)?|[A-Za-z]+|[-+*/^=()√π,]|.", re.DOTALL)
_FUNCTIONS = frozenset("sqrt cbrt sin cos tan log ln exp pi".split())
# Two-letter words that are English or units, not a product of two variables ("ab").
_NOT_VARIABLES = frozenset("is it of to in on at as be by we so an if do no up us he am me my go".split()) | {
    w.lower() for w in UNIT_WORDS}
_PLAIN_LHS = re.compile(r"^\s*[A-Za-z](?:\s*\(\s*[A-Za-z]\s*\))?\s*=\s*")
_TIMES_X = re.compile(r"\d\s+[x×]\s+\d")  # "4 x 6 = 24": x is the times sign


def _plain_math(token: str) -> bool:
    if token.isspace() or token in "-+*/^=()√π," or token[0].isdigit():
        return True
    low = token.lower()
    return token.isalpha() and (len(token) == 1 or low in _FUNCTIONS or low == "or" or (
        len(token) == 2 and low not in _NOT_VARIABLES))


def _plain_expression(sentence: str) -> str | None:
    """The expression in plain text that ends the sentence ("... simplifies to (x + 1)/x", "2*sqrt(3)",
    "y - 3 = 2(x - 1)"), when it has a variable or function; None for numbers alone ("3 + 4 = 7")."""
    tokens = _PLAIN_TOKEN.findall(sentence[-160:])
    i = len(tokens)
    while i > 0 and _plain_math(tokens[i - 1]):
        i -= 1
    run = re.sub(r"^(?:(?:or\b|[,*/^=+)])\s*)+", "", "".join(tokens[i:]).strip())
    run = re.sub(r"^[aAI]\s+(?![-+*/^=])", "", run)  # the article or pronoun: "we get a (x + 1)/x"
    if not run or run.count("(") != run.count(")") or _TIMES_X.search(run) or re.search(r"(?:\bor|[-+*/^=(,])$", run):
        return None
    body = _PLAIN_LHS.sub("", run)  # "f(x) = x^2 + 1": the body must still be an expression
    if not re.search(r"[A-Za-z√π]", body) or not re.search(r"[-+*/^=(]|sqrt|\d[A-Za-z]", body):
        return None
    return run


def _answers_in(text: str, truncated: bool, label_parts: int, fallback: bool) -> list[str]:
    readings = _from_boxes(text, truncated, label_parts)
    if readings:
        return readings
    tags = list(_ANSWER_TAG.finditer(text))
    if tags:  # <answer>...</answer>: the answer, or a sentence that states it
        inner = tags[-1].group(1).strip()
        found = _after_marker(inner, False) if _MARKER.search(inner) else inner.strip("$ .")
        return [found] if found else []
    if "####" in text:
        found = _after_hashes(text, truncated)
        return [found] if found else []
    found = _after_marker(text, truncated)
    if found is not None:
        return [found]
    if truncated or not fallback:  # the fallback never credits a cut response
        return []
    found = _final_statement(text)
    return [found] if found else []


def _clean(part: str) -> str:
    return _END_TOKENS.sub("", part[-MAX_SCAN_CHARS:].replace("\u2212", "-"))


def final_answers(response: str, truncated: bool = False, label_parts: int = 1, fallback: bool = True) -> list[str]:
    """The readings of the response's final answer (usually one; none when it has no final answer).

    ``fallback=False`` skips the last-sentence fallback (multiple choice has its own).

    >>> final_answers("<think>maybe \\\\boxed{7}</think> So it is 9.")
    ['9']
    >>> final_answers("so $x = \\\\boxed{2}$ or $x = \\\\boxed{-3}$.")
    ['2 \\\\text{ or } -3']
    >>> final_answers("First, 15 * 4 = 60. Next, 60 - 18 = 42.", truncated=True)
    []
    """
    thinking, final = split_thinking(response)  # the whole response: <think> may be far back
    if final is None:
        return []  # the model never finished thinking
    found = _answers_in(_clean(final), truncated, label_parts, fallback)
    if not found and thinking and not truncated:  # the answer was only given while thinking
        found = _answers_in(_clean(thinking), False, label_parts, fallback=False)
    return found


def extract_answer(response: str) -> str | None:
    """The final answer written in ``response`` (its first reading), or None.

    >>> extract_answer("so 3+4 = \\\\boxed{7}.")
    '7'
    >>> extract_answer("The answer is 1/2.")
    '1/2'
    >>> extract_answer("12 then 46")
    '46'
    >>> extract_answer("The probability is $\\\\frac{5}{36}$.")
    '\\\\frac{5}{36}'
    >>> extract_answer("I don't know.") is None
    True
    """
    found = final_answers(response)
    return found[0].strip() if found else None
