"""A small explicit registry: names map to objects, filled by decorators.

Formats, engine backends (names in `backends.py`, builders in `engines/builders.py`),
gates (`gate_registry.py`) and task suites each live in one, so adding one never touches a dispatcher.
Duplicate names raise; an unknown name answers with the closest match and the full list.

>>> engines = Registry("engine")
>>> @engines.register("plain")
... def make_plain(): return "plain"
>>> engines.get("plain")()
'plain'
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Generic, Iterator, TypeVar

from .errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        if name not in self._items:
            raise ConfigError(self.unknown_message(name))
        return self._items[name]

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self._items), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return f"unknown {self.kind} {name!r}.{hint} Available: {', '.join(sorted(self._items))}."

    def ordered(self) -> list[T]:
        """Items in registration order (gates run in this order)."""
        return list(self._items.values())

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))


def read_on_first_use(module: str, **build: Callable[[], Any]) -> Callable[[str], Any]:
    """A module's `__getattr__` for attributes built when they are first read (PEP 562): a package that lists
    every gate's parts (`qval.gates.GATES`, `qval.results.TYPES`, `qval.report.sections.MARKDOWN`) imports none of
    them until a caller reads the list. Each builder keeps what it built (`functools.cache`), so the module's own
    functions that read the list call the builder and share the one copy.

    >>> from functools import cache
    >>> calls = []
    >>> getattr_ = read_on_first_use("m", ITEMS=cache(lambda: calls.append(1) or [1, 2]))
    >>> getattr_("ITEMS"), getattr_("ITEMS") is getattr_("ITEMS"), calls
    ([1, 2], True, [1])
    >>> getattr_("OTHER")
    Traceback (most recent call last):
    AttributeError: module 'm' has no attribute 'OTHER'
    """

    def __getattr__(name: str) -> Any:
        if name not in build:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return build[name]()

    return __getattr__
