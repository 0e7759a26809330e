"""Federated mode (Fed-GRPO, Guo et al. 2026, arXiv 2610.11502): clients train GRPO on private prompts and
share sparse model updates; the aggregator weighs them by reward signals.

The data path, one file per stage: a client's local rounds (:mod:`~dgrpo.federated.client`) give its reward
statistics (:mod:`~dgrpo.federated.stats`) and its update; the update is sparsified with error feedback
(:mod:`~dgrpo.federated.sparse`) and encoded (:mod:`~dgrpo.federated.encoding`); the aggregator bounds the
reported statistics (:mod:`~dgrpo.federated.stats`), weighs the clients (:mod:`~dgrpo.federated.weights`),
merges the updates (:mod:`~dgrpo.federated.aggregators`) and broadcasts global statistics that calibrate the
clients' next objectives (:mod:`~dgrpo.federated.calibration`). ``docs/federated.md`` has every formula.
"""
