"""What a daemon does with each round's outcome: counters for ``/status``, Prometheus metrics, the round log
(``rounds.jsonl`` and one log line), and the blacklist the reputation policy decided.

Each is a :class:`~dgrpo.round.observer.RoundObserver`, like the simulation's observers.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dgrpo.daemon.log_lines import round_text
from dgrpo.daemon.log_setup import record_extra
from dgrpo.daemon.status import NodeMetrics
from dgrpo.round.observer import RoundObserver
from dgrpo.round.outcome import RoundOutcome
from dgrpo.tasks.base import Task

log = logging.getLogger("dgrpo.daemon")


class NodeCounters(RoundObserver):
    """Cumulative counts of what the node trained on and what its defenses did, for ``/status``."""

    def __init__(self) -> None:
        self.last: RoundOutcome | None = None
        self.completions_trained = 0
        self.trained_by_author: Counter[str] = Counter()
        self.defense_checked_by_author: Counter[str] = Counter()
        self.defense_rejected_by_author: Counter[str] = Counter()
        self.defense_rejected_by_reason: Counter[str] = Counter()
        # the draw stage: rounds it drew its J external completions in, and what it drew from young authors
        self.draw_rounds = 0
        self.draw_full_rounds = 0
        self.drawn_external = 0
        self.drawn_young = 0
        self.offered_external = 0

    def on_round(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
        for o in outcomes:
            self.last = o
            self.completions_trained += o.completions_trained
            self.trained_by_author.update(s.author for s in o.scoring.scored)
            if o.drawn is not None:
                self.draw_rounds += 1
                self.draw_full_rounds += o.drawn.full
                self.drawn_external += o.drawn.drawn
                self.drawn_young += o.drawn.young_drawn
                self.offered_external += o.drawn.offered
            if o.defense is not None:
                self.defense_checked_by_author.update(o.defense.checked_by_author)
                self.defense_rejected_by_author.update(o.defense.rejected_by_author)
                self.defense_rejected_by_reason.update(o.defense.rejected)


class MetricsObserver(RoundObserver):
    """The per-round Prometheus metrics (the message and admission counters are read at scrape time, see
    :class:`dgrpo.daemon.status.WireCollector`)."""

    def __init__(self, metrics: NodeMetrics, task: Task) -> None:
        self.metrics = metrics
        self.task = task
        self.reward_counts: dict[str, int] = {}  # the task's reward statistics at the last round

    def on_round(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
        m = self.metrics
        for o in outcomes:
            m.round.set(o.round)
            m.mean_reward.set(o.scoring.mean_reward)
            m.completions.inc(o.completions_trained)
            m.reward_seconds.set(o.scoring.seconds)
            m.round_seconds.set(o.round_seconds)
            if o.defense is not None:
                for peer, n in o.defense.checked_by_author.items():
                    m.defense_checked.labels(peer=peer).inc(n)
                for reason, n in o.defense.rejected.items():
                    m.defense_rejected.labels(reason=reason).inc(n)
        counts = self.task.reward_statistics()
        for event, n in counts.items():
            grew = n - self.reward_counts.get(event, 0)
            if grew > 0:
                m.reward_events.labels(event=event).inc(grew)
        self.reward_counts = counts


class RoundLog(RoundObserver):
    """One line per round in ``rounds.jsonl`` (JSON, with full peer ids and authors), and one log line: short and
    human (:func:`~dgrpo.daemon.log_lines.round_text`), or with ``--log-format json`` the same record whole."""

    def __init__(
        self,
        path: Path,
        digest: Callable[[], str] | None = None,
        accuracy: Callable[[int], float | None] | None = None,
    ) -> None:
        self.path = path
        self.digest = digest  # weights digest after every round (status.weights_digest)
        self.accuracy = accuracy  # held-out accuracy of the round, where evaluated (eval.every)

    def on_round(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
        for o in outcomes:
            line = round_line(o)
            if self.digest is not None:
                line["weights_sha256"] = self.digest()
            accuracy = self.accuracy(o.round) if self.accuracy is not None else None
            if accuracy is not None:
                line["accuracy"] = round(accuracy, 4)
            by_author = Counter(s.author for s in o.scoring.scored)
            record = {**line, "authors": sorted(o.authors), "completions_by_author": by_author}
            log.info("%s", round_text(record), extra=record_extra(record))
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def round_line(o: RoundOutcome) -> dict[str, Any]:
    return {
        "event": "round",
        "time": round(time.time(), 3),  # when the round ended (unix seconds): steps per minute, over rounds
        "peer": o.peer_id,
        "round": o.round,
        "seconds": round(o.round_seconds, 2),
        "reward_seconds": round(o.scoring.seconds, 3),
        "expected_peers": len(o.expected),
        "departed": list(o.departed),
        "completions": o.completions_trained,
        "rejected": dict(o.admission.rejected),
        "defense_rejected": dict(o.defense.rejected) if o.defense is not None else {},
        "mean_reward": round(o.scoring.mean_reward, 4),
        "loss": None if o.step is None else round(o.step.loss, 6),
        "cpu": {name: round(value, 5) for name, value in asdict(o.cpu).items()},
        "drawn": None
        if o.drawn is None
        else {"offered": o.drawn.offered, "drawn": o.drawn.drawn, "young": o.drawn.young_drawn, "full": o.drawn.full},
        # Async mode: peers' completions trained on, by how many rounds old they were ({} in sync mode).
        "staleness": {str(age): n for age, n in o.staleness.items()},
        "filled": o.filled,
    }


def outcome_json(o: RoundOutcome) -> dict[str, Any]:
    """The last round, as ``/status`` shows it."""
    return {
        "round": o.round,
        "messages": o.admission.messages,
        "completions_received": o.admission.completions_received,
        "completions_accepted": o.completions_trained,
        "authors": sorted(o.authors),
        "expected": list(o.expected),
        "rejected": dict(o.admission.rejected),
        "rejected_by_author": dict(o.admission.rejected_by_author),
        "defense_rejected": dict(o.defense.rejected) if o.defense is not None else {},
        "defense_rejected_by_author": dict(o.defense.rejected_by_author) if o.defense is not None else {},
        "mean_reward": o.scoring.mean_reward,
        "reward_seconds": o.scoring.seconds,
        "loss": None if o.step is None else o.step.loss,
        "drawn": None
        if o.drawn is None
        else {"offered": o.drawn.offered, "drawn": o.drawn.drawn, "young": o.drawn.young_drawn, "full": o.drawn.full},
        # Async mode: peers' completions trained on, by how many rounds old they were ({} in sync mode).
        "staleness": {str(age): n for age, n in o.staleness.items()},
        "filled": o.filled,
    }


class Blacklister(RoundObserver):
    """Carries out the reputation policy's decisions at the network layer."""

    def __init__(self, blacklist: Callable[[str, str], None], rate: Callable[[str], float]) -> None:
        self.blacklist = blacklist
        self.rate = rate

    def on_round(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
        for o in outcomes:
            for peer in o.defense.blacklisted_now if o.defense is not None else ():
                self.blacklist(peer, f"defense rejection rate {self.rate(peer):.2f} over the reputation window")
