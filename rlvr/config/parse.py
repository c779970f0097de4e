"""Flags and YAML files to a ``Config``: the argparse parser generated from the fields, the YAML
reader (flat or grouped by section, hyphens or underscores; or the nested slime schema,
``rlvr.compat.slime.seed_config``) and the type checks of its values.

Each field of each group is a flag (``--`` + name with hyphens; its help from the field); a YAML
file given by ``--config`` holds the same names, and flags given on the command line override
it. slime's flags that rlvr spells differently are mapped onto its fields
(``rlvr.compat.slime.flags``, docs/slime_flags.md). ``rlvr.runtime.configure.parse_config`` puts
these together with the checks that need the implementations.
"""

from __future__ import annotations

import argparse
import difflib
import types
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import yaml

from rlvr.compat.slime import flags as slime_flags
from rlvr.compat.slime import seed_config
from rlvr.config.fields import Names, flag_of, help_of, static_choices
from rlvr.config.root import ALIASES, FIELDS, GROUPS, Config
from rlvr.core.errors import ConfigError


# Every field's default, flat: what the nested schema's derived sizes fall back on.
DEFAULTS = {n: f.default if f.default is not MISSING else f.default_factory() for n, (_, f) in FIELDS.items()}


def _annotation(tp: Any) -> Any:
    return eval(tp, vars(typing), {}) if isinstance(tp, str) else tp  # noqa: S307 (our own annotations)


def _optional(tp: Any) -> bool:
    tp = _annotation(tp)
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _or_none(parse):
    """Flag parser for an optional field: ``none`` / ``null`` unsets a value the YAML file set."""

    def convert(text: str):
        return None if text.lower() in ("none", "null") else parse(text)

    convert.__name__ = parse.__name__  # argparse names the type in its error messages
    return convert


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(inner type, is_list) of an annotation like ``float | None`` or ``list[str]``."""
    tp = _annotation(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0]
    if typing.get_origin(tp) is list:
        return typing.get_args(tp)[0], True
    return tp, False


def add_config_arguments(parser: argparse.ArgumentParser, names: Names | None = None) -> None:
    """Add every config field as a flag whose default is 'not given' (so YAML can fill it);
    ``names`` (registry kind -> names) lets the help list the registered names."""
    parser.add_argument("--config", help="YAML file with the same fields; flags override it")
    slime_flags.add_arguments(parser, set(FIELDS) | set(ALIASES))
    for group, cls in GROUPS.items():
        section = parser.add_argument_group(group, cls.__doc__)
        for f in fields(cls):
            tp, is_list = _base_type(f.type)
            kwargs: dict[str, Any] = dict(dest=f.name, default=argparse.SUPPRESS, help=help_of(f, names))
            if tp is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["type"] = _or_none(tp) if _optional(f.type) else tp
                if is_list:
                    kwargs["nargs"] = "+"
                if static_choices(f) is not None:  # registry names: checked after plugins load
                    kwargs["choices"] = static_choices(f)
            section.add_argument(f.metadata.get("flag", flag_of(f.name)), **kwargs)


def make_parser(prog: str = "rlvr train", names: Names | None = None) -> argparse.ArgumentParser:
    """Every config field as a flag. Declarative: building it (and ``--help``) imports no
    implementation; ``names`` (``rlvr.runtime.configure.NAMES``) lists the registries' names in
    the help, which otherwise says where they are checked."""
    parser = argparse.ArgumentParser(prog=prog)
    add_config_arguments(parser, names)
    return parser


def _read_yaml(path: str, given: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """``{field: (value, where it was read)}`` from a YAML file: rlvr's fields (flat or grouped),
    or the nested schema (``rlvr.compat.slime.seed_config``) with rlvr fields beside it.
    ``given`` (the fields the command line sets) is what the nested file's derived sizes need."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("--config", f"file not found: {path}")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError("--config", f"{path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError("--config", f"{path} must hold a mapping of field: value")
    if not seed_config.is_seed_schema(raw):
        return {name: (v, path) for name, v in _read_fields(raw, path).items()}
    seed = seed_config.read({k: v for k, v in raw.items() if k in seed_config.SEED_GROUPS}, path, given, DEFAULTS)
    flat = _read_fields({k: v for k, v in raw.items() if k not in seed_config.SEED_GROUPS}, path)
    if both := sorted(flat.keys() & seed.values.keys()):
        raise ConfigError("--config", f"{path}: {both[0]!r} is set twice, by {seed.origin[both[0]]} and by its own "
                                      "key; keep one")
    return {n: (v, f"{path}: {seed.origin[n]}") for n, v in seed.values.items()} | {n: (v, path) for n, v in flat.items()}


def _read_fields(raw: dict[str, Any], path: str) -> dict[str, Any]:
    """rlvr's own fields, flat (``eps-clip: 0.2``) or under their group (``algo: {eps_clip: 0.2}``)."""
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        if key in GROUPS and isinstance(value, dict):  # grouped form: algo: {eps_clip: 0.2}
            items = value.items()
        else:
            items = [(key, value)]
        for k, v in items:
            name = str(k).replace("-", "_")
            name = ALIASES.get(name, name)
            if name not in FIELDS:
                close = difflib.get_close_matches(name, FIELDS, n=1)
                hint = f"; did you mean {close[0].replace('_', '-')!r}?" if close else ""
                raise ConfigError("--config", f"{path}: unknown field {k!r}{hint}")
            flat[name] = v
    return flat


def _coerce(name: str, value: Any, source: str) -> Any:
    """Check a YAML value's type against the field's annotation."""
    f = FIELDS[name][1]
    tp, is_list = _base_type(f.type)
    if value is None:
        return None
    try:
        if is_list:
            values = value if isinstance(value, list) else str(value).split()
            return [tp(v) for v in values]
        if tp is bool and not isinstance(value, bool):
            raise TypeError
        if tp is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError
        value = tp(value)
    except (TypeError, ValueError):
        raise ConfigError(flag_of(name), f"{source}: expected {tp.__name__}, got {value!r}") from None
    choices = static_choices(f)  # registry names are checked by rlvr.runtime.configure, once plugins are imported
    if choices is not None and value not in choices:
        raise ConfigError(flag_of(name), f"{source}: unknown value {value!r}; valid: {', '.join(choices)}")
    return value


def build_config(values: dict[str, Any]) -> Config:
    """Config from flat ``{field_name: value}``; unset fields keep their defaults."""
    grouped: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
    for name, value in values.items():
        grouped[FIELDS[name][0]][name] = value
    return Config(**{g: GROUPS[g](**kw) for g, kw in grouped.items()})


def given_values(ns: argparse.Namespace) -> dict[str, Any]:
    """Flat ``{field: value}`` of what was given: YAML (``--config``) < flags, slime's own flags
    (``rlvr.compat.slime.flags``) mapped onto rlvr's fields; unset fields are absent."""
    given = {k: v for k, v in vars(ns).items() if k in FIELDS}
    values: dict[str, Any] = {}
    if getattr(ns, "config", None):
        for name, (v, source) in _read_yaml(ns.config, given).items():
            values[name] = _coerce(name, v, source)
    values.update(given)
    for name, text in slime_flags.apply(ns, values).items():  # slime-only flags (docs/slime_flags.md)
        tp = _base_type(FIELDS[name][1].type)[0]
        try:
            values.setdefault(name, tp(text))
        except ValueError:
            raise ConfigError(flag_of(name), f"expected {tp.__name__}, got {text!r}") from None
    return values
