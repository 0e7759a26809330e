"""Federated adversaries: a client that misreports its statistics or poisons its update, registered by name
like the completion attacks (``dgrpo.adversary``).

An attacking client trains like any other; the attack changes only what it sends: ``report`` its reward
statistics, ``update`` its model update (before sparsification, so error feedback carries the poison too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from dgrpo.federated.stats import ClientStats
from dgrpo.registry import Registry


class UpdateAttack:
    name: ClassVar[str]

    def report(self, stats: ClientStats) -> ClientStats:
        return stats

    def update(self, delta: torch.Tensor) -> torch.Tensor:
        return delta


FED_ATTACKS: Registry[Callable[..., UpdateAttack]] = Registry("federated attack")


def build_attack(name: str, options: Mapping[str, Any] | None = None) -> UpdateAttack:
    return FED_ATTACKS.build(name, options)
