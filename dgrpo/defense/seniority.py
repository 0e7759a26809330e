"""Seniority: what an identity has earned by verified work, so that a node weighs its peers by what their
identities cost, not by how many there are (issue 24). Keys are free: ten or fifty fresh identities cost an
attacker nothing, and a node that trained on every completion it received trained 62-76% on theirs.

An author earns one round of seniority in each round in which at least one of its completions that this node
drew passed the defense chain and scored a positive reward with this node's own verifier: work a Sybil cannot
fake without doing it (a correct answer to the prompt the plan assigned). Rounds are counted once each, whatever
the number of completions. An author with fewer than ``young_rounds`` (K) rounds is **young**: the draw stage
(:mod:`dgrpo.round.draw`) gives young authors together at most ``young_share`` of the external completions, and
weighs each author by :meth:`Seniority.weight`, ``(1 + min(rounds, K)) / (1 + K)``: a fresh identity 1/(K+1)
of a senior one (the warm-up of reputation systems that admit newcomers at a low weight, e.g. EigenTrust's
pre-trusted peers and SAPO's swarm sampling).

Bounded: at most ``max_authors`` authors, the least recently credited forgotten first (a forgotten author is
young again: forgetting costs it, never helps it). Kept in the checkpoint with the reputation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any


class Seniority:
    def __init__(self, young_rounds: int, max_authors: int = 10_000) -> None:
        if young_rounds < 0:
            raise ValueError("young_rounds must be >= 0")
        self.young_rounds = young_rounds
        self.max_authors = max_authors
        self._rounds: OrderedDict[str, tuple[int, int]] = OrderedDict()  # author -> (rounds earned, last round)
        self._most = 0  # the most rounds any author earned (never lowered by forgetting: an upper bound)
        self._seniors = 0  # authors with at least young_rounds rounds (has_seniors in O(1), every round)

    def credit(self, round_idx: int, authors: Iterable[str]) -> None:
        """``authors`` did verified work in ``round_idx`` (each counts once per round)."""
        k = self.young_rounds
        for author in set(authors):
            was = self._rounds[author][0] >= k if author in self._rounds else False
            earned, last = self._rounds.pop(author, (0, -1))
            now = (earned + 1, round_idx) if round_idx != last else (earned, last)
            self._rounds[author] = now
            self._most = max(self._most, now[0])
            self._seniors += (now[0] >= k) - was
            while len(self._rounds) > self.max_authors:
                _, (gone, _) = self._rounds.popitem(last=False)
                self._seniors -= gone >= k

    def rounds(self, author: str) -> int:
        return self._rounds.get(author, (0, -1))[0]

    def young(self, author: str) -> bool:
        return self.rounds(author) < self.young_rounds

    def has_seniors(self) -> bool:
        """Whether any author this node knows is no longer young (the draw then never tops up with young ones)."""
        return self._seniors > 0

    def seniors(self, limit: int) -> list[str]:
        """Up to ``limit`` authors that are no longer young, those with the most rounds of verified work first:
        the peers a node sends its own messages to directly (``GossipNode.publish_directly_to``)."""
        k = self.young_rounds
        ranked = sorted(((earned, a) for a, (earned, _) in self._rounds.items() if earned >= k), reverse=True)
        return [a for _, a in ranked[: max(0, limit)]]

    def max_weight(self) -> float:
        """At least every author's :meth:`weight`, in O(1): the draw's sampling path scales its acceptance by it."""
        k = self.young_rounds
        return (1 + min(self._most, k)) / (1 + k)

    def weight(self, author: str) -> float:
        k = self.young_rounds
        return (1 + min(self.rounds(author), k)) / (1 + k)

    def to_dict(self) -> dict[str, Any]:
        return {author: [earned, last] for author, (earned, last) in self._rounds.items()}

    def load(self, state: dict[str, Any]) -> None:
        """Restore :meth:`to_dict` (malformed entries skipped: an old checkpoint may predate the field)."""
        for author, value in state.items():
            try:
                earned, last = int(value[0]), int(value[1])
            except (TypeError, ValueError, IndexError):
                continue
            self._rounds[str(author)] = (earned, last)
            self._most = max(self._most, earned)
        self._seniors = sum(earned >= self.young_rounds for earned, _ in self._rounds.values())

    def snapshot(self) -> dict[str, int]:
        return {author: earned for author, (earned, _) in self._rounds.items()}
