"""What crosses Flower's wire, as Flower records: the global weights, a client's sparse update and reward
statistics, the global statistics, and a client's own state between rounds (``context.state``).

A sparse update travels as an ``ArrayRecord`` of two arrays, ``indices`` (int32, ascending) and ``values``
(the sparsity section's wire dtype), plus its ``size`` in the reply's ``MetricRecord``: exactly the entries
dgrpo's own encoding carries (:mod:`dgrpo.federated.encoding`), so the aggregator sums the same numbers.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord

from dgrpo.federated.client import GlobalStats
from dgrpo.federated.sparse import SparseUpdate
from dgrpo.federated.stats import ClientStats

GLOBAL_KEY = "global"


def weights_record(flat: torch.Tensor) -> ArrayRecord:
    """The global weights, flat float32 (the order of :func:`dgrpo.federated.params.flat_parameters`)."""
    return ArrayRecord({GLOBAL_KEY: Array(flat.detach().to(torch.float32).numpy().copy())})


def weights_of(record: ArrayRecord) -> torch.Tensor:
    return torch.from_numpy(record[GLOBAL_KEY].numpy().copy())


def update_record(update: SparseUpdate) -> ArrayRecord:
    return ArrayRecord(
        {
            # int32: a model of up to 2^31 entries; our own encoding packs them tighter (docs/flower.md)
            "indices": Array(update.indices.to(torch.int32).numpy().copy()),
            "values": Array(update.values.numpy().copy()),
        }
    )


def update_of(record: ArrayRecord, size: int) -> SparseUpdate:
    """The sparse update in ``record``; ``ValueError`` where it does not fit a model of ``size`` entries."""
    raw = record["indices"].numpy()
    if raw.dtype not in (np.int32, np.int64):
        raise ValueError(f"indices of dtype {raw.dtype}")
    indices = torch.from_numpy(raw.astype(np.int64))
    values = torch.from_numpy(record["values"].numpy().copy())
    if indices.ndim != 1 or values.shape != indices.shape:
        raise ValueError(f"indices {tuple(indices.shape)} and values {tuple(values.shape)} do not pair up")
    if values.dtype not in (torch.float32, torch.float16):
        raise ValueError(f"values of dtype {values.dtype}")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= size):
        raise ValueError(f"an index outside the model's {size} entries")
    if indices.numel() > 1 and not bool((indices[1:] > indices[:-1]).all()):
        raise ValueError("indices not strictly ascending")
    if not bool(torch.isfinite(values).all()):
        raise ValueError("a value that is not finite")
    return SparseUpdate(size, indices, values)


def update_bytes(record: ArrayRecord) -> int:
    """What the update's arrays weigh on the wire (their data, as dgrpo counts its own encoding's payload)."""
    return sum(int(record[key].numpy().nbytes) for key in ("indices", "values"))


def stats_record(stats: ClientStats, size: int) -> MetricRecord:
    # "num-examples": Flower's conventional weight key (FedAvg's), the completions behind the statistics.
    return MetricRecord(
        {
            "reward-mean": stats.mean,
            "reward-std": stats.std,
            "num-examples": stats.samples,
            "groups": stats.groups,
            "size": size,
        }
    )


def number(record: MetricRecord | ConfigRecord, key: str) -> float:
    """A numeric entry; ``KeyError`` where missing, ``ValueError`` where not one finite number."""
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise ValueError(f"{key!r} is {value!r}, not a finite number")
    return float(value)


def stats_of(record: MetricRecord) -> ClientStats:
    return ClientStats(
        number(record, "reward-mean"),
        number(record, "reward-std"),
        int(number(record, "num-examples")),
        int(number(record, "groups")),
    )


def global_stats_config(config: ConfigRecord, stats: GlobalStats | None) -> None:
    """Put the federation's reward statistics (calibration, adaptive budget) into the train config."""
    if stats is not None:
        config["global-mean"] = stats.mean
        config["global-std"] = stats.std


def global_stats_of(config: ConfigRecord) -> GlobalStats | None:
    if "global-mean" not in config:
        return None
    return GlobalStats(number(config, "global-mean"), number(config, "global-std"))


def blob(obj: object) -> Array:
    """Any torch-serialisable object (the optimizer's state) as a byte array."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return Array(np.frombuffer(buffer.getvalue(), dtype=np.uint8).copy())


def unblob(array: Array) -> object:
    return torch.load(io.BytesIO(array.numpy().tobytes()), weights_only=True)
