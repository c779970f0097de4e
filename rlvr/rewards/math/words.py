"""Answers written in words, for ``--rm-type math``: number words and sets of reals in words.

- **Number words** become digits: "twelve" -> ``12``, "one hundred twenty" -> ``120``,
  "three-quarters" -> ``\\frac{3}{4}``, "two and a half" -> ``\\frac{5}{2}``, "negative five" ->
  ``-5``. A phrase is read only when it is a whole, grammatical number ("one two" is not 12), and
  an answer is rewritten only when it has no digits and is nothing but number phrases, connectors
  ("or", "and", ",") and a few unit words ("twelve apples", "twelve or thirteen"); so the hedge
  "twelve or thirteen" stays two values and gets 0 against a single label.
- **Sets in words** become intervals: "all real numbers" -> ``(-\\infty,\\infty)``, "all positive
  real numbers" -> ``(0,\\infty)``, "all real numbers greater than 3" -> ``(3,\\infty)``, "all real
  numbers except 2 and -2" -> ``\\mathbb{R} \\setminus \\{2,-2\\}``.

Everything here is string work; ``math_equiv`` compares the results.
"""

from __future__ import annotations

import re
from fractions import Fraction

_ONES = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)}
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_ORDINALS = "third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth".split()
_DENOMINATORS = {"half": 2, "halves": 2, "quarter": 4, "quarters": 4, "hundredth": 100, "hundredths": 100}
_DENOMINATORS.update({w: n for n, w in enumerate(_ORDINALS, start=3)})
_DENOMINATORS.update({w + "s": n for n, w in enumerate(_ORDINALS, start=3)})
_SIGNS = ("negative", "minus")
_NUMBER_WORD = sorted({*_ONES, *_TENS, *_SCALES, *_DENOMINATORS, "hundred", "a", "and", *_SIGNS}, key=len, reverse=True)
# A run of words that may form a number phrase; ``_read`` decides which of it is one.
_WORDS = "|".join(_NUMBER_WORD)
_RUN = re.compile(rf"\b(?:{_WORDS})(?:(?:\s+|-)(?:{_WORDS}))*\b", re.IGNORECASE)
_HAS_WORD = re.compile(r"\b(?:{})\b".format("|".join(w for w in _NUMBER_WORD if w not in ("a", "and"))), re.IGNORECASE)


def _below_thousand(words: list[str], i: int) -> tuple[int, int] | None:
    """``(value, next index)`` of "seven hundred and fifty", "ninety-nine", "twelve"; None if none."""
    value, j = 0, i
    if j < len(words) and (words[j] in _ONES or words[j] in _TENS or words[j] == "a") and \
            j + 1 < len(words) and words[j + 1] == "hundred":
        head = 1 if words[j] == "a" else _ONES.get(words[j], _TENS.get(words[j]))
        value, j = head * 100, j + 2
        if j + 1 < len(words) and words[j] == "and" and (words[j + 1] in _ONES or words[j + 1] in _TENS):
            j += 1
    if j < len(words) and words[j] in _TENS:
        value, j = value + _TENS[words[j]], j + 1
        if j < len(words) and words[j] in _ONES and 0 < _ONES[words[j]] < 10:
            value, j = value + _ONES[words[j]], j + 1
    elif j < len(words) and words[j] in _ONES and not (value and words[j] == "zero"):
        value, j = value + _ONES[words[j]], j + 1
    return (value, j) if j > i else None


def _integer(words: list[str], i: int) -> tuple[int, int] | None:
    """A whole number in words: groups below a thousand, each with a smaller scale than the last."""
    total, j, last_scale = 0, i, None
    while True:
        group = _below_thousand(words, j)
        if group is None and j < len(words) and words[j] == "a" and j + 1 < len(words) and words[j + 1] in _SCALES:
            group = (1, j + 1)  # "a thousand"
        if group is None:
            break
        value, k = group
        scale = _SCALES.get(words[k]) if k < len(words) else None
        if scale is None or (last_scale is not None and scale >= last_scale):
            total, j = total + value, k
            break
        total, j, last_scale = total + value * scale, k + 1, scale
        if j + 1 < len(words) and words[j] == "and" and words[j + 1] != "a":
            j += 1  # "one thousand and five"
    return (total, j) if j > i else None


def _read(words: list[str], i: int) -> tuple[Fraction, int] | None:
    """The number phrase starting at ``words[i]``: ``(value, next index)``, or None."""
    sign, j = 1, i
    if j < len(words) and words[j] in _SIGNS:
        sign, j = -1, j + 1
    if j + 1 < len(words) and words[j] == "a" and words[j + 1] in ("half", "third", "quarter", "fourth", "fifth"):
        return sign * Fraction(1, _DENOMINATORS[words[j + 1]]), j + 2  # "a half", "a quarter"
    whole = _integer(words, j)
    if whole is None:
        return None
    value, j = whole
    if j < len(words) and words[j] in _DENOMINATORS:  # "one third", "three quarters"; not "thirty-third"
        plural = words[j].endswith("s")
        if not 0 < value < 100 or plural != (value > 1):
            return None
        return sign * Fraction(value, _DENOMINATORS[words[j]]), j + 1
    if j + 2 < len(words) and words[j] == "and" and words[j + 1] in ("a", "one") and words[j + 2] in _DENOMINATORS:
        return sign * (value + Fraction(1, _DENOMINATORS[words[j + 2]])), j + 3  # "two and a half"
    if j + 2 < len(words) and words[j] == "and" and words[j + 1] in _ONES and words[j + 2] in _DENOMINATORS:
        part = Fraction(_ONES[words[j + 1]], _DENOMINATORS[words[j + 2]])
        if part < 1:
            return sign * (value + part), j + 3  # "one and three quarters"
    return sign * value, j


def _latex(value: Fraction, plain: bool = False) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    if plain:
        return f"{value.numerator}/{value.denominator}"
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _spell_run(run: str, plain: bool = False) -> str:
    """The number phrases of one run of number words as digits; the words that are none stay."""
    tokens = re.split(r"(\s+|-)", run)  # words at even indexes, separators at odd ones
    words = [t.lower() for t in tokens[::2]]
    out, i = [], 0
    while i < len(words):
        found = _read(words, i)
        end = found[1] if found else i + 1
        out.append(_latex(found[0], plain) if found else tokens[2 * i])
        if end < len(words):
            out.append(" " if found else tokens[2 * end - 1])
        i = end
    return "".join(out)


def spell_numbers(text: str, keep=None, plain: bool = False) -> str:
    """``text`` with every number phrase in digits; ``keep(match)`` may veto a run ("each one");
    ``plain`` writes fractions as ``3/4`` instead of ``\\frac{3}{4}``.

    >>> spell_numbers("twelve or thirteen"), spell_numbers("one hundred and twenty seats")
    ('12 or 13', '120 seats')
    >>> spell_numbers("three-quarters"), spell_numbers("two and a half"), spell_numbers("negative five")
    ('\\\\frac{3}{4}', '\\\\frac{5}{2}', '-5')
    >>> spell_numbers("one thousand two hundred"), spell_numbers("a dozen"), spell_numbers("one two")
    ('1200', 'a dozen', '1 2')
    """
    if not _HAS_WORD.search(text):
        return text
    return _RUN.sub(lambda m: m.group() if keep is not None and not keep(m) else _spell_run(m.group(), plain), text)


_DIGITS = r"-?(?:\d+|\\frac\{\d+\}\{\d+\})"
# A whole answer that is numbers in words: phrases joined by connectors, then a few unit words.
_SPELLED_ANSWER = re.compile(
    rf"(?:(?:either|both|exactly)\s+)?{_DIGITS}(?:\s*(?:,|or|and)\s*(?:or\s+|and\s+)?{_DIGITS})*((?:\s+[A-Za-z]+){{0,3}})",
    re.IGNORECASE)
_WORDS_AFTER = frozenset("of the is are was were a an it that this to in on at for by with from as or and so".split())


def words_to_number(text: str) -> str | None:
    """``text`` in digits when it is a number written in words (and nothing else), else None.

    >>> words_to_number("twelve"), words_to_number("one hundred twenty apples"), words_to_number("Zero")
    ('12', '120 apples', '0')
    >>> words_to_number("twelve or thirteen"), words_to_number("one of the roots"), words_to_number("12")
    ('12 or 13', None, None)
    """
    if re.search(r"\d", text) or not _HAS_WORD.search(text):
        return None
    spelled = spell_numbers(text.strip().rstrip("."))
    m = _SPELLED_ANSWER.fullmatch(spelled)
    if m is None or any(w.lower() in _WORDS_AFTER for w in m.group(1).split()):
        return None
    return spelled


_TEXT_GROUP = re.compile(r"\\(?:text|textrm|mathrm|mbox|textbf)\s*\{([^{}]*)\}")


def spelled_answer(text: str) -> str | None:
    """``words_to_number`` of an answer that may wrap its words in ``\\text{}``.

    >>> spelled_answer("\\\\text{twenty-one}"), spelled_answer("\\\\text{five sixths}"), spelled_answer("Monday")
    ('21', '\\\\frac{5}{6}', None)
    """
    if not _HAS_WORD.search(text):
        return None
    plain = re.sub(r"\s+", " ", _TEXT_GROUP.sub(r" \1 ", text)).strip()
    return words_to_number(plain)


# --- sets of reals in words ---------------------------------------------------------------------

_REALS = (r"(?:the set of\s+)?(?:all|any|every)\s+(?:(positive|negative|non-?negative|non-?positive)\s+)?"
          r"real(?:\s+numbers?|\s+values?|s)?(?:\s+[a-z](?![a-z]))?")
_SET_PHRASE = re.compile(_REALS + r"|\\mathbb\s*\{?R\}?|ℝ", re.IGNORECASE)
_SIGNED = {"positive": "(0,\\infty)", "negative": "(-\\infty,0)", "nonnegative": "[0,\\infty)",
           "nonpositive": "(-\\infty,0]"}
_BOUND = re.compile(
    r"(?:that are\s+|which are\s+)?(greater than or equal to|less than or equal to|greater than|more than|less than|"
    r"at least|at most|no less than|no more than)\s+(.+)$", re.IGNORECASE)
_BOUND_INTERVAL = {"greater than": "({},\\infty)", "more than": "({},\\infty)", "less than": "(-\\infty,{})",
                   "greater than or equal to": "[{},\\infty)", "at least": "[{},\\infty)", "no less than": "[{},\\infty)",
                   "less than or equal to": "(-\\infty,{}]", "at most": "(-\\infty,{}]", "no more than": "(-\\infty,{}]"}
_EXCEPT = re.compile(r"(?:except(?:\s+for)?|other than|but not|besides|excluding)\s+(.+)$", re.IGNORECASE)
_SUCH_THAT = re.compile(r"^(?:[a-z]\s+)?(?:such that|with|where|satisfying|for which)\s+(.*[<>≤≥].*|.*\\[lg]eq?\b.*)$")
_POINT = re.compile(r"^(?:[a-z]\s*=\s*)?(-?[\w\\{}./]+)$")


def _points(text: str) -> list[str] | None:
    """The excluded points of "2 and -2", "$x = 2$", "0, 1, and 3"; None if not a plain list."""
    parts = re.split(r"\s*,\s*(?:and\s+|or\s+)?|\s+and\s+|\s+or\s+", text.replace("$", "").strip().rstrip("."))
    points = [_POINT.match(spell_numbers(p.strip())) for p in parts if p.strip()]
    return [p.group(1) for p in points] if points and all(points) else None


def words_to_set(text: str) -> str | None:
    """The interval (union) that a set of reals written in words names, or None.

    >>> words_to_set("all real numbers"), words_to_set("all positive real numbers"), words_to_set("x")
    ('(-\\\\infty,\\\\infty)', '(0,\\\\infty)', None)
    >>> words_to_set("all real numbers except 2 and -2"), words_to_set("all reals greater than or equal to 5")
    ('(-\\\\infty,\\\\infty) \\\\setminus \\\\{2,-2\\\\}', '[5,\\\\infty)')
    """
    s = re.sub(r"\\(?:text|mathrm|textrm|mbox)\s*\{([^{}]*)\}", r" \1 ", text)
    s = re.sub(r"\s+", " ", s.replace("$", "")).strip().rstrip(".").strip()
    m = _SET_PHRASE.match(s)
    if m is None:
        return None
    sign = (m.group(1) or "").lower().replace("-", "")
    base, rest = _SIGNED.get(sign, "(-\\infty,\\infty)"), s[m.end():].strip(" ,")
    if not rest:
        return base
    if sign:
        return None  # "all positive reals except 1" and the like: not read
    bound = _BOUND.match(rest)
    if bound:
        points = _points(bound.group(2))
        return _BOUND_INTERVAL[bound.group(1).lower()].format(points[0]) if points and len(points) == 1 else None
    condition = _SUCH_THAT.match(rest)
    if condition:
        return condition.group(1).strip()  # "all real numbers x such that x > 2": the inequality says it
    excluded = _EXCEPT.match(rest)
    points = _points(excluded.group(1)) if excluded else None
    return base + " \\setminus \\{" + ",".join(points) + "\\}" if points else None


def set_phrase_at(sentence: str) -> int | None:
    """Where the last set-in-words phrase of ``sentence`` starts ("... is all real numbers except 2")."""
    found = [m.start() for m in _SET_PHRASE.finditer(sentence)]
    return found[-1] if found else None
