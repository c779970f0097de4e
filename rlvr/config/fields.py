"""How a config field is declared: a default, a one-line help, and its bounds.

The CLI flag of a field is derived from its name (``flag_of``); ``rlvr.config`` turns every field
of every group into a flag, so this is the one schema. Bounds are declared on the field, not
checked by hand in ``validate``: ``ge``/``gt``/``le``/``lt`` for numbers and ``choices`` for names.
``choices`` is a fixed list; a value that must be a registered name declares the registry's kind
(``names=``), and the runtime layer, which knows the registries, checks it once user plugins are
imported, so a name registered by user code is accepted. ``check_bounds`` enforces the rest (``None``
is always allowed for an optional field) and the
help text states them, so help and validation come from the same declaration.

>>> from dataclasses import dataclass
>>> @dataclass
... class G:
...     n: int = option(1, "how many", ge=1)
...     p: float = option(0.5, "a mass", gt=0, le=1)
>>> check_bounds(G(n=0))
Traceback (most recent call last):
...
rlvr.core.errors.ConfigError: --n: must be >= 1, got 0
>>> check_bounds(G(p=0.0))
Traceback (most recent call last):
...
rlvr.core.errors.ConfigError: --p: must be in (0, 1], got 0.0
>>> help_of(fields(G)[1])
'a mass (in (0, 1])'

Registry-backed names are not given to argparse (a plugin named on the same command line may
register the name), only listed in the help.
"""

from __future__ import annotations

import math
from dataclasses import Field, field, fields
from typing import Callable, Mapping

from rlvr.core.errors import ConfigError

Names = Mapping[str, Callable[[], list[str]]]  # registry kind -> its names now


def option(default, help: str, choices: list[str] | None = None, flag: str | None = None, *,
           names: str | None = None,
           ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None):
    """A dataclass field carrying its help text, choices and numeric bounds in ``metadata``;
    ``flag`` overrides the derived flag where the natural name is a Python keyword (``--async``).
    ``names`` says the value is a name registered in the registry of that kind (``"advantage
    estimator"``): the config cannot list those itself (the registries live in the layers above);
    ``rlvr.runtime.configure`` checks them and lists them in ``--help``."""
    meta = {"help": help}
    if choices is not None:
        meta["choices"] = choices
    if names is not None:
        meta["names"] = names
    if flag is not None:
        meta["flag"] = flag
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    if bounds:
        meta["bounds"] = bounds
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def flag_of(name: str) -> str:
    """CLI flag for a field name: ``eps_clip_high`` -> ``--eps-clip-high``."""
    return "--" + name.replace("_", "-")


def choices_of(f: Field, names: Names | None = None) -> list[str] | None:
    """The field's valid values: its fixed choices, or the names now registered for its kind in
    ``names``; None when free-form (or when ``names`` does not know the kind)."""
    kind = f.metadata.get("names")
    if kind is not None:
        return names[kind]() if names and kind in names else None
    return f.metadata.get("choices")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def bounds_text(bounds: dict[str, float]) -> str:
    """``{"ge": 1}`` -> ``>= 1``; ``{"gt": 0, "le": 1}`` -> ``in (0, 1]``."""
    low = ("[", bounds["ge"]) if "ge" in bounds else ("(", bounds["gt"]) if "gt" in bounds else None
    high = ("]", bounds["le"]) if "le" in bounds else (")", bounds["lt"]) if "lt" in bounds else None
    if low and high:
        return f"in {low[0]}{_num(low[1])}, {_num(high[1])}{high[0]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {_num(low[1])}"
    return f"{'<=' if high[0] == ']' else '<'} {_num(high[1])}"


def static_choices(f: Field) -> list[str] | None:
    """A fixed list of choices (argparse may check it); None for free-form or registry-backed
    fields, whose names are checked once user plugins are imported (``rlvr.runtime.configure``)."""
    return f.metadata.get("choices")


def help_of(f: Field, names: Names | None = None) -> str:
    """The field's help with its bounds, or a registry's current names, appended (``--help``)."""
    text, bounds = f.metadata["help"], f.metadata.get("bounds")
    if bounds:
        text += f" ({bounds_text(bounds)})"
    if "names" in f.metadata:
        registered = choices_of(f, names)
        text += (f" (registered: {', '.join(registered)})" if registered is not None else
                 f" (a registered {f.metadata['names']}; an unknown name is refused at start-up with the list)")
    return text


def _in_bounds(value: float, bounds: dict[str, float]) -> bool:
    checks = {"ge": value >= bounds.get("ge", -math.inf), "gt": value > bounds.get("gt", -math.inf),
              "le": value <= bounds.get("le", math.inf), "lt": value < bounds.get("lt", math.inf)}
    return all(checks[k] for k in bounds)


def check_bounds(group) -> None:
    """Raise ``ConfigError`` naming the flag for the first field of ``group`` (a config dataclass
    instance) outside its declared bounds or choices."""
    for f in fields(group):
        value = getattr(group, f.name)
        if value is None:
            continue
        flag = f.metadata.get("flag", flag_of(f.name))
        bounds = f.metadata.get("bounds")
        if bounds and not _in_bounds(value, bounds):
            raise ConfigError(flag, f"must be {bounds_text(bounds)}, got {value}")
        valid = static_choices(f)  # registry names: rlvr.runtime.configure.check_names
        if valid is not None and value not in valid:
            raise ConfigError(flag, f"unknown value {value!r}; valid: {', '.join(valid)}")
