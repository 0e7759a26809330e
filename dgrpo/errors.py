"""The project's exceptions. Every error dgrpo raises on purpose derives from :class:`DgrpoError`.

Hostile input (a malformed completion, a forged message) gets a verdict, not an exception; these are for
misconfiguration and bugs a user must see.
"""

from __future__ import annotations

from collections.abc import Iterable


class DgrpoError(Exception):
    """Base class of all dgrpo errors."""


class ConfigError(DgrpoError):
    """A configuration value is invalid."""


class UnknownNameError(ConfigError):
    """A registry lookup failed; the message lists the valid names."""

    def __init__(self, kind: str, name: str, known: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = sorted(known)
        super().__init__(f"unknown {kind} {name!r}; valid {kind} names: {', '.join(self.known) or '(none)'}")


class ModelNotFoundError(DgrpoError):
    """A model path or name cannot be resolved to weights."""


class DataNotFoundError(DgrpoError):
    """A task's data file cannot be found or read."""
