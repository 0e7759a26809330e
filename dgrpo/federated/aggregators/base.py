"""Aggregators: how the clients' updates become one, registered by name like the defenses.

An aggregator is a function of the stacked updates ``[K, n]`` and the clients' weights ``[K]`` (summing to
1) to a :class:`Merged`: one update ``[n]`` and, where it is defined, each client's share of it (its
*influence*: the weight it ended up with, after exclusion or clipping); its options come from
``federated.aggregator_options``. Robust ones bound what a
minority of clients can do to the result (Yin et al. 2018; Blanchard et al. 2017): ``median`` and
``trimmed-mean`` ignore the weights (a weight is itself something a client can inflate); ``multi-krum`` and
``norm-clip`` use them among the updates they keep.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from dgrpo.registry import Registry


@dataclass(frozen=True)
class Merged:
    update: torch.Tensor
    influence: torch.Tensor | None  # [K], sums to 1; None for coordinate-wise rules (no per-client share)


Aggregate = Callable[[torch.Tensor, torch.Tensor], Merged]
AggregatorFactory = Callable[..., Aggregate]

AGGREGATORS: Registry[AggregatorFactory] = Registry("aggregator")


def weighted_mean(updates: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum_k w_k u_k / sum_k w_k``, summed in client order (the same bits on every node)."""
    w = weights.to(updates.dtype)
    return (w[:, None] * updates).sum(0) / w.sum()


def shares(weights: torch.Tensor) -> torch.Tensor:
    """Weights normalised to sum to 1 (all zero: equal shares)."""
    w = weights.to(torch.float64)
    return w / w.sum() if float(w.sum()) > 0 else torch.full_like(w, 1.0 / len(w))


def build_aggregator(name: str, options: Mapping[str, Any] | None = None) -> Aggregate:
    """The aggregator ``name`` with ``options``; an unknown option is a configuration error naming it."""
    return AGGREGATORS.build(name, options)


def check_shapes(updates: torch.Tensor, weights: torch.Tensor) -> None:
    if updates.dim() != 2 or weights.shape != (updates.shape[0],) or updates.shape[0] == 0:
        raise ValueError(
            f"updates [K, n] and weights [K] expected, got {tuple(updates.shape)} and {tuple(weights.shape)}"
        )
