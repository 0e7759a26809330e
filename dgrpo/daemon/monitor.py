"""Poison monitors: count the completions a node trained on that show a known attack's behaviour.

Observability only (nothing is filtered here; filtering is the defense chain's job): an operator, or a
researcher running a testnet, sees in ``/status`` and ``/metrics`` how much of what the node learned from
carries the TEXT payload, a false MATH step or a CODE import of the attacker's library, and from whom.
The detectors are the attacks' own ASR detectors with their default settings.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from dgrpo.adversary import build_adversary
from dgrpo.adversary.detectors import Detector
from dgrpo.config import AdversaryConfig
from dgrpo.round.observer import RoundObserver
from dgrpo.round.outcome import RoundOutcome
from dgrpo.tasks.base import Task


class PoisonMonitor(RoundObserver):
    """Observes what each round trained on. ``on_flag(detector)`` is called for every flagged completion
    (the daemon counts them in ``/metrics``)."""

    def __init__(self, detectors: Iterable[str], task: Task, on_flag: Callable[[str], None] | None = None) -> None:
        self.on_flag = on_flag
        self.detectors: dict[str, Detector] = {}
        for name in detectors:
            detector = build_adversary(AdversaryConfig(name=name)).detector(task)
            if detector.metric == "asr":  # DoS has no per-completion verdict, only a mean length
                self.detectors[name] = detector
        self.flagged: Counter[str] = Counter()
        self.flagged_by_author: dict[str, Counter[str]] = {}

    def on_round(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
        for outcome in outcomes:
            for scored in outcome.scoring.scored:
                for name in self.observe(scored.author, scored.text):
                    if self.on_flag is not None:
                        self.on_flag(name)

    def observe(self, author: str, completion: str) -> list[str]:
        """Count ``completion``; returns the names of the detectors that flag it."""
        hits = [name for name, d in self.detectors.items() if d.shows(completion)]
        for name in hits:
            self.flagged[name] += 1
            self.flagged_by_author.setdefault(author, Counter())[name] += 1
        return hits

    def snapshot(self) -> dict[str, object]:
        return {
            "detectors": sorted(self.detectors),
            "flagged": dict(self.flagged),
            "flagged_by_author": {a: dict(c) for a, c in self.flagged_by_author.items()},
        }
