"""``mean``: the weighted mean (FedAvg, McMahan et al. 2017, with whatever weights the weighting chose)."""

from __future__ import annotations

import torch

from dgrpo.federated.aggregators.base import AGGREGATORS, Aggregate, Merged, check_shapes, shares, weighted_mean


@AGGREGATORS.register("mean")
def mean() -> Aggregate:
    def aggregate(updates: torch.Tensor, weights: torch.Tensor) -> Merged:
        check_shapes(updates, weights)
        return Merged(weighted_mean(updates, weights), shares(weights))

    return aggregate
