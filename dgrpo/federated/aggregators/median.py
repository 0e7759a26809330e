"""``median``: the coordinate-wise median (Yin et al. 2018, "Byzantine-robust distributed learning").

With an even number of clients the two middle values are averaged. Weights are ignored.
"""

from __future__ import annotations

import torch

from dgrpo.federated.aggregators.base import AGGREGATORS, Aggregate, Merged, check_shapes


def coordinate_median(updates: torch.Tensor) -> torch.Tensor:
    ordered = updates.sort(dim=0).values
    k = ordered.shape[0]
    if k % 2:
        return ordered[k // 2].clone()
    return (ordered[k // 2 - 1] + ordered[k // 2]) / 2


@AGGREGATORS.register("median")
def median() -> Aggregate:
    def aggregate(updates: torch.Tensor, weights: torch.Tensor) -> Merged:
        check_shapes(updates, weights)
        return Merged(coordinate_median(updates), None)

    return aggregate
