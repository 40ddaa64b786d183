"""Named extension points (answer metrics, retrievers, backends, advantages, ...).

Each extension point owns one `Registry`; code dispatches only through it, so adding an
implementation never means editing an if/elif chain elsewhere. Where users plug in their own
(tools, reward terms), a name may also be an import path `package.module:name`, loaded by
`load_object` without registering it first.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

from searchrl.errors import SearchRLError

T = TypeVar("T")


def load_object(path: str, what: str) -> object:
    """The object the import path `package.module:name` names; `what` starts each error message
    (`"tool mypkg.tools:Weather"`). What kind of object it must be is the caller's to check."""
    module_name, _, name = path.partition(":")
    if not module_name or not name:
        raise SearchRLError(f"{what}: give an import path as package.module:name")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001  a user's module may fail in any way while it loads
        raise SearchRLError(f"{what}: cannot import {module_name} ({type(exc).__name__}: {exc}); "
                            "is its package installed, or its folder on PYTHONPATH?") from None
    obj = getattr(module, name, None)
    if obj is None:
        raise SearchRLError(f"{what}: {module_name} has no {name}")
    return obj


class Registry(Generic[T]):
    """A name -> object table; registering a name twice is an error. With `paths`, `get` also
    takes an import path `package.module:name` (a name with a colon) and loads it."""

    def __init__(self, kind: str, *, paths: bool = False) -> None:
        self.kind = kind
        self.paths = paths
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        if name in self._items:
            return self._items[name]
        if self.paths and ":" in name:
            return load_object(name, f"{self.kind} {name}")
        known = ", ".join(sorted(self._items)) or "(none)"
        own = ", or give your own as package.module:name" if self.paths else ""
        raise SearchRLError(f"unknown {self.kind} {name!r}; choose one of: {known}{own}")

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
