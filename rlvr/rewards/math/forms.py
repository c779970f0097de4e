"""Other ways to write the same answer, for ``--rm-type math``: equations, congruences, ellipses.

- **Equations of one curve.** Two equations (one ``=`` each, in the same variables) are the same
  line, plane or curve when ``lhs - rhs`` of one is a nonzero constant times that of the other,
  after clearing denominators: ``x + 2y = 6`` is ``y = -\\frac{x}{2} + 3``, ``(x-1)^2 + (y+2)^2 = 9`` is
  ``x^2 + y^2 - 2x + 4y - 4 = 0``. Proportional polynomials have equal solution sets; this check
  never credits a different curve (it may miss exotic equal ones: ``x^2 + y^2 = 0`` vs
  ``x^2 + 2y^2 = 0``). sympy (through math-verify's parser) does the algebra.
- **Congruences.** ``x \\equiv 3 \\pmod{7}``, ``4 \\pmod 9``, ``3 (mod 7)``: against a residue label
  the residue must be the label and a least residue (``0 <= r < m``); against a congruence label
  the moduli must be equal and the residues congruent. The modulus alone is never the answer.
- **Repeating decimals and mixed numbers** as exact fractions: ``0.1\\overline{6}`` = 1/6,
  ``3 1/2`` = ``3\\frac{1}{2}`` = 7/2 (``31/2`` is 15.5).
- **Repeating decimals with an ellipsis.** ``0.1666...`` (also ``\\ldots``, ``\\dots``, ``…``) is
  the repeating decimal its digits show: the shortest block that repeats at least twice at the
  end (``0.1666...`` = 1/6, ``0.272727...`` = 3/11). Digits that show no repetition (``0.16...``)
  name no exact value and equal nothing.
"""

from __future__ import annotations

import re
from fractions import Fraction

# --- repeating decimals and mixed numbers -------------------------------------------------------

_OVERLINE = re.compile(r"^(-?)(\d*)\.(\d*)\\overline\{(\d+)\}$")
_MIXED = re.compile(r"^(-?)(\d+)\s+(\d+)\s*/\s*(\d+)$|^(-?)(\d+)\s*\\frac\{(\d+)\}\{(\d+)\}$")


def repeating_to_fraction(text: str) -> str:
    """``0.\\overline{3}`` -> ``\\frac{1}{3}``: a repeating decimal as an exact fraction.

    >>> repeating_to_fraction("0.\\\\overline{3}"), repeating_to_fraction("1.2\\\\overline{45}")
    ('\\\\frac{1}{3}', '\\\\frac{137}{110}')
    """
    m = _OVERLINE.match(text)
    if not m:
        return text
    sign, whole, fixed, rep = m.groups()
    value = Fraction(int(whole or 0)) + Fraction(int(fixed or 0), 10 ** len(fixed))
    value += Fraction(int(rep), 10 ** len(fixed) * (10 ** len(rep) - 1))
    return f"{sign}\\frac{{{value.numerator}}}{{{value.denominator}}}"


def mixed_to_fraction(text: str) -> str:
    """``3 1/2`` or ``3\\frac{1}{2}`` (a proper fraction after a whole number) -> ``\\frac{7}{2}``.

    >>> mixed_to_fraction("3 1/2"), mixed_to_fraction("-2\\\\frac{3}{4}"), mixed_to_fraction("31/2")
    ('\\\\frac{7}{2}', '-\\\\frac{11}{4}', '31/2')
    """
    m = _MIXED.match(text)
    if not m:
        return text
    sign, whole, num, den = m.groups()[:4] if m.group(2) else m.groups()[4:]
    if int(den) == 0 or int(num) >= int(den):
        return text
    value = int(whole) + Fraction(int(num), int(den))
    return f"{sign}\\frac{{{value.numerator}}}{{{value.denominator}}}"


ELLIPSIS = r"(?:\.{3}|…|\\[lc]?dots\b)"
_ELLIPSIS_DECIMAL = re.compile(rf"^(-?)(\d*)\.(\d+)\s*{ELLIPSIS}$")


def _repetend(digits: str) -> tuple[int, int] | None:
    """``(preperiod, period)``: the shortest block that repeats at least twice to the end of ``digits``
    (a last partial block allowed), found with the shortest period first."""
    for period in range(1, len(digits) // 2 + 1):
        for pre in range(len(digits) - 2 * period + 1):
            block = digits[pre : pre + period]
            tail = digits[pre:]
            repeats = block * (len(tail) // period + 1)
            if tail == repeats[: len(tail)] and len(tail) >= 2 * period:
                return pre, period
    return None


def ellipsis_value(text: str) -> str | None:
    """The exact fraction a decimal with an ellipsis shows, ``"?"`` when it shows no repetition,
    None when ``text`` is no such decimal.

    >>> ellipsis_value("0.1666..."), ellipsis_value("0.272727\\\\ldots"), ellipsis_value("2.3333…")
    ('\\\\frac{1}{6}', '\\\\frac{3}{11}', '\\\\frac{7}{3}')
    >>> ellipsis_value("0.16..."), ellipsis_value("0.1666")
    ('?', None)
    """
    m = _ELLIPSIS_DECIMAL.match(text.strip())
    if m is None:
        return None
    sign, whole, digits = m.groups()
    found = _repetend(digits)
    if found is None:
        return "?"
    pre, period = found
    fixed, block = digits[:pre], digits[pre : pre + period]
    value = Fraction(int(whole or 0)) + Fraction(int(fixed or 0), 10**pre)
    value += Fraction(int(block), 10**pre * (10**period - 1))
    return f"{sign}\\frac{{{value.numerator}}}{{{value.denominator}}}"


# --- congruences --------------------------------------------------------------------------------

_CONGRUENCE = re.compile(
    r"^(?:.*(?:\\equiv|≡)\s*)?(-?\d+)\s*"
    r"(?:\\pmod\s*\{?\s*(\d+)\s*\}?|\(\s*(?:\\(?:text|mathrm|operatorname|bmod)\s*\{?\s*)?mod\s*\}?\s*(\d+)\s*\)|"
    r"\\(?:bmod|mod)\s*\{?\s*(\d+)\s*\}?|\s+mod\s+(\d+))\s*\.?$",
    re.DOTALL,
)


def congruence(text: str) -> tuple[int, int] | None:
    """``(residue, modulus)`` of ``x \\equiv 3 \\pmod{7}``, ``4 \\pmod 9``, ``3 (mod 7)``; else None.

    >>> congruence("x \\\\equiv 3 \\\\pmod{7}"), congruence("4 \\\\pmod 9"), congruence("x ≡ 3 (mod 7)"), congruence("3")
    ((3, 7), (4, 9), (3, 7), None)
    """
    m = _CONGRUENCE.match(text.strip())
    if m is None:
        return None
    modulus = int(next(g for g in m.groups()[1:] if g is not None))
    return (int(m.group(1)), modulus) if modulus > 0 else None


def congruence_equal(answer: str, label: str, integer_of) -> bool | None:
    """Whether the answer matches when either side is a congruence; None when neither is one.

    ``integer_of(text)`` reads a plain integer (None if ``text`` is none).

    >>> read = lambda t: int(t) if t.lstrip("-").isdigit() else None
    >>> congruence_equal("x \\\\equiv 3 \\\\pmod 7", "3", read), congruence_equal("3 (mod 7)", "7", read)
    (True, False)
    >>> congruence_equal("x ≡ 10 (mod 7)", "x \\\\equiv 3 \\\\pmod{7}", read), congruence_equal("3", "3 \\\\pmod 8", read)
    (True, True)
    """
    ca, cg = congruence(answer), congruence(label)
    if ca is None and cg is None:
        return None
    if ca is not None and cg is not None:
        return ca[1] == cg[1] and (ca[0] - cg[0]) % ca[1] == 0
    if ca is not None:  # a residue label: the stated residue must be it, and a least residue
        value = integer_of(label)
        return value is not None and 0 <= ca[0] < ca[1] and ca[0] == value
    value = integer_of(answer)  # a congruence label: a bare least residue of that class
    return value is not None and 0 <= value < cg[1] and (value - cg[0]) % cg[1] == 0


# --- equations ----------------------------------------------------------------------------------


def one_equation(text: str) -> bool:
    """Whether ``text`` is one equation (one ``=``, no inequality or congruence signs)."""
    return text.count("=") == 1 and not re.search(r"[<>]=|=[<>]|\\[lgn]eq?\b|\\equiv|≡|≠|≤|≥|\\approx", text)


def same_curve(answer_eq, label_eq) -> bool:
    """Whether two parsed sympy equations have proportional ``lhs - rhs`` (denominators cleared)."""
    import sympy

    if not all(isinstance(e, sympy.Equality) for e in (answer_eq, label_eq)):
        return False
    symbols = answer_eq.free_symbols
    if not symbols or symbols != label_eq.free_symbols:
        return False
    try:
        a = sympy.fraction(sympy.together(answer_eq.lhs - answer_eq.rhs))[0]
        g = sympy.fraction(sympy.together(label_eq.lhs - label_eq.rhs))[0]
        if a == 0 or g == 0:
            return False
        ratio = sympy.cancel(a / g)
    except (TypeError, ValueError, ZeroDivisionError, sympy.SympifyError, NotImplementedError):
        return False
    return not ratio.free_symbols and ratio.is_number and bool(ratio != 0) and bool(ratio.is_finite)
