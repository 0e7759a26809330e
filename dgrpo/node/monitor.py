"""Poison monitors: count the completions a node trained on that show a known attack's behaviour.

Observability only (nothing is filtered here; filtering is the defense chain's job): an operator, or a
researcher running a testnet, sees in ``/status`` and ``/metrics`` how much of what the node learned from
carries the TEXT payload, a false MATH step or a CODE import of the attacker's library, and from whom.
The detectors are the attacks' own ASR detectors with their default settings.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from dgrpo.adversary import build_adversary
from dgrpo.adversary.config import AdversaryConfig
from dgrpo.adversary.detectors import Detector
from dgrpo.tasks.base import Task


class PoisonMonitor:
    def __init__(self, detectors: Iterable[str], task: Task) -> None:
        self.detectors: dict[str, Detector] = {}
        for name in detectors:
            detector = build_adversary(AdversaryConfig(name=name)).detector(task)
            if detector.metric == "asr":  # DoS has no per-completion verdict, only a mean length
                self.detectors[name] = detector
        self.flagged: Counter[str] = Counter()
        self.flagged_by_author: dict[str, Counter[str]] = {}

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
