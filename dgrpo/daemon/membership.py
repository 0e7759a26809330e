"""The network's round as a node sees it, from its peers' heartbeats: robust statistics, so that one peer (or
any minority) naming a far-off round moves nobody there."""

from __future__ import annotations

from collections.abc import Iterable


def lower_median(rounds: Iterable[int]) -> int:
    """The lower median of peers' rounds (one peer naming a far-off round cannot move it); 0 for none."""
    ordered = sorted(rounds)
    return ordered[(len(ordered) - 1) // 2] if ordered else 0


def upper_median(rounds: Iterable[int]) -> int:
    """The upper median of peers' rounds (async mode: nodes that do not wait for each other spread out, and the
    front of the network is where the rollouts come from); 0 for none. A minority naming far-off rounds cannot
    move it; with two peers it is the more advanced one."""
    ordered = sorted(rounds)
    return ordered[len(ordered) // 2] if ordered else 0


JOIN_SPREAD = 2  # rounds a joiner believes peers may be ahead of the lower median of those under way


def joining_round(rounds: Iterable[int]) -> int:
    """The round a joiner takes the network to be in, from the rounds its peers under way announce: the most
    advanced one's, but never more than ``JOIN_SPREAD`` past their lower median. Taking the plain maximum let
    one peer (a Sybil a hostile bootstrap lists) send every joiner to a far-off round, alone there for good
    (catching up only moves forward); peers at a round boundary differ by one."""
    ordered = sorted(rounds)
    if not ordered:
        return 0
    median = lower_median(ordered)
    return max(r for r in ordered if r <= median + JOIN_SPREAD)
