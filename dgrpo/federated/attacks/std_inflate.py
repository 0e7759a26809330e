"""``std-inflate``: report a larger reward std than the client saw, to gain weight under signal-weighted
aggregation (Fed-GRPO weighs clients by it, and nothing in the paper checks it).

Options: ``std`` the reported std (default 0.5, the largest any reward in [0, 1] allows); ``mean`` the
reported mean (default: the true one; 0.5 makes the report consistent with the range bound); ``scale``
multiplies the update (default -1: a sign-flipped update, so the weight gained does harm; 1 keeps it honest).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dgrpo.federated.attacks.base import FED_ATTACKS, UpdateAttack
from dgrpo.federated.stats import ClientStats


@FED_ATTACKS.register("std-inflate")
class StdInflate(UpdateAttack):
    name = "std-inflate"

    def __init__(self, std: float = 0.5, mean: float | None = None, scale: float = -1.0) -> None:
        self.std = std
        self.mean = mean
        self.scale = scale

    def report(self, stats: ClientStats) -> ClientStats:
        return replace(stats, std=self.std, mean=stats.mean if self.mean is None else self.mean)

    def update(self, delta: torch.Tensor) -> torch.Tensor:
        return delta * self.scale
