"""``FedGRPO``: Fed-GRPO's server side as a Flower strategy (Message API).

Every round it sends the global weights and the federation's reward statistics to the sampled clients
(``configure_train``), and merges their replies (``aggregate_train``) with dgrpo's own
:class:`dgrpo.federated.server.Aggregator`: the same weighting (``samples`` for FedAvg, ``signal`` for
Fed-GRPO's signal-weighted aggregation, ``relative-gain`` for FGRPO), the same robust aggregators and the same
std-inflation defense (``federated.defense.bound_stats``), so a Flower run and dgrpo's simulation with the same
seeds sum the same numbers. The global weights move by ``server_lr x`` the aggregate; the strategy keeps them
(clients send sparse deltas, never weights).

A reply that does not decode (wrong shapes, an index out of range, a value that is not finite, missing
statistics) is rejected with a reason, logged and counted per node (``rejected``), never aggregated.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from dgrpo.config.federated import FederatedConfig
from dgrpo.federated.client import GlobalStats, Submission
from dgrpo.federated.server import Aggregator
from dgrpo.flower.records import (
    global_stats_config,
    number,
    stats_of,
    update_bytes,
    update_of,
    weights_record,
)

log = logging.getLogger("dgrpo.flower")


class FedGRPO(Strategy):
    """``cfg``: the scenario's ``[federated]`` section; ``initial``: the flat global weights of round 0.
    ``on_round(row)`` is called after every aggregation (the server app writes the rows out)."""

    def __init__(
        self,
        cfg: FederatedConfig,
        initial: torch.Tensor,
        timeout: float = 600.0,
        on_round: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.global_flat = initial.detach().to(torch.float32).clone()
        self.size = int(self.global_flat.numel())
        self.aggregator = Aggregator(cfg)
        self.global_stats: GlobalStats | None = None
        self.timeout = timeout
        self.on_round = on_round
        self.rows: list[dict[str, Any]] = []
        self.rejected: Counter[tuple[str, str]] = Counter()  # (node, reason) -> replies rejected
        self._started = 0.0

    def summary(self) -> None:
        fed = self.cfg
        log.info(
            "FedGRPO: %d clients, weighting %s, aggregator %s, calibration %s, budget %s",
            fed.clients, fed.weighting, fed.aggregator, fed.calibration.enabled, fed.sparsity.budget,
        )  # fmt: skip

    # ----------------------------------------------------------------- training
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Every client of the federation trains every round (Fed-GRPO samples none out): wait until all
        ``federated.clients`` nodes are connected, then send each the global weights and statistics."""
        self._started = time.perf_counter()
        nodes = self._wait_for_nodes(grid)
        config["server-round"] = server_round
        global_stats_config(config, self.global_stats)
        record = RecordDict({"arrays": weights_record(self.global_flat), "config": config})
        return [Message(content=record, message_type=MessageType.TRAIN, dst_node_id=n) for n in nodes]

    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        deadline = time.monotonic() + self.timeout
        while True:
            nodes = sorted(grid.get_node_ids())
            if len(nodes) >= self.cfg.clients or time.monotonic() > deadline:
                return nodes[: self.cfg.clients]
            time.sleep(0.5)

    def _reject(self, node: str, reason: str, detail: str) -> None:
        self.rejected[(node, reason)] += 1
        log.warning("round reply from node %s rejected (%s): %s", node, reason, detail)

    def _submission(self, server_round: int, msg: Message) -> tuple[Submission, int] | None:
        node = str(msg.metadata.src_node_id)
        if msg.has_error():
            self._reject(node, "client_error", str(msg.error.reason))
            return None
        content = msg.content
        try:
            client = content.config_records["client"]["name"]
            if not isinstance(client, str):
                raise ValueError(f"client name {client!r}")
            metrics = content.metric_records["metrics"]
            stats = stats_of(metrics)
            record = content.array_records["arrays"]
            if number(metrics, "size") != self.size:
                raise ValueError(f"an update of {metrics['size']!r} entries for a model of {self.size}")
            update = update_of(record, self.size)
        except (KeyError, TypeError, ValueError) as exc:
            self._reject(node, "bad_update", str(exc))
            return None
        return Submission(client, server_round, stats, update), update_bytes(record)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        submissions: list[Submission] = []
        sent: dict[str, int] = {}
        for msg in replies:
            got = self._submission(server_round, msg)
            if got is None:
                continue
            sub, size = got
            if sub.client in sent:  # two nodes claiming one client: keep the first
                self._reject(str(msg.metadata.src_node_id), "duplicate_client", sub.client)
                continue
            submissions.append(sub)
            sent[sub.client] = size
        if not submissions:
            return None, None
        aggregated = self.aggregator.aggregate(server_round, submissions)
        self.global_flat = self.global_flat + aggregated.delta
        self.global_stats = aggregated.stats
        row: dict[str, Any] = {
            "round": server_round,
            "client_reward": {s.client: s.stats.mean for s in submissions},
            "client_signal": {s.client: s.stats.std for s in submissions},
            "weights": dict(aggregated.weights),
            "clipped": dict(aggregated.clipped),
            "bytes_sent": sent,
            "entries_sent": {s.client: s.update.entries for s in submissions},
            "global_mean_reward": aggregated.stats.mean,
            "global_signal": aggregated.stats.std,
            "update_norm": float(aggregated.delta.norm()),
            "mean_reward": sum(s.stats.mean for s in submissions) / len(submissions),
            "seconds": time.perf_counter() - self._started,
        }
        self.rows.append(row)
        if self.on_round is not None:
            self.on_round(row)
        metrics = MetricRecord(
            {
                "global-mean": aggregated.stats.mean,
                "global-std": aggregated.stats.std,
                "num-examples": sum(s.stats.samples for s in submissions),
            }
        )
        return weights_record(self.global_flat), metrics

    # ----------------------------------------------------------------- evaluation (server-side only)
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return []  # held-out accuracy is measured by the server app on the global weights (evaluate_fn)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None
