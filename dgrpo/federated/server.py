"""The aggregation step: from the round's submissions to one global update and the broadcast statistics.

In order: the defense bounds each reported statistic (:func:`dgrpo.federated.stats.bound_stats`) when on;
the weighting turns the statistics into weights (:mod:`dgrpo.federated.weights`); the aggregator merges the
decoded updates (:mod:`dgrpo.federated.aggregators`); the global statistics are the sample-weighted mean
reward and the mean signal of the (bounded) reports. Submissions are taken in client-name order and every
sum runs in that order, so every node that aggregates the same submissions gets the same bits (the
decentralised topology relies on it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from dgrpo.config.federated import FederatedConfig
from dgrpo.federated.aggregators import build_aggregator
from dgrpo.federated.client import GlobalStats, Submission
from dgrpo.federated.stats import ClientStats, bound_stats
from dgrpo.federated.weights import (
    relative_gain_weights,
    sample_weights,
    signal_weights,
    uniform_weights,
    update_history,
)


@dataclass(frozen=True)
class Aggregated:
    round: int
    delta: torch.Tensor  # server_lr x the aggregate: global <- global + delta
    stats: GlobalStats
    weights: Mapping[str, float]
    clipped: Mapping[str, str] = field(default_factory=dict)  # client -> why its report was bounded
    # each client's share of the result after the aggregator excluded or clipped (None: coordinate-wise rule)
    influence: Mapping[str, float] | None = None


class Aggregator:
    """Aggregates one round at a time; keeps each client's reward history (relative-gain weighting)."""

    def __init__(self, cfg: FederatedConfig, history: Mapping[str, float] | None = None) -> None:
        self.cfg = cfg
        self.merge = build_aggregator(cfg.aggregator, cfg.aggregator_options)
        self.history: dict[str, float] = dict(history or {})

    def __getstate__(self) -> dict[str, object]:
        """A simulation's snapshot: the merge function is a closure, stateless and built from the config."""
        state = dict(self.__dict__)
        del state["merge"]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.merge = build_aggregator(self.cfg.aggregator, self.cfg.aggregator_options)

    def weights(self, names: Sequence[str], reports: Sequence[ClientStats]) -> list[float]:
        cfg = self.cfg
        if cfg.weighting == "samples":
            return sample_weights([r.samples for r in reports])
        if cfg.weighting == "signal":
            return signal_weights([r.std for r in reports], cfg.weights.temperature, cfg.weights.eps)
        if cfg.weighting == "relative-gain":
            history = [self.history.get(n) for n in names]
            return relative_gain_weights([r.mean for r in reports], history, cfg.weights.gain_temperature)
        return uniform_weights(len(reports))

    def aggregate(self, round_idx: int, submissions: Sequence[Submission]) -> Aggregated:
        if not submissions:
            raise ValueError("nothing to aggregate")
        ordered = sorted(submissions, key=lambda s: s.client)
        names = [s.client for s in ordered]
        reports = [s.stats for s in ordered]
        clipped: dict[str, str] = {}
        if self.cfg.defense.bound_stats:
            bounded = bound_stats(reports, max_std_ratio=self.cfg.defense.max_std_ratio)
            reports = [b.stats for b in bounded]
            clipped = {n: b.clipped for n, b in zip(names, bounded, strict=True) if b.clipped is not None}
        weights = self.weights(names, reports)
        updates = torch.stack([s.update.dense() for s in ordered])
        merged = self.merge(updates, torch.tensor(weights, dtype=torch.float64).to(torch.float32))
        influence = None
        if merged.influence is not None:
            influence = {n: float(v) for n, v in zip(names, merged.influence.tolist(), strict=True)}
        samples = sum(r.samples for r in reports)
        mean = sum(r.mean * r.samples for r in reports) / samples if samples else 0.0
        std = sum(r.std for r in reports) / len(reports)
        self.history = update_history(
            self.history, {n: r.mean for n, r in zip(names, reports, strict=True)}, self.cfg.weights.gain_momentum
        )
        return Aggregated(
            round_idx,
            merged.update * self.cfg.server_lr,
            GlobalStats(mean, std),
            dict(zip(names, weights, strict=True)),
            clipped,
            influence,
        )
