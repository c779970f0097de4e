"""Equivalence for ``--rm-type math``: whether an extracted final answer means the label.

A normalisation and structure layer in front of the math-verify library (which decides the
algebra). Rules (``docs/rewards.md`` states them for users):

- **Presentation is removed**: ``\\text{}`` wrappers, ``\\$``, degree marks, thousands
  separators, TeX spaces, and units: a trailing ``\\text{...}`` or word(s) after a value
  (``5\\text{ cm}``, ``12\\pi \\text{ square units}``, ``45 km/h``). ``3 meters`` is not ``300``.
  A unit converts only when both sides name a known unit of one kind (``125 cents`` = ``\\$1.25``,
  ``60^\\circ`` = ``\\frac{\\pi}{3}``; ``math_units``).
- **Other forms of one answer**: numbers and sets of reals in words ("twelve", "all real numbers
  except 2"; ``math_words``), an equation of the same curve, a congruence for a residue, a
  repeating decimal with an ellipsis (``x + 2y = 6``, ``x \\equiv 3 \\pmod 7``, ``0.1666...``;
  ``math_forms``).
- **Scale words and percent are values.** ``thousand``/``million``/``billion``/``trillion``
  multiply (``3.5 million`` = ``3500000``); since a label may count in that scale, the bare
  number also matches (``5 million`` vs a label ``5``). Percent follows ``--math-percent-policy``:
  ``value`` (default) ``p%`` equals ``p/100`` and, as labels often drop the sign, the bare ``p``;
  ``number`` compares the number only (``50%`` = ``50`` != ``0.5``, rlvr's old rule); ``strict``
  only ``p/100``.
- **Several values.** An answer is split at top-level commas and at "or"/"and" into values
  (``x = 2 or x = -3`` -> ``{2, -3}``; ``\\pm 3`` -> ``{3, -3}``). Against a label with several
  values the two must be the same collection (order free); against a tuple label the values in
  order form the tuple (``a = 3 and b = 4`` = ``(3, 4)``); against a single-value label **every**
  stated value must equal it: a hedge ("A or C", "6 (or 4 ...)", "12 or 15") gets 0.
- **Sets.** Inequalities joined by "or" are the union of their solution sets and equal the same
  interval union; "no solution", "no real roots", "none", ``\\{\\}``, ``\\varnothing`` equal
  ``\\emptyset``; "all real numbers" equals ``(-\\infty, \\infty)`` and ``\\mathbb{R}``; a row or
  column vector (``pmatrix``/``bmatrix``, ``\\langle\\rangle``) equals the tuple with the same
  entries, but a row vector is not a column vector.
- **Exactness.** Integers, fractions, decimals, mixed numbers (``3 1/2``, ``3\\frac12``) and
  repeating decimals are compared exactly; an inexact decimal never equals a fraction, radical or
  ``\\pi`` (``0.333333`` != ``1/3``; math-verify is asked for 10 decimal places instead of its 6).
  Approximation is allowed only when the prompt asks for it ("round", "nearest", "decimal
  places", "approximately", ...: a decimal answer must equal the label rounded to the answer's
  places) or with ``--math-tolerance`` (relative) for datasets that want it.
- **Safety**: answers with huge powers, towers or factorials, or longer than
  ``MAX_ANSWER_CHARS``, are compared as strings, never handed to sympy.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from rlvr.rewards.math.forms import (
    ELLIPSIS,
    congruence_equal,
    ellipsis_value,
    mixed_to_fraction,
    one_equation,
    repeating_to_fraction,
    same_curve,
)
from rlvr.rewards.math.units import DEGREE_MARK, in_common_unit
from rlvr.rewards.math.words import spelled_answer, words_to_set

MAX_ANSWER_CHARS = 400  # a longer "answer" is compared as a string only
MATH_VERIFY_TIMEOUT = 5  # seconds, per parse / verify, main thread only
EXACT_PLACES = 10  # math-verify rounds floats to this many places before comparing
PERCENT_POLICIES = ("value", "number", "strict")


@dataclass(frozen=True)
class MathOptions:
    """The knobs of the math equivalence (``--math-percent-policy``, ``--math-tolerance``)."""

    percent_policy: str = "value"
    tolerance: float = 0.0  # relative; 0 = exact
    approximate: bool = False  # the prompt asked for a rounded / approximate answer


DEFAULT = MathOptions()

# --- normalisation ------------------------------------------------------------------------------

_WRAPPERS = re.compile(r"\\(?:textbf|textrm|text|mathrm|mathbf|mbox|operatorname|displaystyle)\s*")
_UNIT_TEXT = re.compile(
    r"\\(?:textrm|text|mathrm|mbox)\s*\{\s*~?\s*[A-Za-z][A-Za-z ./]*\}(?:\s*\^\s*\{?\d\}?)?(?:\s*[A-Za-z]{2,})*\s*$"
)
# Words after a value ("64 square units", "45 km/h"). Unambiguous on purpose: "(?:[A-Za-z]{2,}\s*)+"
# backtracks exponentially on a long run of letters that does not end the string.
_TRAILING_WORDS = re.compile(
    r"(?<=[\d})])\s*(?:[A-Za-z]{2,}|[A-Za-z]+/[A-Za-z]+)(?:\s+(?:[A-Za-z]{2,}|[A-Za-z]+/[A-Za-z]+))*"
    r"\s*(?:\^\s*\{?\d\}?)?$"
)
_DEGREES = re.compile(DEGREE_MARK)
_THOUSANDS = re.compile(r"-?\d{1,3}(?:(?:,|\{,\}| )\d{3})+(?:\.\d+)?")
_TEX_SPACE = re.compile(r"(?<!\\)\\[,;: !]|~")
_SCIENTIFIC = re.compile(r"(-?\d+(?:\.\d+)?)[eE]([+-]?\d+)")
_SIMPLE_LHS = re.compile(
    r"^\s*(?:[A-Za-z]|\{\s*[A-Za-z]\s*\}|[A-Za-z]\s*\(\s*[A-Za-z]\s*\)|"
    r"\\(?:mathbf|vec|overrightarrow|boldsymbol)\s*\{?\s*[A-Za-z]\s*\}?)"
    r"\s*=\s*(?!.*=)"
)
_ASSIGNMENTS = re.compile(r"^\s*[a-z]\s*=\s*[^,=]+(?:,\s*[a-z]\s*=\s*[^,=]+)+$")
_MATRIX = re.compile(r"^\\begin\{([pbBvV]?matrix)\}(.*)\\end\{\1\}$", re.DOTALL)
_APPROX = re.compile(r"\\approx|≈")
_SQRT_SIGN = re.compile(r"√\s*(\d+|[a-z]|\{[^{}]*\})")
_ELLIPSIS = re.compile(ELLIPSIS)
_ENDS_IN_ELLIPSIS = re.compile(rf"\d\s*{ELLIPSIS}\s*$")
_DIGIT = re.compile(r"\d")
# "approximately 42 minutes": the adverb says how the value was found, the value is still 42.
_LEADING_ADVERB = re.compile(r"^(?:approximately|about|roughly|around|exactly|nearly|just|only)\s+", re.IGNORECASE)
# -\frac{a}{b}, a/b, or a decimal: the forms compared exactly without sympy.
_RATIONAL = re.compile(
    r"^(-?)\s*(?:\\frac\{\s*(-?\d+)\s*\}\{\s*(-?\d+)\s*\}|(-?\d+)\s*/\s*(-?\d+)|(-?(?:\d+(?:\.\d*)?|\.\d+)))$"
)


def _vector_to_tuple(text: str) -> str:
    """A row or column ``pmatrix``/``bmatrix`` as the tuple of its entries (a tuple has no orientation).

    >>> _vector_to_tuple("\\\\begin{pmatrix} 1 \\\\\\\\ -2 \\\\end{pmatrix}")
    '(1,-2)'
    >>> _vector_to_tuple("\\\\begin{pmatrix} 1 & 2 \\\\end{pmatrix}")
    '(1,2)'

    """
    m = _MATRIX.match(text)
    if not m:
        return text
    rows = [r.strip() for r in m.group(2).strip().split("\\\\") if r.strip()]
    cells = [[c.strip() for c in r.split("&")] for r in rows]
    if len(cells) == 1:
        entries = cells[0]
    elif all(len(r) == 1 for r in cells):
        entries = [r[0] for r in cells]
    else:
        return text  # a real matrix stays a matrix
    return "(" + ",".join(entries) + ")"


def _strip_outer_braces(text: str) -> str:
    while text.startswith("{") and _group_end(text, 0) == len(text):
        text = text[1:-1].strip()
    return text


def _group_end(text: str, at: int) -> int:
    depth = 0
    for j in range(at, len(text)):
        depth += (text[j] == "{") - (text[j] == "}")
        if depth == 0:
            return j + 1
    return len(text)


def _close_braces(text: str) -> str:
    """Close the groups a cut-off answer left open; drop closing braces that match nothing."""
    depth, out = 0, []
    for ch in text:
        if ch == "}" and depth == 0:
            continue
        depth += (ch == "{") - (ch == "}")
        out.append(ch)
    return "".join(out) + "}" * depth


@functools.lru_cache(maxsize=16384)  # pure; one answer or label is cleaned several times per grading
def _clean(answer: str) -> str:
    """Presentation that never carries meaning: dollar signs, ``\\left``, TeX spaces, ``\\dfrac``."""
    s = answer.replace("\u2212", "-").replace("\\$", "").replace("$", "").strip()
    s = _TEX_SPACE.sub(" ", s).replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\langle", "(").replace("\\rangle", ")")  # <2, 0, -1>: a vector is a tuple
    parts = _APPROX.split(s)  # "1/3 \approx 0.333": the value before the approximation
    if not parts[0].strip() and _ENDS_IN_ELLIPSIS.search(s):
        return s  # "\approx 0.333...": an approximation, not the repeating decimal
    s = parts[0].strip() or parts[-1].strip()
    s = _SQRT_SIGN.sub(r"\\sqrt{\1}", s.replace("±", "\\pm "))
    s = _close_braces(s)
    if not _ENDS_IN_ELLIPSIS.search(s):  # "approximately 0.333..." says it is not exactly 1/3
        s = _LEADING_ADVERB.sub("", s).strip()
    if not _DIGIT.search(s):
        s = spelled_answer(s) or s  # "twelve" -> 12 (only a whole answer in number words)
    return s.strip()


@functools.lru_cache(maxsize=16384)  # pure, and called for the same strings by several rules
def normalize(answer: str) -> str:
    """``answer`` without its presentation: units, ``%``, degrees, wrappers, separators.

    >>> normalize("5\\\\text{ cm}"), normalize("\\\\$1,500"), normalize("50\\\\%"), normalize("64 square units")
    ('5', '1500', '50', '64')
    >>> normalize("90^\\\\circ"), normalize("1{,}234"), normalize("1.5e3"), normalize("\\\\textbf{12}")
    ('90', '1234', '1.5\\\\times10^{3}', '12')
    >>> normalize("x=2, y=3"), normalize("\\\\frac{3}{4"), normalize("{7}")
    ('(2,3)', '\\\\frac{3}{4}', '7')
    >>> normalize("12\\\\pi \\\\text{ square units}")
    '12\\\\pi'

    """
    s = _clean(answer)
    if re.search(r"[\w})]\s*\\(?:text|mathrm|mbox|textrm)\s*\{", s):
        s = _UNIT_TEXT.sub("", s).strip()
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
    repeating = ellipsis_value(s)
    if repeating is not None:  # "0.1666..." -> 1/6; "0.16..." shows no repetition and stays as written
        return repeating if repeating != "?" else s
    s = mixed_to_fraction(repeating_to_fraction(s.rstrip(".").strip()))
    return s.rstrip(".").strip()


# --- several values -----------------------------------------------------------------------------

_OPEN, _CLOSE = "([{", ")]}"
_WORD_SPLIT = re.compile(r"\\text\s*\{\s*(or|and)\s*\}|\\lor\b|\\vee\b|\\land\b|\\wedge\b|\s(or|and)\s")
_LEADING = re.compile(r"^\s*(?:either|both)\s+", re.IGNORECASE)
_PLUS_MINUS = re.compile(r"\\pm(?![a-z])\s*")  # not \pmod


def _top_level_splits(s: str) -> list[tuple[int, int, bool]]:
    """(start, end, is_or) of the separators at bracket depth 0: commas, "or", "and"."""
    depth, out = 0, []
    words = {m.start(): m for m in _WORD_SPLIT.finditer(s)}
    j = 0
    while j < len(s):
        ch = s[j]
        if depth == 0 and j in words:
            m = words[j]
            text = m.group()
            out.append((m.start(), m.end(), "or" in text or "vee" in text))
            j = m.end()
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            out.append((j, j + 1, False))
        j += 1
    return out


def split_values(text: str) -> tuple[list[str], bool]:
    """The values an answer states, and whether it joined them with "or".

    >>> split_values("x = 2 \\\\text{ or } x = -3"), split_values("\\\\{-3, 2\\\\}"), split_values("(3, 4)")
    ((['2', '-3'], True), (['-3', '2'], False), (['(3, 4)'], False))
    >>> split_values("\\\\pm 3"), split_values("1,000")
    ((['3', '-3'], False), (['1,000'], False))
    """
    s = _clean(text)
    s = _strip_outer_braces(s)
    if s.startswith("\\{") and s.endswith("\\}") and s[2:-2].strip():
        s = s[2:-2].strip()
    if _THOUSANDS.fullmatch(s) or _ASSIGNMENTS.match(s):
        return [s], False
    cuts = _top_level_splits(s)
    pieces, start = [], 0
    for a, b, _ in cuts:
        pieces.append(s[start:a])
        start = b
    pieces.append(s[start:])
    values: list[str] = []
    for piece in pieces:
        piece = _LEADING.sub("", piece).strip()
        if len(pieces) > 1:
            piece = _SIMPLE_LHS.sub("", piece).strip()
        if len(_PLUS_MINUS.findall(piece)) == 1 and "\\mp" not in piece:  # a \pm b names a + b and a - b
            piece = _SIMPLE_LHS.sub("", _PLUS_MINUS.sub(r"\\pm", piece)).strip()
            values += [_PLUS_MINUS.sub("+", piece).removeprefix("+"), _PLUS_MINUS.sub("-", piece)]
        elif piece:
            values.append(piece)
    return values or [s], any(is_or for _, _, is_or in cuts)


def arity(label: str) -> int:
    """How many values the label has: its listed values, or a tuple's entries.

    >>> arity("2, -3"), arity("(3, 4)"), arity("7"), arity("(-\\\\infty, 2]")
    (2, 2, 1, 1)
    """
    values, _ = split_values(label)
    if len(values) > 1:
        return len(values)
    s = normalize(values[0])
    if s.startswith("(") and s.endswith(")") and "\\infty" not in s:
        return len(split_values(s[1:-1])[0])
    return 1


# --- sets ---------------------------------------------------------------------------------------

_EMPTY = re.compile(
    r"\\emptyset|\\varnothing|∅|\\\{\s*\\\}|\{\s*\}|none|empty set|the empty set|"
    r"(?:there (?:are|is) )?no(?:\s+real)?\s+(?:solutions?|roots?|values?|such \w+)(?: exists?)?",
    re.IGNORECASE,
)
_SET_WORD = re.compile(r"\breal|\\mathbb|ℝ", re.IGNORECASE)
_RELATION = re.compile(r"<|>|\\le|\\ge|\\lt|\\gt|≤|≥")


def is_empty_set(answer: str) -> bool:
    """Whether ``answer`` says "no solution" in any common way.

    >>> is_empty_set("\\\\text{no real solutions}"), is_empty_set("\\\\varnothing"), is_empty_set("0")
    (True, True, False)
    """
    s = _WRAPPERS.sub("", _clean(answer)).replace("{", " {").strip(" .")
    s = re.sub(r"\s+", " ", s.replace(" {", "{")).strip()
    s = _strip_outer_braces(s).strip(" .")
    return _EMPTY.fullmatch(s) is not None


def _set_words(answer: str) -> str:
    """A set of reals in words ("all real numbers except 2", ``\\mathbb{R}``) as the interval it
    names (``math_words``); anything else unchanged."""
    if not _SET_WORD.search(answer):
        return answer
    return words_to_set(answer) or answer


def _as_set(values: list[str], timeout: int | None):
    """The set of reals the values describe (an interval union, or inequalities joined by "or")."""
    import sympy

    sets = []
    for v in values:
        parsed = _parse(normalize(v), timeout)
        if not parsed or isinstance(parsed[0], str):
            return None
        obj = parsed[0]
        if isinstance(obj, sympy.Set):
            sets.append(obj)
        elif isinstance(obj, (sympy.core.relational.Relational, sympy.logic.boolalg.BooleanFunction)) \
                and len(obj.free_symbols) == 1:
            try:
                sets.append(obj.as_set())
            except (NotImplementedError, TypeError, ValueError):
                return None
        else:
            return None
    return sympy.Union(*sets) if sets else None


def _relations(values: list[str]) -> bool:
    return any(_RELATION.search(v) for v in values) and all(
        _RELATION.search(v) or "\\infty" in v or "\\cup" in v for v in values
    )


# --- one value against one value ----------------------------------------------------------------

_PERCENT = re.compile(r"\s*(?:\\%|%|\\text\s*\{\s*\\?%\s*\}|\\text\s*\{\s*percent\s*\}|percent)\s*$")
_SCALE = re.compile(
    r"(?<=[\d}.])\s*(?:\\text\s*\{\s*|\\mathrm\s*\{\s*)?(thousand|million|billion|trillion)s?\b\s*\}?",
    re.IGNORECASE,
)
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}


def _scaled(answer: str, policy: str) -> tuple[str, Fraction, bool]:
    """``(value text, factor, bare number also counts)``: ``25\\%`` -> ``('25', 1/100, True)``.

    >>> _scaled("25\\\\%", "value"), _scaled("3.5 \\\\text{ million}", "value"), _scaled("25%", "number")
    (('25', Fraction(1, 100), True), ('3.5', Fraction(1000000, 1), True), ('25', Fraction(1, 1), False))
    """
    s = _clean(answer)
    s = s if _ENDS_IN_ELLIPSIS.search(s) else s.rstrip(".").strip()
    m = _PERCENT.search(s)
    if m and m.start() > 0:
        core = s[: m.start()].strip()
        if policy == "number":
            return core, Fraction(1), False
        return core, Fraction(1, 100), policy == "value"
    scales = list(_SCALE.finditer(s))
    if len(scales) == 1:
        core = (s[: scales[0].start()] + s[scales[0].end() :]).strip()
        return core, Fraction(_SCALES[scales[0].group(1).lower()]), True
    return s, Fraction(1), False


def _places(places: int | None, factor: Fraction) -> int | None:
    """Decimal places of a written number once scaled: ``33%`` is 0.33 (2 places), ``2.5 million`` 0."""
    if factor == 1:
        return places
    shift = len(str(factor.denominator)) - len(str(factor.numerator))  # 1/100 -> 2, 10**6 -> -6
    return max((places or 0) + shift, 0)


def _factor_latex(f: Fraction) -> str:
    return str(f.numerator) if f.denominator == 1 else f"\\frac{{{f.numerator}}}{{{f.denominator}}}"


def same_value(answer: str, label: str, opts: MathOptions = DEFAULT, timeout: int | None = None) -> bool:
    """One stated value against one label value (no lists): empty sets, percent, scale, then algebra."""
    empty_a, empty_g = is_empty_set(answer), is_empty_set(label)
    if empty_a or empty_g:
        return empty_a and empty_g
    answer, label = _set_words(answer), _set_words(label)
    congruent = congruence_equal(_clean(answer), _clean(label), _integer) if "mod" in answer + label else None
    if congruent is not None:  # "x \equiv 3 \pmod 7" (math_forms)
        return congruent
    common = in_common_unit(answer, label)  # "125 cents" for "\$1.25" (math_units)
    if common is not None:
        return bool(common) and _core_equal(common[0], common[1], opts, timeout)
    a, fa, bare_a = _scaled(answer, opts.percent_policy)
    g, fg, bare_g = _scaled(label, opts.percent_policy)
    if fa == fg:
        return _core_equal(a, g, opts, timeout)
    ra, rg = _rational(normalize(a)), _rational(normalize(g))
    if ra is not None and rg is not None:
        value = _numbers_equal((ra[0] * fa, _places(ra[1], fa)), (rg[0] * fg, _places(rg[1], fg)), opts)
    else:
        value = _core_equal(f"{_factor_latex(fa)}\\cdot({normalize(a)})", f"{_factor_latex(fg)}\\cdot({normalize(g)})",
                            opts, timeout)
    if value:
        return True
    # A sign or scale word written on one side only: the bare number also counts ("50%" vs "50").
    bare = (fg == 1 and bare_a) or (fa == 1 and bare_g)
    return bare and _core_equal(a, g, opts, timeout)


# --- numbers and algebra ------------------------------------------------------------------------

_HUGE_POWER = re.compile(r"\^\s*\{?\s*-?\d{4,}|\^\s*\{[^{}]*\^|\^\s*\d+\s*\^|\*\*\s*\d{4,}|\d{4,}\s*!")


def is_unsafe(expr: str) -> bool:
    """True when sympy could spend minutes or gigabytes on ``expr`` (huge powers, factorials).

    >>> is_unsafe("9^{9^{9}}"), is_unsafe("9^9^9"), is_unsafe("2^{1000000}"), is_unsafe("10000!")
    (True, True, True, True)
    >>> is_unsafe("2^{10}"), is_unsafe("10^{-3}"), is_unsafe("x^2 + y^2")
    (False, False, False)
    """
    return len(expr) > MAX_ANSWER_CHARS or bool(_HUGE_POWER.search(expr))


def _rational(text: str) -> tuple[Fraction, int | None] | None:
    """``text`` as an exact rational and its decimal places (None: not written as a decimal).

    >>> _rational("-\\\\frac{3}{4}"), _rational("1/8"), _rational("0.50"), _rational("x")
    ((Fraction(-3, 4), None), (Fraction(1, 8), None), (Fraction(1, 2), 2), None)
    """
    m = _RATIONAL.match(text)
    if not m:
        return None
    sign, num, den, num2, den2, dec = m.groups()
    try:
        if dec is not None:
            places = len(dec.partition(".")[2]) if "." in dec else None
            value = Fraction(Decimal(dec))
        else:
            value, places = Fraction(int(num or num2), int(den or den2)), None
    except (ZeroDivisionError, InvalidOperation, ValueError):
        return None
    return (-value if sign else value), places


def _integer(text: str) -> int | None:
    value = _rational(normalize(text))
    return int(value[0]) if value is not None and value[0].denominator == 1 and value[1] is None else None


def _numbers_equal(a: tuple[Fraction, int | None], g: tuple[Fraction, int | None], opts: MathOptions) -> bool:
    if a[0] == g[0]:
        return True
    return _approx_equal(float(a[0]), a[1], float(g[0]), g[1], opts)


def _approx_equal(a: float, a_places: int | None, g: float, g_places: int | None, opts: MathOptions) -> bool:
    """Only with ``--math-tolerance`` or a prompt that asks for an approximation."""
    if opts.tolerance > 0 and abs(a - g) <= opts.tolerance * max(abs(g), 1e-12):
        return True
    if not opts.approximate:
        return False
    if a_places is not None:  # a decimal answer must be the label rounded to the answer's places
        return abs(round(g, a_places) - a) < 10 ** -(a_places + 3)
    if g_places is not None:  # an exact answer must round to the decimal label
        return abs(round(a, g_places) - g) < 10 ** -(g_places + 3)
    return False


def _strip_lhs_unless_both(answer: str, label: str) -> tuple[str, str]:
    """Compare values, not names: ``x = 5`` against ``5`` compares ``5`` with ``5``."""
    a_eq, l_eq = bool(_SIMPLE_LHS.match(answer)), bool(_SIMPLE_LHS.match(label))
    if a_eq and not l_eq:
        answer = _SIMPLE_LHS.sub("", answer)
    elif l_eq and not a_eq:
        label = _SIMPLE_LHS.sub("", label)
    return answer, label


def _core_equal(answer: str, label: str, opts: MathOptions, timeout: int | None) -> bool:
    a_eq, g_eq = normalize(answer), normalize(label)
    a, g = _strip_lhs_unless_both(a_eq, g_eq)
    if bool(_MATRIX.match(a)) != bool(_MATRIX.match(g)):  # a vector against a tuple: compare entries
        a, g = _vector_to_tuple(a), _vector_to_tuple(g)
    if not a or not g:
        return False
    ra, rg = _rational(a), _rational(g)
    if ra is not None and rg is not None:
        return _numbers_equal(ra, rg, opts)
    if is_unsafe(a) or is_unsafe(g):
        return a.replace(" ", "") == g.replace(" ", "")
    if _ELLIPSIS.search(a) or _ELLIPSIS.search(g):  # a decimal whose ellipsis names no exact value
        return a.replace(" ", "") == g.replace(" ", "")
    if _math_verify(a, g, timeout):
        return True
    if one_equation(a_eq) and one_equation(g_eq):  # "x + 2y = 6" for "y = -x/2 + 3" (math_forms)
        return _same_curve(a_eq, g_eq, timeout)
    if opts.tolerance > 0 or opts.approximate:
        av, gv = _float_value(a, timeout), _float_value(g, timeout)
        if av is not None and gv is not None:
            return _approx_equal(av, ra[1] if ra else None, gv, rg[1] if rg else None, opts)
    return False


@functools.lru_cache(maxsize=8192)
def _parse(expr: str, timeout: int | None) -> tuple:
    # Cached: a label is parsed once for its whole group, and the n samples of a prompt often
    # write the same answer. Parsed sympy objects are immutable.
    return tuple(parse(
        f"${expr}$",
        extraction_config=[LatexExtractionConfig(boxed_match_priority=-1), ExprExtractionConfig()],
        parsing_timeout=timeout,
    ))


@functools.lru_cache(maxsize=8192)
def _same_curve(answer: str, label: str, timeout: int | None) -> bool:
    parsed_a, parsed_g = _parse(answer, timeout), _parse(label, timeout)
    return bool(parsed_a and parsed_g) and same_curve(parsed_a[0], parsed_g[0])


def _float_value(expr: str, timeout: int | None) -> float | None:
    parsed = _parse(expr, timeout)
    try:
        value = float(parsed[0].evalf()) if parsed and not isinstance(parsed[0], str) else None
    except (TypeError, ValueError, AttributeError):
        return None
    return value if value is not None and math.isfinite(value) else None


@functools.lru_cache(maxsize=8192)
def _math_verify(answer: str, label: str, timeout: int | None) -> bool:
    # Cached: the samples of one prompt often reach the same normalised answer.
    gold, pred = list(_parse(label, timeout)), list(_parse(answer, timeout))
    if not gold or not pred:
        return answer.replace(" ", "") == label.replace(" ", "")
    return bool(verify(gold, pred, float_rounding=EXACT_PLACES, allow_set_relation_comp=True,
                       timeout_seconds=timeout))


def timeout() -> int | None:
    """math-verify's alarm-based timeouts work only in the main thread; elsewhere they are off."""
    return MATH_VERIFY_TIMEOUT if threading.current_thread() is threading.main_thread() else None


# --- the entry point ----------------------------------------------------------------------------


def _same_collection(a_values: list[str], g_values: list[str], opts: MathOptions, t: int | None) -> bool:
    """The same values, order free; a value repeated in the answer counts once."""
    distinct: list[str] = []
    for v in a_values:
        if not any(same_value(v, d, opts, t) for d in distinct):
            distinct.append(v)
    if len(distinct) != len(g_values):
        return False
    unused = list(g_values)
    for v in distinct:
        match = next((g for g in unused if same_value(v, g, opts, t)), None)
        if match is None:
            return False
        unused.remove(match)
    return True


def is_equivalent(answer: str, label: str, opts: MathOptions = DEFAULT) -> bool:
    """Whether the extracted ``answer`` means the same as ``label`` (see the module rules).

    >>> is_equivalent("\\\\frac{1}{2}", "0.5"), is_equivalent("0.333333", "\\\\frac{1}{3}")
    (True, False)
    >>> is_equivalent("x = 2 \\\\text{ or } x = -3", "-3, 2"), is_equivalent("12 \\\\text{ or } 15", "12")
    (True, False)
    >>> is_equivalent("\\\\$12.50", "12.5"), is_equivalent("x = 5", "5"), is_equivalent("25\\\\%", "0.25")
    (True, True, True)
    """
    if len(answer) > 4 * MAX_ANSWER_CHARS:  # not a final answer anyone writes; no regex work on it
        return answer.strip() == label.strip()
    t = timeout()
    answer, label = _set_words(answer), _set_words(label)  # before splitting: "all reals except 2 and 3"
    common = in_common_unit(answer, label)  # before "\$" is cleaned away: "125 cents" for "\$1.25"
    if common is not None:
        return bool(common) and _core_equal(common[0], common[1], opts, t)
    a_values, a_or = split_values(answer)
    g_values, _ = split_values(label)
    if (len(a_values) > 1 or len(g_values) > 1) and (_relations(a_values) or _relations(g_values)):
        a_set, g_set = _as_set(a_values, t), _as_set(g_values, t)
        return a_set is not None and g_set is not None and a_set == g_set
    if len(g_values) > 1:
        if len(a_values) == 1:
            return same_value(answer, label, opts, t)
        return _same_collection(a_values, g_values, opts, t)
    if len(a_values) > 1 and not a_or and arity(label) == len(a_values):  # "a = 3 and b = 4" vs (3, 4)
        if same_value("(" + ", ".join(a_values) + ")", label, opts, t):
            return True
    return all(same_value(v, label, opts, t) for v in a_values)  # several values: each must be it
