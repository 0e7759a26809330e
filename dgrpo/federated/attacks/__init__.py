"""Federated adversaries, registered by name: ``std-inflate``, ``scale``, ``sign-flip``."""

from dgrpo.federated.attacks import scale as scale
from dgrpo.federated.attacks import sign_flip as sign_flip
from dgrpo.federated.attacks import std_inflate as std_inflate
from dgrpo.federated.attacks.base import FED_ATTACKS, UpdateAttack, build_attack

__all__ = ["FED_ATTACKS", "UpdateAttack", "build_attack"]
