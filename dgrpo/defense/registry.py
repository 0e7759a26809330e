"""The defense registry: filters are found by name (``logit``, ``sampling-proof``, ``surprisal``,
``repetition``, ``meaning``, ``judge``, ``arith-check``, ``arith-pattern``, ``code-policy``, ``length``,
``length-shift``) or by a dotted path to a user's :class:`~dgrpo.defense.base.Defense` subclass. Named chains
(``heterogeneous``) are in :data:`dgrpo.config.defense.CHAIN_PRESETS`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dgrpo.registry import Registry

if TYPE_CHECKING:
    from dgrpo.defense.base import Defense

DEFENSES: Registry[type[Defense]] = Registry("defense")
