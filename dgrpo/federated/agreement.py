"""Which updates of a round apply to this node's global weights, and whether this node is the one that diverged.

Every update names the SHA-256 of the global weights it was computed against (its ``base``,
``docs/protocol.md``, "Rounds"). A delta taken from other weights is not an update of ours: added to our
weights it moves them somewhere no client trained towards, so the aggregator leaves it out (``stale_base``).
Nodes hold different weights when one aggregated a different set of updates (a deadline passed, a heartbeat
came late), joined from a wrong state, or started from other initial weights; without the hash they would
go on training apart, silently. In the decentralised topology, the node whose base most of the round's
updates do not share is the one that diverged: it takes the state over from its peers (state sync). A tie
keeps our own weights, so one peer cannot make another re-sync by itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class BaseAgreement:
    stale: frozenset[str]  # authors whose update was computed against other weights than ours
    majority: bytes  # the base most authors share (ours on a tie)
    diverged: bool  # the majority's base is not ours: our weights are the odd ones


def agree(own: bytes, bases: Mapping[str, bytes]) -> BaseAgreement:
    """``bases``: author -> the base its update names (this node's own included, or not).

    Worked example (``tests/test_federated_core.py``): own ``a``, bases {n1: a, n2: b, n3: b}: n2 and n3 are
    stale, the majority is ``b`` (2 against 1 with n1), so this node diverged. Own ``a``, {me: a, n2: b}: n2
    is stale, a tie of one each keeps ``a``.
    """
    counts = Counter(bases.values())
    ours = counts.get(own, 0)
    best, best_count = own, ours
    for base, count in sorted(counts.items()):  # sorted: every node breaks ties among others' bases alike
        if count > best_count:
            best, best_count = base, count
    return BaseAgreement(frozenset(a for a, b in bases.items() if b != own), best, best != own)
