"""``scale``: send the update multiplied by ``factor`` (default 10), the model-replacement attack of
Bagdasaryan et al. (2020): one client's update outweighs the others' in a plain mean."""

from __future__ import annotations

import torch

from dgrpo.federated.attacks.base import FED_ATTACKS, UpdateAttack


@FED_ATTACKS.register("scale")
class Scale(UpdateAttack):
    name = "scale"

    def __init__(self, factor: float = 10.0) -> None:
        self.factor = factor

    def update(self, delta: torch.Tensor) -> torch.Tensor:
        return delta * self.factor
