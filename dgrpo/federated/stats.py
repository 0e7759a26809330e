"""A client's reward statistics (free by-products of GRPO, Fed-GRPO's signals) and the bounds a reward range
puts on them.

``mean`` is the client's mean reward over its local rounds; ``std`` its learning signal: the mean, over its
prompt groups, of each group's (population) reward standard deviation. A group whose completions all earn
the same reward has no GRPO advantage, so ``std`` measures how much of the client's batch taught it anything
(Fed-GRPO weighs clients by it: "clients with stronger learning signals").

The bound is Bhatia and Davis (2000): a variable in [lo, hi] with mean mu has variance at most
(hi - mu)(mu - lo). Each group obeys it with its own mean, and by Jensen (the square root is concave) the
mean of the groups' stds obeys it with the overall mean: ``std <= sqrt((hi - mu)(mu - lo))``. An honest
client can never report more; a client that does is lying about ``std`` or ``mean``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ClientStats:
    """What a client reports with its update: reward mean and signal, completions and groups behind them."""

    mean: float
    std: float
    samples: int
    groups: int


def group_std(rewards: Sequence[float]) -> float:
    """Population standard deviation of one group's rewards."""
    mu = sum(rewards) / len(rewards)
    return math.sqrt(sum((r - mu) ** 2 for r in rewards) / len(rewards))


def reward_stats(groups: Sequence[Sequence[float]]) -> ClientStats:
    """Statistics of a client's prompt groups (each a list of its completions' rewards)."""
    groups = [g for g in groups if g]
    if not groups:
        return ClientStats(0.0, 0.0, 0, 0)
    samples = sum(len(g) for g in groups)
    mean = sum(sum(g) for g in groups) / samples
    std = sum(group_std(g) for g in groups) / len(groups)
    return ClientStats(mean, std, samples, len(groups))


def std_bound(mean: float, low: float = 0.0, high: float = 1.0) -> float:
    """The largest std a reward in [low, high] with this mean allows (Bhatia-Davis); 0 outside the range."""
    if not low <= mean <= high:
        return 0.0
    return math.sqrt((high - mean) * (mean - low))


@dataclass(frozen=True)
class Bounded:
    stats: ClientStats
    clipped: str | None  # why the report was changed, None when it was kept


def bound_stats(
    reports: Sequence[ClientStats], low: float = 0.0, high: float = 1.0, max_std_ratio: float = 2.0
) -> list[Bounded]:
    """Each report with its std clipped to what the reward range allows at its mean (and the mean clipped to
    the range), then to ``max_std_ratio`` times the median of the range-bounded stds.

    The second rule bounds a liar who reports a mean of 0.5 (the largest range bound, 0.5 for [0, 1]):
    honest clients of one task have signals of one order, so one client's weight cannot exceed the others'
    by more than the ratio.
    """
    first: list[Bounded] = []
    for r in reports:
        mean = min(max(r.mean, low), high)
        cap = std_bound(mean, low, high)
        why = "mean_out_of_range" if mean != r.mean else None
        std = r.std
        # An honest std can sit on the bound exactly (0/1 rewards: sqrt(p(1-p))) and come out an ulp above it
        # in floating point ([0, 0, 1, 0, 0]: 0.4000000000000001 against 0.4): a relative tolerance far below
        # anything a liar gains keeps it unclipped.
        if not 0.0 <= std <= cap * (1.0 + 1e-9):
            std, why = min(max(std, 0.0), cap), why or "std_above_range_bound"
        first.append(Bounded(replace(r, mean=mean, std=std), why))
    if not first:
        return first
    ceiling = max_std_ratio * statistics.median(b.stats.std for b in first)
    out = []
    for b in first:
        if b.stats.std > ceiling:
            out.append(Bounded(replace(b.stats, std=ceiling), b.clipped or "std_above_median_ratio"))
        else:
            out.append(b)
    return out
