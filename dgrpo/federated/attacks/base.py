"""Federated adversaries: a client that misreports its statistics or poisons its update, registered by name
like the completion attacks (``dgrpo.adversary``).

An attacking client trains like any other; the attack changes only what it sends: ``report`` its reward
statistics, ``update`` its model update (before sparsification, so error feedback carries the poison too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from dgrpo.errors import ConfigError
from dgrpo.federated.stats import ClientStats
from dgrpo.registry import Registry


class UpdateAttack:
    name: ClassVar[str]

    def report(self, stats: ClientStats) -> ClientStats:
        return stats

    def update(self, delta: torch.Tensor) -> torch.Tensor:
        return delta


FED_ATTACKS: Registry[type[UpdateAttack]] = Registry("federated attack")


def build_attack(name: str, options: Mapping[str, Any] | None = None) -> UpdateAttack:
    cls = FED_ATTACKS.get(name)
    try:
        return cls(**dict(options or {}))
    except TypeError as exc:
        raise ConfigError(f"federated attack {name!r}: {exc}") from None
