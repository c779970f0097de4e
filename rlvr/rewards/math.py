"""``--rm-type math``: 1.0 when the response's final answer equals the label, else 0.0.

Guarantees
- **Extraction order** (first that applies): the last ``\\boxed{...}`` / ``\\fbox{...}`` (an
  unclosed one takes the rest of the text); the text after the last "answer is" / "answer:" /
  "answer =" marker (so also "The final answer is", "**Final Answer:**"), cut at the end of its
  sentence, unless that text is prose (3+ words, no digit, no LaTeX); the last math span (``$...$``,
  ``\\(...\\)``, ``\\[...\\]``) or the last number of the final ``FALLBACK_TAIL`` characters,
  whichever comes later. No candidate -> 0.0.
- **Equivalence** is decided by the math-verify library after a light normalisation that only
  removes presentation: units (``5\\text{ cm}``, ``\\$5``, "5 dollars"), a ``%`` sign, degree
  marks, ``\\text``/``\\textbf`` wrappers, thousands separators, ``1.5e3`` notation, a leading
  ``x =`` when the label is a bare value. Integers and fractions are compared exactly without
  sympy; a pair involving a decimal that is not exactly equal goes to math-verify, which rounds
  to 6 decimal places (``0.333`` is not ``1/3``; ``0.333333`` is).
- **Conventions**: a percentage is compared by its number (``50\\%`` matches ``50``, not ``0.5``);
  units are dropped, never converted (``2 hours 30 minutes`` is not ``2.5``); a label
  that is a single letter A-J (``B``, ``(B)``, ``\\text{(B)}``) is graded as a multiple-choice
  letter, case-insensitive.
- **Safety**: answers with huge powers, towers of powers or factorials (``9^{9^{9}}``,
  ``2^{1000000}``, ``10000!``; so also a harmless ``2^{2^{5}}``) or longer
  than ``MAX_ANSWER_CHARS`` are compared as normalised strings, never handed to sympy; only the
  last ``MAX_SCAN_CHARS`` of a response are searched. math-verify enforces its time limits with
  ``signal.alarm``, which works only in the main thread; elsewhere we call it with its timeouts
  off and the grader around every reward call owns the deadline.
"""

from __future__ import annotations

import functools
import re
import threading
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from rlvr.rewards.grader import inline
from rlvr.types import Sample

MAX_SCAN_CHARS = 20_000  # markers and boxes are searched in this tail of the response
FALLBACK_TAIL = 300  # the last-number / last-math-span fallback looks only here
MAX_ANSWER_CHARS = 400  # a longer "answer" is compared as a string only
MATH_VERIFY_TIMEOUT = 5  # seconds, per parse / verify, main thread only

# --- extraction ---------------------------------------------------------------------------------

_BOX = re.compile(r"\\(?:boxed|fbox)\s*(\{|[^\s{\\$])")
_MARKER = re.compile(r"\banswer\b\s*(?:is\b\s*:?|:|=)[\s*]*", re.IGNORECASE)
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
# Where the answer after a marker stops: a sentence end, a new line, or an explanation.
_SENTENCE_END = re.compile(
    r"\.(?:\s|$)|\n|;|,\s+(?=[a-z]{2,})|\s+\((?!\w\))|\s+(?:because|since|which|as|where|so|but)\b"
)


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
    matches = list(_BOX.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    if m.group(1) != "{":  # \boxed 5: one token, as TeX reads it
        return None if strict else m.group(1)
    inner, end = _balanced(text, m.start(1))
    closed = end == m.start(1) + len(inner) + 2
    if strict and (not closed or not text.startswith("\\boxed{", m.start())):
        return None
    return inner


def _answer_after_marker(text: str) -> str | None:
    """The answer written after the last "answer is" / "answer:" marker, or None.

    >>> _answer_after_marker("The answer is 42. Let me double check: 6*7=42.")
    '42'
    >>> _answer_after_marker("Answer: 2/3, or about 0.67.")
    '2/3'
    >>> _answer_after_marker("The final answer is $\\\\frac{1}{6}$. Note 36 outcomes.")
    '\\\\frac{1}{6}'
    """
    marks = list(_MARKER.finditer(text))
    if not marks:
        return None
    rest = text[marks[-1].end() :].lstrip()
    span = _MATH_SPAN.match(rest)
    if span:
        return next(g for g in span.groups() if g is not None).strip()
    if rest.startswith("$") or rest.startswith("\\("):  # an unclosed math span: up to the line end
        return rest.lstrip("$").removeprefix("\\(").split("\n")[0].strip().rstrip(".") or None
    end = _SENTENCE_END.search(rest)
    answer = (rest[: end.start()] if end else rest).strip().strip("*").strip()
    if len(answer.split()) >= 3 and not re.search(r"[\d\\$]", answer):
        return None  # "the answer: it must be even" is prose, not an answer
    return answer or None


def _fallback(tail: str) -> str | None:
    """The last math span or the last number of ``tail``, whichever ends later."""
    spans = [m for m in _MATH_SPAN.finditer(tail)]
    numbers = [m for m in _NUMBER.finditer(tail)]
    span = spans[-1] if spans else None
    number = numbers[-1] if numbers else None
    if span is not None and (number is None or number.start() < span.end()):
        return next(g for g in span.groups() if g is not None).strip()
    return number.group().replace(",", "") if number else None


def extract_answer(response: str) -> str | None:
    """The final answer written in ``response``, or None.

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
    text = response[-MAX_SCAN_CHARS:].replace("\u2212", "-")
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    marked = _answer_after_marker(text)
    if marked is not None:
        return marked
    return _fallback(text[-FALLBACK_TAIL:])


# --- normalisation ------------------------------------------------------------------------------

_WRAPPERS = re.compile(r"\\(?:textbf|textrm|text|mathrm|mathbf|mbox|operatorname|displaystyle)\s*")
_UNIT_TEXT = re.compile(r"\\(?:textrm|text|mathrm|mbox)\s*\{\s*~?\s*[A-Za-z][A-Za-z .]*\}(?:\s*\^\s*\{?\d\}?)?")
# Words after a number ("64 square units"). Unambiguous on purpose: "(?:[A-Za-z]{2,}\s*)+"
# backtracks exponentially on a long run of letters that does not end the string.
_TRAILING_WORDS = re.compile(r"(?<=[\d}])\s*[A-Za-z]{2,}(?:\s+[A-Za-z]{2,})*\s*(?:\^\s*\{?\d\}?)?$")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?|°")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:(?:,|\{,\}| )\d{3})+(?:\.\d+)?")
_TEX_SPACE = re.compile(r"(?<!\\)\\[,;: !]|~")
_SCIENTIFIC = re.compile(r"(-?\d+(?:\.\d+)?)[eE]([+-]?\d+)")
_SIMPLE_LHS = re.compile(r"^\s*(?:[A-Za-z]|[A-Za-z]\s*\(\s*[A-Za-z]\s*\))\s*=\s*(?!.*=)")
_ASSIGNMENTS = re.compile(r"^\s*[a-z]\s*=\s*[^,=]+(?:,\s*[a-z]\s*=\s*[^,=]+)+$")
_REPEATING = re.compile(r"^(-?)(\d*)\.(\d*)\\overline\{(\d+)\}$")
# -\frac{a}{b}, a/b, or a decimal: the forms compared exactly without sympy.
_RATIONAL = re.compile(r"^(-?)\s*(?:\\frac\{\s*(-?\d+)\s*\}\{\s*(-?\d+)\s*\}|(-?\d+)\s*/\s*(-?\d+)|(-?(?:\d+(?:\.\d*)?|\.\d+)))$")


def _repeating_to_fraction(text: str) -> str:
    """``0.\\overline{3}`` -> ``\\frac{1}{3}``: a repeating decimal as an exact fraction.

    >>> _repeating_to_fraction("0.\\\\overline{3}"), _repeating_to_fraction("1.2\\\\overline{45}")
    ('\\\\frac{1}{3}', '\\\\frac{137}{110}')
    """
    m = _REPEATING.match(text)
    if not m:
        return text
    sign, whole, fixed, rep = m.groups()
    value = Fraction(int(whole or 0)) + Fraction(int(fixed or 0), 10 ** len(fixed))
    value += Fraction(int(rep), 10 ** len(fixed) * (10 ** len(rep) - 1))
    return f"{sign}\\frac{{{value.numerator}}}{{{value.denominator}}}"


def _strip_outer_braces(text: str) -> str:
    while text.startswith("{") and _balanced(text, 0)[1] == len(text):
        text = text[1:-1].strip()
    return text


def _close_braces(text: str) -> str:
    """Close the groups a cut-off answer left open; drop closing braces that match nothing."""
    depth, out = 0, []
    for ch in text:
        if ch == "}" and depth == 0:
            continue
        depth += (ch == "{") - (ch == "}")
        out.append(ch)
    return "".join(out) + "}" * depth


def normalize(answer: str) -> str:
    """``answer`` without its presentation: units, ``%``, degrees, wrappers, separators.

    >>> normalize("5\\\\text{ cm}"), normalize("\\\\$1,500"), normalize("50\\\\%"), normalize("64 square units")
    ('5', '1500', '50', '64')
    >>> normalize("90^\\\\circ"), normalize("1{,}234"), normalize("1.5e3"), normalize("\\\\textbf{12}")
    ('90', '1234', '1.5\\\\times10^{3}', '12')
    >>> normalize("x=2, y=3"), normalize("\\\\frac{3}{4"), normalize("{7}")
    ('(2,3)', '\\\\frac{3}{4}', '7')
    """
    s = answer.replace("\u2212", "-").replace("\\$", "").replace("$", "").strip()
    s = _TEX_SPACE.sub(" ", s).replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _close_braces(s)
    s = _UNIT_TEXT.sub("", s).strip() if re.search(r"[\d}]\s*\\(?:text|mathrm|mbox)", s) else s
    s = _strip_outer_braces(_WRAPPERS.sub("", s).strip())
    s = _DEGREES.sub("", s.replace("\\%", "").replace("%", ""))
    s = re.sub(r"\s*(?:percent|dollars?|cents?)\s*$", "", s.strip())
    s = _TRAILING_WORDS.sub("", s).strip() if re.search(r"\d", s) else s
    if _THOUSANDS.fullmatch(s):
        s = re.sub(r",|\{,\}| ", "", s)
    m = _SCIENTIFIC.fullmatch(s)
    if m:
        s = f"{m.group(1)}\\times10^{{{int(m.group(2))}}}"
    if _ASSIGNMENTS.match(s):
        s = "(" + ",".join(part.split("=")[1].strip() for part in s.split(",")) + ")"
    s = _repeating_to_fraction(s)
    return s.rstrip(".").strip()


# --- multiple choice ----------------------------------------------------------------------------

_CHOICE = re.compile(r"^\(?([A-Ja-j])\)?(?![A-Za-z0-9])")
_CHOICE_LABEL = re.compile(r"^\(?([A-J])\)?$")
_CHOICE_IN_TEXT = re.compile(r"\(([A-J])\)")


def _choice_letter(text: str) -> str | None:
    """The option letter ``text`` starts with (``(B)``, ``\\textbf{(B)} 5``, ``b``), upper-cased.

    >>> _choice_letter("\\\\textbf{(B)}"), _choice_letter("(D) 12"), _choice_letter("12")
    ('B', 'D', None)
    """
    plain = _WRAPPERS.sub("", text).replace("$", "").replace("{", "").replace("}", "").strip()
    m = _CHOICE.match(plain)
    return m.group(1).upper() if m else None


def _choice_answer(response: str) -> str | None:
    text = response[-MAX_SCAN_CHARS:]
    for candidate in (last_boxed(text), _answer_after_marker(text)):
        if candidate is not None:
            return _choice_letter(candidate)
    whole = _choice_letter(text.strip())
    if whole is not None and len(_WRAPPERS.sub("", text).strip("${}() \n.")) == 1:
        return whole
    found = _CHOICE_IN_TEXT.findall(text[-FALLBACK_TAIL:])
    return found[-1] if found else None


def label_choice(label: str) -> str | None:
    """The option letter when ``label`` is a multiple-choice label (``B``, ``(B)``, ``\\text{(B)}``).

    >>> label_choice("(B)"), label_choice("\\\\text{(C)}"), label_choice("e"), label_choice("12")
    ('B', 'C', None, None)
    """
    plain = _WRAPPERS.sub("", label).replace("$", "").replace("{", "").replace("}", "").strip()
    m = _CHOICE_LABEL.match(plain)
    return m.group(1) if m else None


# --- equivalence --------------------------------------------------------------------------------

# A power with a 4+ digit exponent, a tower of powers (9^{9^{9}}, 9^9^9), a 4+ digit factorial.
_HUGE_POWER = re.compile(r"\^\s*\{?\s*-?\d{4,}|\^\s*\{[^{}]*\^|\^\s*\d+\s*\^|\*\*\s*\d{4,}|\d{4,}\s*!")


def is_unsafe(expr: str) -> bool:
    """True when sympy could spend minutes or gigabytes on ``expr`` (huge powers, factorials).

    >>> is_unsafe("9^{9^{9}}"), is_unsafe("9^9^9"), is_unsafe("2^{1000000}"), is_unsafe("10000!")
    (True, True, True, True)
    >>> is_unsafe("2^{10}"), is_unsafe("10^{-3}"), is_unsafe("x^2 + y^2")
    (False, False, False)
    """
    return len(expr) > MAX_ANSWER_CHARS or bool(_HUGE_POWER.search(expr))


def _timeout() -> int | None:
    return MATH_VERIFY_TIMEOUT if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=8192)
def _parse(expr: str, timeout: int | None) -> tuple:
    # Cached: a label is parsed once for its whole group, and the n samples of a prompt often
    # write the same answer. Parsed sympy objects are immutable.
    return tuple(parse(
        f"${expr}$",
        extraction_config=[LatexExtractionConfig(boxed_match_priority=-1), ExprExtractionConfig()],
        parsing_timeout=timeout,
    ))


def _strip_lhs_unless_both(answer: str, label: str) -> tuple[str, str]:
    """Compare values, not names: ``x = 5`` against ``5`` compares ``5`` with ``5``."""
    a_eq, l_eq = bool(_SIMPLE_LHS.match(answer)), bool(_SIMPLE_LHS.match(label))
    if a_eq and not l_eq:
        answer = _SIMPLE_LHS.sub("", answer)
    elif l_eq and not a_eq:
        label = _SIMPLE_LHS.sub("", label)
    return answer, label


def _rational(text: str) -> tuple[Fraction, bool] | None:
    """``text`` as an exact rational and whether it was written with a decimal point; None if not.

    >>> _rational("-\\\\frac{3}{4}"), _rational("1/8"), _rational("0.5"), _rational("12"), _rational("x")
    ((Fraction(-3, 4), False), (Fraction(1, 8), False), (Fraction(1, 2), True), (Fraction(12, 1), False), None)
    """
    m = _RATIONAL.match(text)
    if not m:
        return None
    sign, num, den, num2, den2, dec = m.groups()
    try:
        if dec is not None:
            value, decimal = Fraction(Decimal(dec)), "." in dec
        else:
            value, decimal = Fraction(int(num or num2), int(den or den2)), False
    except (ZeroDivisionError, InvalidOperation, ValueError):
        return None
    return (-value if sign else value), decimal


def _rational_verdict(answer: str, label: str) -> bool | None:
    """Exact verdict when both sides are plain numbers or fractions; None to ask math-verify.

    Equal values are equal. Unequal integers/fractions are unequal. An unequal pair with a
    decimal goes to math-verify, whose 6-decimal rounding decides (``0.333`` is not ``1/3``).
    """
    a, g = _rational(answer), _rational(label)
    if a is None or g is None:
        return None
    if a[0] == g[0]:
        return True
    return False if not (a[1] or g[1]) else None


def is_equivalent(answer: str, label: str) -> bool:
    """Whether the extracted ``answer`` means the same as ``label``.

    >>> is_equivalent("\\\\frac{1}{2}", "0.5"), is_equivalent("0.333", "\\\\frac{1}{3}")
    (True, False)
    >>> is_equivalent("\\\\$12.50", "12.5"), is_equivalent("x = 5", "5"), is_equivalent("(B)", "B")
    (True, True, True)
    """
    letter = label_choice(label)
    if letter is not None:
        return _choice_letter(answer) == letter
    if len(answer) > 4 * MAX_ANSWER_CHARS:  # not a final answer anyone writes; no regex work on it
        return answer.strip() == label.strip()
    a, g = _strip_lhs_unless_both(normalize(answer), normalize(label))
    if not a or not g:
        return False
    exact = _rational_verdict(a, g)
    if exact is not None:
        return exact
    if is_unsafe(a) or is_unsafe(g):
        return a.replace(" ", "") == g.replace(" ", "")
    return _math_verify(a, g, _timeout())


@functools.lru_cache(maxsize=8192)
def _math_verify(answer: str, label: str, timeout: int | None) -> bool:
    # Cached: the samples of one prompt often reach the same normalised answer.
    gold, pred = list(_parse(label, timeout)), list(_parse(answer, timeout))
    if not gold or not pred:
        return answer.replace(" ", "") == label.replace(" ", "")
    return bool(verify(gold, pred, allow_set_relation_comp=True, timeout_seconds=timeout))


@inline  # cheap pure CPU: runs on the event-loop thread, where math-verify's alarm works
def math_reward(sample: Sample) -> float:
    """1.0 when the final answer in ``sample.response`` equals ``sample.label``, else 0.0.

    >>> from rlvr.types import Sample
    >>> math_reward(Sample(prompt="", prompt_ids=[], label="0.5", response="so \\\\boxed{\\\\frac12}"))
    1.0
    """
    if sample.label is None or str(sample.label).strip() == "":
        raise ValueError("math reward needs a non-empty label per sample (--label-key names its field)")
    label = str(sample.label)
    if label_choice(label) is not None:
        letter = _choice_answer(sample.response)
        return 1.0 if letter == label_choice(label) else 0.0
    answer = extract_answer(sample.response)
    if answer is None:
        return 0.0
    return 1.0 if is_equivalent(answer, label) else 0.0


def _register() -> None:
    from rlvr.rewards.registry import REWARDS

    REWARDS.register("math")(math_reward)


_register()
