"""How a config field is declared: a default, a one-line help and optional choices (STYLE point 5).

The CLI flag of a field is derived from its name (``flag_of``); ``rlvr.config`` turns every field
of every group into a flag, so this is the one schema.
"""

from __future__ import annotations

from dataclasses import field


def option(default, help: str, choices: list[str] | None = None, flag: str | None = None):
    """A dataclass field carrying its help text (and choices) in ``metadata``; ``flag`` overrides
    the derived flag where the natural name is a Python keyword (``--async``)."""
    meta = {"help": help}
    if choices is not None:
        meta["choices"] = choices
    if flag is not None:
        meta["flag"] = flag
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def flag_of(name: str) -> str:
    """CLI flag for a field name: ``eps_clip_high`` -> ``--eps-clip-high``."""
    return "--" + name.replace("_", "-")
