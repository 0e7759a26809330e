"""The no-oracle attacker's answer: a majority vote over its own samples (paper, sec. 4.3: it samples N
candidates, 24 in the code setting, and poisons the most common answer)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


def majority_vote(answers: Iterable[str | None]) -> str | None:
    """The most common non-None answer; ties go to the answer seen first. None when no answer parsed."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in counts if counts[a] == best)  # Counter keeps first-seen order
