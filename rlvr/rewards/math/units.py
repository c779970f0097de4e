"""Quantities with units, for ``--rm-type math``: the same amount in another unit of the label's kind.

A unit converts only when **both** sides name a unit this table knows, of the same kind: money
(``\\$``, dollars, cents, ``¢``), time, length, mass, volume, angle. Then ``125 \\text{ cents}``
equals the label ``\\$1.25`` and ``150`` minutes equals ``2.5 \\text{ hours}``, while ``2.5 kg`` is
not ``2.5 \\text{ g}``, and units of different kinds (``5 cm`` against ``5 \\text{ kg}``) are unequal.
A bare number is never converted: ``125`` against ``\\$1.25`` stays ``125`` (the label does not say
the answer is in cents), and ``125 cents`` against a bare label ``1.25`` is not converted either.
One exception: a whole number of cents under 100 against a bare label between 0 and 1 is read in
dollars (``40 cents`` = ``0.4``), as amounts under a dollar are the ones said in cents. A ``$`` that
opens a label or answer before a number, with no second ``$`` to close it as math, is a dollar sign
(``$0.40``).

Angles: a degree mark (``^\\circ``, ``°``, ``\\degree``, "degrees") is the number ``\\pi/180``, so ``60^\\circ`` also
equals a label written in radians with ``\\pi`` (``\\frac{\\pi}{3}``), and ``\\frac{\\pi}{3}`` equals a
label ``60^\\circ``. Against a bare label without ``\\pi`` the old reading stays (``60^\\circ`` = ``60``).
A degree mark followed by C or F is a temperature, not an angle.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import NamedTuple


class Quantity(NamedTuple):
    core: str  # the value without its unit
    kind: str  # "money", "time", "length", "mass", "volume", "angle"
    factor: Fraction  # the unit in the kind's base unit (dollar, second, metre, gram, litre, degree)


def _table() -> dict[str, tuple[str, Fraction]]:
    table: dict[str, tuple[str, Fraction]] = {}
    groups = {  # names (plural forms added below) -> (kind, size in the base unit); exact definitions
        "money": {"dollar": 1, "cent": Fraction(1, 100), "¢": Fraction(1, 100)},
        "time": {"second": 1, "sec": 1, "minute": 60, "min": 60, "hour": 3600, "hr": 3600, "day": 86400,
                 "week": 604800},
        "length": {"millimeter": Fraction(1, 1000), "millimetre": Fraction(1, 1000), "mm": Fraction(1, 1000),
                   "centimeter": Fraction(1, 100), "centimetre": Fraction(1, 100), "cm": Fraction(1, 100),
                   "meter": 1, "metre": 1, "kilometer": 1000, "kilometre": 1000, "km": 1000,
                   "inch": Fraction(127, 5000), "foot": Fraction(381, 1250), "feet": Fraction(381, 1250),
                   "ft": Fraction(381, 1250), "yard": Fraction(1143, 1250), "yd": Fraction(1143, 1250),
                   "mile": Fraction(201168, 125)},
        "mass": {"milligram": Fraction(1, 1000), "mg": Fraction(1, 1000), "gram": 1, "kilogram": 1000, "kg": 1000,
                 "pound": Fraction(45359237, 100000), "lb": Fraction(45359237, 100000),
                 "ounce": Fraction(45359237, 1600000), "oz": Fraction(45359237, 1600000)},
        "volume": {"milliliter": Fraction(1, 1000), "millilitre": Fraction(1, 1000), "ml": Fraction(1, 1000),
                   "liter": 1, "litre": 1},
        "angle": {"degree": 1, "deg": 1},
    }
    for kind, names in groups.items():
        for name, size in names.items():
            table[name] = (kind, Fraction(size))
            if len(name) > 3 and name not in ("feet",):
                table[name + ("es" if name.endswith("ch") else "s")] = (kind, Fraction(size))
    table.update({"hrs": table["hr"], "mins": table["min"], "secs": table["sec"], "lbs": table["lb"]})
    return table


_UNITS = _table()
UNIT_WORDS = frozenset(name for name in _UNITS if len(name) > 1 and name.isalpha())  # "cents", "km", "hours"
# One-letter units are read only inside \text{} / \mathrm{}: a bare "m" or "g" may be a variable.
_TEXT_ONLY = {"m": ("length", Fraction(1)), "g": ("mass", Fraction(1)), "l": ("volume", Fraction(1)),
              "s": ("time", Fraction(1)), "h": ("time", Fraction(3600))}
_IN_TEXT = re.compile(r"\\(?:text|mathrm|mbox|textrm|operatorname)\s*\{\s*~?\s*([A-Za-z¢]+)\s*\}\s*\.?\s*$")
_WORD = re.compile(r"(?<=[\d}\s])\s*([A-Za-z]{2,}|¢)\s*\.?\s*$")
# A degree mark, in every form a response writes it: "°", "^\circ", "^{\circ}", "\degree".
DEGREE_MARK = r"(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z]))"
_DEGREE = re.compile(rf"\s*{DEGREE_MARK}\s*$")
# A degree mark followed by C or F: a temperature, never an angle.
TEMPERATURE = re.compile(rf"{DEGREE_MARK}\s*(?:\\text\s*\{{\s*)?[CF]\b")
_SEVERAL = re.compile(r"\b(?:or|and)\b|,(?!\d{3}(?!\d))|=.*=")  # a list or a hedge is no one quantity
# A dollar sign: "\\$", or a "$" that opens the text before a number and no second "$" closes as math ("$0.40").
_DOLLAR_SIGN = re.compile(r"\\\$|^\s*\$(?=\s*-?\d)(?!.*\$)", re.DOTALL)
_MAYBE_UNIT = re.compile(r"[A-Za-z¢°]\s*\}?\s*\.?\s*\$?\s*$|\\\$|\\circ")  # cheap test before the real one
_SCALE_OR_PERCENT = re.compile(r"thousand|million|billion|trillion|%|percent", re.IGNORECASE)


def _unit(text: str) -> tuple[str, str, Fraction] | None:
    """``(text before the unit, kind, factor)`` for a trailing unit the table knows."""
    degree = _DEGREE.search(text)
    if degree:
        return text[: degree.start()], "angle", Fraction(1)
    for pattern, table in ((_IN_TEXT, {**_UNITS, **_TEXT_ONLY}), (_WORD, _UNITS)):
        m = pattern.search(text)
        if m:
            found = table.get(m.group(1).lower())
            return (text[: m.start()], *found) if found else None
    return None


def quantity(text: str) -> Quantity | None:
    """The value and unit of ``text`` when it ends in a unit this module knows, else None.

    >>> quantity("125 \\\\text{ cents}"), quantity("\\\\$1.25")
    (Quantity(core='125', kind='money', factor=Fraction(1, 100)), Quantity(core='1.25', kind='money', factor=Fraction(1, 1)))
    >>> quantity("60^\\\\circ")
    Quantity(core='60', kind='angle', factor=Fraction(1, 1))
    >>> quantity("12"), quantity("5 \\\\text{ million}"), quantity("30^\\\\circ C"), quantity("3 apples")
    (None, None, None, None)
    >>> quantity("$0.40"), quantity("$0.40$")
    (Quantity(core='0.40', kind='money', factor=Fraction(1, 1)), None)
    """
    money = _DOLLAR_SIGN.search(text) is not None
    if not money and not _MAYBE_UNIT.search(text):
        return None
    s = text.replace("\\$", " ").replace("$", " ").strip()
    if _SCALE_OR_PERCENT.search(s) or TEMPERATURE.search(s):
        return None
    found = _unit(s)
    if found is None:
        single = money and re.search(r"\d", s) and not _SEVERAL.search(s)
        return Quantity(s, "money", Fraction(1)) if single else None
    core, kind, factor = found
    core = re.sub(r"^[A-Za-z]\s*=\s*", "", core.strip())  # "x = 5 cm": the value is 5 cm
    if (money and kind != "money") or not re.search(r"\d|\\pi", core) or _SEVERAL.search(core):
        return None
    return Quantity(core, kind, factor)


def _exact(core: str) -> Fraction | None:
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)|(-?)\\frac\{(\d+)\}\{(\d+)\}|(-?\d+)\s*/\s*(\d+)", core.replace(",", "").strip())
    if m is None:
        return None
    if m.group(1):
        return Fraction(m.group(1))
    if m.group(3):
        value = Fraction(int(m.group(3)), int(m.group(4)))
        return -value if m.group(2) else value
    return Fraction(int(m.group(5)), int(m.group(6))) if int(m.group(6)) else None


def _scaled(core: str, factor: Fraction) -> str:
    """``core`` times ``factor`` as LaTeX; exact when ``core`` is a plain number."""
    value = _exact(core)
    if value is not None:
        value *= factor
        return str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    if factor == 1:
        return core
    return f"\\frac{{{factor.numerator}}}{{{factor.denominator}}}\\cdot({core})"


def _cents_as_dollars(cents: Quantity, label: str) -> tuple[str, str] | None:
    """``(dollars, label)`` for a whole number of cents under 100 against a bare label between 0 and 1,
    else None. Amounts under a dollar are the ones said in cents ("40 cents" for a label ``0.4``); a bare
    label of a dollar or more is not read as dollars (``125 cents`` against ``1.25`` stays unconverted).

    >>> _cents_as_dollars(quantity("40 cents"), "0.4"), _cents_as_dollars(quantity("125 cents"), "1.25")
    (('\\\\frac{2}{5}', '0.4'), None)
    """
    value, dollars = _exact(cents.core), _exact(label)
    if cents.kind != "money" or cents.factor != Fraction(1, 100) or value is None or dollars is None:
        return None
    if value.denominator != 1 or not 0 < value < 100 or not 0 < dollars < 1:
        return None
    return _scaled(cents.core, cents.factor), label


def in_common_unit(answer: str, label: str) -> tuple[str, str] | bool | None:
    """Both sides in one unit, as ``(answer, label)`` to compare; False when the units cannot be the
    same quantity; None when this module has no opinion (a bare number on either side, same unit).

    >>> in_common_unit("125 \\\\text{ cents}", "\\\\$1.25"), in_common_unit("125", "\\\\$1.25")
    (('\\\\frac{5}{4}', '\\\\frac{5}{4}'), None)
    >>> in_common_unit("5 cm", "5 \\\\text{ kg}"), in_common_unit("60^\\\\circ", "\\\\frac{\\\\pi}{3}")
    (False, ('\\\\frac{\\\\pi}{180}\\\\cdot(60)', '\\\\frac{\\\\pi}{3}'))
    """
    qa, qg = quantity(answer), quantity(label)
    dollars = _cents_as_dollars(qa, label) if qa is not None and qg is None else None
    if dollars is not None:
        return dollars
    if qa is not None and qg is not None:
        if qa.kind != qg.kind:
            return False
        if qa.factor == qg.factor:
            return None  # the same unit: the value comparison after stripping it decides
        return _scaled(qa.core, qa.factor), _scaled(qg.core, qg.factor)
    degrees, other = (qa, label) if qa is not None else (qg, answer)
    if degrees is None or degrees.kind != "angle" or "\\pi" not in other or quantity(other) is not None:
        return None
    in_radians = f"\\frac{{\\pi}}{{180}}\\cdot({degrees.core})"
    return (in_radians, label) if qa is not None else (answer, in_radians)
