"""The last rounds' curve for the live page (``/status`` ``history``): per round the mean reward and, where a row
carries one, the accuracy, in a bounded deque (a long run keeps the newest ``HISTORY_ROUNDS``).

Fed by the round's outcome (:class:`~dgrpo.round.observer.RoundObserver`, decentralised GRPO) or by the round's
log row (federated mode, whose rounds produce no :class:`~dgrpo.round.outcome.RoundOutcome`); ``--resume``
reloads it from ``rounds.jsonl``, the same rows.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dgrpo.round.observer import RoundObserver
from dgrpo.round.outcome import RoundOutcome

HISTORY_ROUNDS = 500


@dataclass(frozen=True)
class Point:
    round: int
    mean_reward: float | None
    accuracy: float | None = None
    time: float | None = None  # when the round ended (unix seconds)


def _number(value: Any) -> float | None:
    """A finite float, or None (JSON has no NaN, and a curve has no use for one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


class RoundHistory(RoundObserver):
    """The newest ``bound`` rounds, in round order: a round at or before the last one kept (a restart from an
    older checkpoint, which redoes rounds) replaces the points from there on, so the curve never runs back."""

    def __init__(self, bound: int = HISTORY_ROUNDS, accuracy: Callable[[int], float | None] | None = None) -> None:
        if bound < 1:
            raise ValueError(f"a history keeps at least one round, not {bound}")
        self.bound = bound
        self.accuracy = accuracy  # the round's held-out accuracy where the daemon evaluated it (eval.every)
        self._points: deque[Point] = deque(maxlen=bound)

    def add(self, point: Point) -> None:
        while self._points and self._points[-1].round >= point.round:
            self._points.pop()
        self._points.append(point)

    def add_row(self, row: Mapping[str, Any]) -> None:
        """A ``rounds.jsonl`` row: ``mean_reward`` (federated: ``local_mean``), ``accuracy`` if evaluated."""
        r = row.get("round")
        if isinstance(r, bool) or not isinstance(r, int):
            return
        reward = _number(row.get("mean_reward", row.get("local_mean")))
        self.add(Point(r, reward, _number(row.get("accuracy")), _number(row.get("time"))))

    def on_round(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
        for o in outcomes:
            accuracy = _number(self.accuracy(o.round)) if self.accuracy is not None else None
            self.add(Point(o.round, _number(o.scoring.mean_reward), accuracy, round(time.time(), 3)))

    def load(self, path: Path) -> int:
        """The newest rows of ``path`` (a missing file or a torn last line is no error); how many were read."""
        if not path.exists():
            return 0
        rows = 0
        with path.open(errors="replace") as f:
            for line in deque(f, maxlen=self.bound):
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    self.add_row(row)
                    rows += 1
        return rows

    def points(self) -> list[Point]:
        return list(self._points)

    def snapshot(self) -> dict[str, Any]:
        return {"bound": self.bound, "points": [asdict(p) for p in self._points]}
