"""The defense registry: filters are found by name (``logit``, ``sampling-proof``, ``surprisal``,
``repetition``, ``judge``, ``arith-check``, ``code-policy``, ``length``) or by a dotted path to a user's
:class:`~dgrpo.defense.base.Defense` subclass."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dgrpo.registry import Registry

if TYPE_CHECKING:
    from dgrpo.defense.base import Defense

DEFENSES: Registry[type[Defense]] = Registry("defense")
