"""The adversary registry: attacks are found by name (``text``, ``dos``, ``math``, ``code``) or by a dotted
path to a user's :class:`~dgrpo.adversary.base.Adversary` subclass."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dgrpo.registry import Registry

if TYPE_CHECKING:
    from dgrpo.adversary.base import Adversary

ADVERSARIES: Registry[type[Adversary]] = Registry("adversary")
