"""``sign-flip``: send ``-factor`` times the update (default factor 1): the client pulls the model back
against what its own GRPO steps learned (a standard Byzantine baseline, e.g. Li et al. 2019, RSA)."""

from __future__ import annotations

import torch

from dgrpo.federated.attacks.base import FED_ATTACKS, UpdateAttack


@FED_ATTACKS.register("sign-flip")
class SignFlip(UpdateAttack):
    name = "sign-flip"

    def __init__(self, factor: float = 1.0) -> None:
        self.factor = factor

    def update(self, delta: torch.Tensor) -> torch.Tensor:
        return -self.factor * delta
