"""``mean``: the weighted mean (FedAvg, McMahan et al. 2017, with whatever weights the weighting chose)."""

from __future__ import annotations

import torch

from dgrpo.federated.aggregators.base import AGGREGATORS, Aggregate, check_shapes, weighted_mean


@AGGREGATORS.register("mean")
def mean() -> Aggregate:
    def aggregate(updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        check_shapes(updates, weights)
        return weighted_mean(updates, weights)

    return aggregate
