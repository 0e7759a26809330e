"""benchmarks/verdict.py: "met" only beyond two standard errors, on numbers worked by hand."""

from __future__ import annotations

import pytest

from benchmarks.verdict import LEVEL, MET, NOT_MET, UNDECIDED, described, mean_se, verdict, verdict_from


def test_two_values_by_hand() -> None:
    # [1, 3]: mean 2, sample variance ((1-2)^2 + (3-2)^2) / 1 = 2, stdev sqrt(2), s.e. sqrt(2) / sqrt(2) = 1.
    assert mean_se([1.0, 3.0]) == (2.0, 1.0)
    # Two standard errors are 2: the mean must clear the target by more than 2.
    assert verdict([1.0, 3.0], target=-0.1) == MET  # 2.1 above
    assert verdict([1.0, 3.0], target=0.0) == LEVEL  # exactly 2 above: not more than two s.e.
    assert verdict([1.0, 3.0], target=2.0) == LEVEL
    assert verdict([1.0, 3.0], target=4.0) == LEVEL  # exactly 2 below
    assert verdict([1.0, 3.0], target=4.1) == NOT_MET  # 2.1 below


def test_lower_is_better_mirrors() -> None:
    assert verdict([1.0, 3.0], target=4.1, higher_is_better=False) == MET
    assert verdict([1.0, 3.0], target=2.0, higher_is_better=False) == LEVEL
    assert verdict([1.0, 3.0], target=-0.1, higher_is_better=False) == NOT_MET


def test_no_spread_and_too_few() -> None:
    assert verdict([2.0, 2.0, 2.0], target=1.9) == MET  # s.e. 0: any margin is beyond it
    assert verdict([2.0, 2.0, 2.0], target=2.0) == LEVEL
    assert verdict([5.0], target=0.0) == UNDECIDED  # one seed has no standard error
    assert verdict([], target=0.0) == UNDECIDED
    with pytest.raises(ValueError):
        verdict_from(1.0, -0.5)


def test_the_recorded_fed_grpo_lead_is_level() -> None:
    # docs/results.md, split by digit count, dense Fed-GRPO - FedAvg per seed: +0.4, +1.7, +1.0, -0.8, +0.2.
    # Mean 2.5 / 5 = 0.5; deviations -0.1, 1.2, 0.5, -1.3, -0.3; squares sum 3.48; variance 3.48 / 4 = 0.87;
    # s.e. sqrt(0.87 / 5) = 0.417: two s.e. 0.834 > 0.5, so not ahead beyond the seed noise (was "met").
    diffs = [0.4, 1.7, 1.0, -0.8, 0.2]
    mean, se = mean_se(diffs)
    assert mean == pytest.approx(0.5) and se == pytest.approx((0.87 / 5) ** 0.5)
    assert verdict(diffs, target=0.0) == LEVEL
    assert described(diffs, unit=" points") == "mean +0.50 +/- 0.42 s.e. points over 5 (target > +0.00): level"


def test_the_recorded_async_accuracy_is_level() -> None:
    # docs/scale.md, async - sync accuracy with the local fill, six pairs: +2.1, -1.9, +2.9, +0.6, -1.5, -3.5.
    # Mean -1.3 / 6 = -0.217; squares about the mean sum to 31.01, variance 6.20, s.e. sqrt(6.20 / 6) = 1.017.
    # Target: within 2 points below sync (> -2): the margin 1.78 is under two s.e. (2.03), so level (was "met").
    diffs = [2.1, -1.9, 2.9, 0.6, -1.5, -3.5]
    mean, se = mean_se(diffs)
    assert mean == pytest.approx(-1.3 / 6) and se == pytest.approx(1.0167, abs=1e-4)
    assert verdict(diffs, target=-2.0) == LEVEL
    # The four pairs without the fill, -3.1, -3.9, -4.3, -3.8 (mean -3.775, s.e. 0.25): clearly short of -2.
    assert verdict([-3.1, -3.9, -4.3, -3.8], target=-2.0) == NOT_MET
