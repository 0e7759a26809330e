"""What a node exchanges with its peers each round: the part of a daemon that depends on its mode.

A daemon (:class:`dgrpo.daemon.daemon.Daemon`) has one lifecycle: identity and state on disk, the libp2p host,
status server, heartbeats, the join, checkpoints and shutdown. What it exchanges is a plug-in chosen by
``mode`` (:func:`dgrpo.daemon.launch.exchange_for`):

* ``completions`` (:class:`dgrpo.daemon.completions.CompletionExchange`): decentralised GRPO, as in "Hail to the
  Thief": completion strings gossiped every round, drawn, defended, scored and trained on by every node;
* ``federated`` (:class:`dgrpo.daemon.federated.FederatedExchange`): Fed-GRPO, sparse model updates and reward
  statistics, aggregated (:mod:`dgrpo.net.updates` carries them, :mod:`dgrpo.net.state_sync` hands the
  global state to joiners).

The daemon calls the hooks below at fixed points of its lifecycle; an exchange reaches the daemon's parts
(transport, learner, settings, counters) through the daemon it was built for.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import trio

from dgrpo.daemon.checkpoint import CheckpointState
from dgrpo.round.admit import AdmissionStatistics


class Exchange(ABC):
    mode: ClassVar[str]

    @abstractmethod
    def restore(self, state: CheckpointState) -> None:
        """Take this mode's state back from a checkpoint (after the daemon restored the model, optimizer,
        round counters and replay window)."""

    @abstractmethod
    def checkpoint_meta(self) -> dict[str, Any]:
        """This mode's part of a checkpoint (beside the model, optimizer, nonce and replay state)."""

    @abstractmethod
    def admission_statistics(self) -> AdmissionStatistics:
        """Round-level rejections by reason and author (``/status``, ``/metrics``)."""

    @abstractmethod
    def status(self, out: dict[str, Any]) -> None:
        """Add this mode's part to (or correct) the daemon's ``/status`` object."""

    @abstractmethod
    async def open(self, nursery: trio.Nursery) -> None:
        """Subscribe to what this mode exchanges beyond rollouts and control; serve its streams."""

    @abstractmethod
    async def rounds(self) -> None:
        """Join the network and run rounds until ``rounds.max_rounds`` (or for ever)."""

    def announcement(self) -> tuple[int, bytes, bytes] | None:
        """The state this node announces in its heartbeats: (round, root, base) of the weights sync
        (:mod:`dgrpo.daemon.weights_sync`); None, the default, announces none."""
        return None
