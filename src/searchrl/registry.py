"""Named extension points (answer metrics, retrievers, backends, advantages, ...).

Each extension point owns one `Registry`; code dispatches only through it, so adding an
implementation never means editing an if/elif chain elsewhere.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from searchrl.errors import SearchRLError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> object table; registering a name twice is an error."""

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
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise SearchRLError(f"unknown {self.kind} {name!r}; choose one of: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
