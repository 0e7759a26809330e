"""Name -> plug-in registries (tasks, adversaries, defenses, aggregators).

Modelled on TRL's reward registry: a plug-in is found by its registered name, with a dotted-path fallback
(``package.module:Name`` or ``package.module.Name``) for user code; an unknown name is an error that lists
the known ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from dgrpo.errors import ConfigError, UnknownNameError

T = TypeVar("T")
R = TypeVar("R")


class Registry(Generic[T]):
    """A named collection of plug-ins of one kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``; a duplicate name is a bug and raises."""

        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        if name in self._items:
            return self._items[name]
        if "." in name or ":" in name:
            module_name, _, attr = name.replace(":", ".").rpartition(".")
            try:
                module = importlib.import_module(module_name)
                obj: T = getattr(module, attr)
            except (ImportError, AttributeError, ValueError) as exc:
                raise UnknownNameError(self.kind, name, self._items) from exc
            return obj
        raise UnknownNameError(self.kind, name, self._items)

    def build(self: Registry[Callable[..., R]], name: str, options: Mapping[str, Any] | None = None) -> R:
        """The plug-in ``name`` called with ``options`` as keyword arguments; an option it does not take is a
        configuration error naming the plug-in."""
        factory = self.get(name)
        try:
            return factory(**dict(options or {}))
        except TypeError as exc:
            raise ConfigError(f"{self.kind} {name!r}: {exc}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
