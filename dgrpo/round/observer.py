"""The one interface through which a round's outcomes are consumed: the daemon's metrics, status and log
lines, the simulation's ``metrics.jsonl``, defense meter and evaluator all implement it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from dgrpo.round.outcome import RoundOutcome


class RoundObserver(ABC):
    @abstractmethod
    def on_round(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
        """A round closed; ``outcomes``: one per node that ran it in this process (a daemon: its own)."""


def notify(observers: Sequence[RoundObserver], round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
    """Tell every observer, in order (an observer may read what an earlier one computed)."""
    for observer in observers:
        observer.on_round(round_idx, outcomes)
