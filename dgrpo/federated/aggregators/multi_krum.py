"""``multi-krum`` (Blanchard et al. 2017; El Mhamdi et al. 2018): each update is scored by the sum of its
squared distances to its ``K - f - 2`` nearest other updates; the ``m`` best-scored are kept and averaged
with their weights (renormalised). ``f`` is how many clients may be Byzantine (default: as many as Krum
tolerates, ``(K - 3) // 2``, at least 0); ``m`` defaults to ``K - f``.
"""

from __future__ import annotations

import torch

from dgrpo.federated.aggregators.base import AGGREGATORS, Aggregate, Merged, check_shapes, shares, weighted_mean


def krum_scores(updates: torch.Tensor, f: int) -> torch.Tensor:
    """Krum's score of each update (lower is more central)."""
    k = updates.shape[0]
    neighbours = max(k - f - 2, 1)
    distances = torch.cdist(updates.double(), updates.double()) ** 2
    distances.fill_diagonal_(float("inf"))
    nearest = distances.sort(dim=1).values[:, : min(neighbours, k - 1)]
    return nearest.sum(1)


def select_multikrum(updates: torch.Tensor, f: int, m: int) -> list[int]:
    """The indices of the ``m`` updates with the lowest Krum scores (ties: lower index first)."""
    if updates.shape[0] == 1:
        return [0]
    scores = krum_scores(updates, f).tolist()
    return sorted(sorted(range(len(scores)), key=lambda i: (scores[i], i))[:m])


@AGGREGATORS.register("multi-krum")
def multi_krum(f: int | None = None, m: int | None = None) -> Aggregate:
    def aggregate(updates: torch.Tensor, weights: torch.Tensor) -> Merged:
        check_shapes(updates, weights)
        k = updates.shape[0]
        byzantine = max((k - 3) // 2, 0) if f is None else f
        keep = select_multikrum(updates, byzantine, max(1, min(k, k - byzantine if m is None else m)))
        influence = torch.zeros(k, dtype=torch.float64)
        influence[keep] = shares(weights[keep])  # the excluded weigh nothing
        return Merged(weighted_mean(updates[keep], weights[keep]), influence)

    return aggregate
