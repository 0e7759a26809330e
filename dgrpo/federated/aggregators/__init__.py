"""Aggregators, registered by name: ``mean``, ``median``, ``trimmed-mean``, ``multi-krum``, ``norm-clip``."""

from dgrpo.federated.aggregators import mean as mean
from dgrpo.federated.aggregators import median as median
from dgrpo.federated.aggregators import multi_krum as multi_krum
from dgrpo.federated.aggregators import norm_clip as norm_clip
from dgrpo.federated.aggregators import trimmed_mean as trimmed_mean
from dgrpo.federated.aggregators.base import AGGREGATORS, Aggregate, Merged, build_aggregator, weighted_mean

__all__ = ["AGGREGATORS", "Aggregate", "Merged", "build_aggregator", "weighted_mean"]
