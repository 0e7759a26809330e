"""A benchmark target's verdict from repeated measurements: "met" only beyond two standard errors (issue 44).

A difference measured over a few seeds or repeats (paired, seed by seed) meets its target only where its mean
clears the target by more than two standard errors of that mean (about a 95% interval, normal approximation);
it misses it where the mean falls short by more than two; anything between is "level": the measurements cannot
tell it from the target. "+0.5 +/- 0.4 s.e. points ahead" is level with 0, not ahead.

    from benchmarks.verdict import verdict
    verdict([+0.4, +1.7, +1.0, -0.8, +0.2], target=0.0)  # "level"
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

MET = "met"
LEVEL = "level"
NOT_MET = "not met"
UNDECIDED = "undecided (fewer than two measurements: no standard error)"


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean of ``values`` and its standard error, ``stdev / sqrt(n)`` (sample stdev, n - 1); needs n >= 2."""
    if len(values) < 2:
        raise ValueError(f"a standard error needs at least two values, got {len(values)}")
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def verdict_from(mean: float, se: float, target: float = 0.0, higher_is_better: bool = True) -> str:
    """ "met" where ``mean`` is beyond ``target`` (above it, or below with ``higher_is_better=False``) by more than
    ``2 * se``; "not met" where it falls short by more than ``2 * se``; otherwise "level"."""
    if se < 0 or math.isnan(se) or math.isnan(mean):
        raise ValueError(f"mean {mean} and standard error {se}: expected numbers, se >= 0")
    margin = mean - target if higher_is_better else target - mean
    if margin > 2 * se:
        return MET
    if margin < -2 * se:
        return NOT_MET
    return LEVEL


def verdict(diffs: Sequence[float], target: float = 0.0, higher_is_better: bool = True) -> str:
    """The verdict on measured differences (one per seed or repeat) against ``target``, by their mean and its
    standard error (:func:`verdict_from`); :data:`UNDECIDED` for fewer than two."""
    if len(diffs) < 2:
        return UNDECIDED
    mean, se = mean_se(diffs)
    return verdict_from(mean, se, target, higher_is_better)


def described(diffs: Sequence[float], target: float = 0.0, higher_is_better: bool = True, unit: str = "") -> str:
    """``"mean +0.49 +/- 0.41 s.e.<unit> over 5 (target > +0.00): level"``: the verdict with its numbers."""
    if len(diffs) < 2:
        return f"{len(diffs)} measurement(s): {UNDECIDED}"
    mean, se = mean_se(diffs)
    side = ">" if higher_is_better else "<"
    return (
        f"mean {mean:+.2f} +/- {se:.2f} s.e.{unit} over {len(diffs)} (target {side} {target:+.2f}): "
        f"{verdict_from(mean, se, target, higher_is_better)}"
    )
