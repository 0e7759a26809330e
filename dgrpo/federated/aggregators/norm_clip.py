"""``norm-clip`` (Sun et al. 2019, "Can you really backdoor federated learning?"): every update longer than
``max_norm`` is scaled down to it, then the weighted mean is taken. ``max_norm`` defaults to the median of
the updates' norms (torch's median: the lower middle one for an even K), so that a minority cannot set the bound.
"""

from __future__ import annotations

import torch

from dgrpo.federated.aggregators.base import AGGREGATORS, Aggregate, Merged, check_shapes, shares, weighted_mean


def clip_scales(updates: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The factor (at most 1) that brings each update's norm to at most ``max_norm``."""
    return torch.clamp(max_norm / updates.norm(dim=1).clamp(min=1e-12), max=1.0)


@AGGREGATORS.register("norm-clip")
def norm_clip(max_norm: float | None = None) -> Aggregate:
    def aggregate(updates: torch.Tensor, weights: torch.Tensor) -> Merged:
        check_shapes(updates, weights)
        bound = float(updates.norm(dim=1).median()) if max_norm is None else max_norm
        scale = clip_scales(updates, bound)
        # influence: each client's share of the (clipped) mass, w_k c_k / sum_j w_j c_j
        return Merged(weighted_mean(updates * scale[:, None], weights), shares(weights * scale))

    return aggregate
