"""``norm-clip`` (Sun et al. 2019, "Can you really backdoor federated learning?"): every update longer than
``max_norm`` is scaled down to it, then the weighted mean is taken. ``max_norm`` defaults to the median of
the updates' norms, so that a minority cannot set the bound.
"""

from __future__ import annotations

import torch

from dgrpo.federated.aggregators.base import AGGREGATORS, Aggregate, check_shapes, weighted_mean


def clip_norms(updates: torch.Tensor, max_norm: float) -> torch.Tensor:
    norms = updates.norm(dim=1)
    scale = torch.clamp(max_norm / norms.clamp(min=1e-12), max=1.0)
    return updates * scale[:, None]


@AGGREGATORS.register("norm-clip")
def norm_clip(max_norm: float | None = None) -> Aggregate:
    def aggregate(updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        check_shapes(updates, weights)
        bound = float(updates.norm(dim=1).median()) if max_norm is None else max_norm
        return weighted_mean(clip_norms(updates, bound), weights)

    return aggregate
