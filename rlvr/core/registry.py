"""Named registries: one per extension point, one dispatch site (STYLE.md point 2).

>>> R = Registry("advantage estimator", flag="--advantage-estimator")
>>> @R.register("grpo")
... def grpo(x):
...     return x
>>> R["grpo"](1)
1
>>> R["nope"]
Traceback (most recent call last):
...
KeyError: "unknown advantage estimator 'nope' (--advantage-estimator); valid: grpo"
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")

# Other systems' dotted paths: each function maps a path to the rlvr name it stands for
# (PATH_ALIASES) or to a message naming rlvr's counterpart (PATH_HINTS), None when it does not
# know the path. rlvr.compat.slime appends slime's when it is imported.
PATH_ALIASES: list[Callable[[str], str | None]] = []
PATH_HINTS: list[Callable[[str], str | None]] = []


class Registry(Generic[T]):
    """A name -> object table. Unknown names fail with the valid list; duplicates fail."""

    def __init__(self, kind: str, flag: str | None = None, builtins: tuple[str, ...] = ()):
        self.kind = kind
        self.flag = flag
        self._items: dict[str, T] = {}
        # Modules whose entries register themselves on import, imported on the first read: so
        # the registry's contents never depend on what happened to be imported before, and
        # importing the registry stays cheap (a reward's heavy dependencies load when asked for).
        self._builtins = builtins

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def unregister(self, name: str) -> None:
        """Remove a name (a plugin's test cleaning up after itself); unknown names fail as lookups do."""
        self[name]
        del self._items[name]

    def _load_builtins(self) -> None:
        if self._builtins:
            modules, self._builtins = self._builtins, ()
            for module in modules:
                importlib.import_module(module)

    def __getitem__(self, name: str) -> T:
        self._load_builtins()
        try:
            return self._items[name]
        except KeyError:
            where = f" ({self.flag})" if self.flag else ""
            raise KeyError(
                f"unknown {self.kind} {name!r}{where}; valid: {', '.join(sorted(self._items))}"
            ) from None

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def names(self) -> list[str]:
        self._load_builtins()
        return sorted(self._items)


def load_function(path: str, flag: str) -> Callable:
    """Import a user function given as ``"pkg.module:fn"`` or ``"pkg.module.fn"``.

    Failures raise ``ConfigError(flag, ...)`` saying what could not be found.
    """
    from rlvr.core.errors import ConfigError

    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(flag, f"{path!r} is not 'pkg.module:function' or 'pkg.module.function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        hint = next((h for f in PATH_HINTS if (h := f(path))), None)  # e.g. slime's modules
        raise ConfigError(flag, hint or f"cannot import module {module_name!r} from {path!r}: {e}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(flag, f"module {module_name!r} has no callable {attr!r}")
    return fn


def resolve(registry: Registry[T], name_or_path: str, flag: str) -> T:
    """A registered name, or else a dotted path to a user function (slime's path of a function
    rlvr registers under a name, e.g. its nonzero-std filter, is that name)."""
    name_or_path = next((a for f in PATH_ALIASES if (a := f(name_or_path))), name_or_path)
    if name_or_path in registry:
        return registry[name_or_path]
    if "." not in name_or_path and ":" not in name_or_path:
        registry[name_or_path]  # raises with the list of valid names
    return load_function(name_or_path, flag)
