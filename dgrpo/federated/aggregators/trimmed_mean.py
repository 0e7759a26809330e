"""``trimmed-mean``: per coordinate, drop the ``trim`` largest and ``trim`` smallest values and average the
rest (Yin et al. 2018). ``trim`` defaults to ``floor(beta * K)`` with ``beta`` = 0.2; it must leave at
least one value. Weights are ignored.
"""

from __future__ import annotations

import torch

from dgrpo.errors import ConfigError
from dgrpo.federated.aggregators.base import AGGREGATORS, Aggregate, Merged, check_shapes


def trimmed(updates: torch.Tensor, trim: int) -> torch.Tensor:
    k = updates.shape[0]
    if 2 * trim >= k:
        raise ValueError(f"trimming {trim} from each side of {k} values leaves none")
    ordered = updates.sort(dim=0).values
    return ordered[trim : k - trim].mean(0)


@AGGREGATORS.register("trimmed-mean")
def trimmed_mean(beta: float = 0.2, trim: int | None = None) -> Aggregate:
    if not 0.0 <= beta < 0.5:
        raise ConfigError(f"trimmed-mean: beta {beta} must lie in [0, 0.5)")

    def aggregate(updates: torch.Tensor, weights: torch.Tensor) -> Merged:
        check_shapes(updates, weights)
        cut = int(beta * updates.shape[0]) if trim is None else trim
        return Merged(trimmed(updates, cut), None)

    return aggregate
