"""The draw stage: bounded work per node (issue 24; SAPO, arXiv 2509.08721, trains each node on I local and J
external rollouts a round). Between admit and defend::

    admit -> draw -> defend -> score -> advantages -> update

A node keeps every completion of its own (I) and draws at most ``external`` (J) of its peers' admitted
completions, so what it verifies, scores and trains on is bounded by J, not by the size of the network. The
draw happens at round close, after the round's rollouts have arrived, with the node's private randomness
(:func:`private_rng`): a publisher cannot know who will use its completions, nor aim at one node. Without a bound
(``external`` None, the default) every admitted completion is kept: the papers' all-gather.

The unit drawn is a rollout (an author's answers to one prompt: SAPO's unit, a prompt's group), J and the caps
count completions. Rules, in order: each peer's rollout gets the Efraimidis-Spirakis key ``u ** (1 / w)`` (``u``
uniform, ``w`` its author's seniority weight, :class:`dgrpo.defense.seniority.Seniority`), which samples without
replacement with probability proportional to ``w``; rollouts are taken in decreasing key order, each with as many
of its completions as the rules leave room for: at most ``per_author`` from one author, at most ``young_cap`` (the
floor of ``young_share * external``) from young authors together, until ``external`` are taken. Where the room is
smaller than the rollout, which of its completions are taken is drawn too (an author cannot put first the answers
it wants trained on). A node that knows no senior author yet (the start of a run: everyone is young) tops up in a
second pass, in the same order, from the young authors' skipped completions, so that it trains on its peers at
all; a node that knows one never does (it then trains on fewer than ``external`` when seniors offer too few).
**The bound**: whatever the number of young identities, once a node knows a senior author they make up at most
``floor(young_share * external)`` of the external completions it draws in any round, at most ``per_author`` each.
A drawn completion keeps its rollout's index, so the plan binding and the sampling proof judge it as before.

**Why whole rollouts.** Drawn one completion at a time, a large network's J completions come from J rollouts,
each cut down to one answer (a copy each), and a vertical split's prompt would be trained on as a group of one,
whose GRPO advantage is zero; a small network's, from a few whole rollouts. Drawing rollouts makes a round at
N = 100 the same work as at N = 3 (``benchmarks/draw_cost.py``: docs/scale.md) and keeps groups whole.

**Cost.** Keying every offered rollout costs O(offered): the draw would grow with the network like the receive
path. Where many more completions are offered than drawn (``offered > SCAN_FACTOR * external``) the draw samples
instead. The admit stage, which touches every message anyway, indexes peers' admitted rollouts by their author's
weight (:attr:`dgrpo.round.outcome.Admission.by_weight`: at most K + 1 classes); the draw picks a class with
probability proportional to its weight times its rollouts and a rollout in it uniformly, and takes it unless taken
already or capped: each kept sample is drawn with probability proportional to ``w`` among the eligible rollouts not
yet taken, the same successive sampling without replacement as the keys give, in O(J) expected steps. Once young
authors gave the cap's worth their classes leave the pool, and where the seniors' rollouts left are few they are
keyed alone (O(J)): a crowd of young identities beside a few seniors costs no more than an honest network. Without
the index (a caller that has none) it samples a uniform rollout and keeps it with probability ``w / max_weight``.
Where sampling does not finish within ``16 * external + 64`` tries the remaining draws fall back to the keyed pass
over everything offered, so the rules and the bound never depend on which path ran. A node that knows no senior
samples uncapped: every author is young then, and the keyed pass's two passes amount to the top J keys.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dgrpo.round.outcome import Admitted, Drawn


@dataclass(frozen=True)
class DrawRules:
    external: int | None = None  # J; None: no bound (every admitted completion)
    per_author: int = 4
    young_share: float = 0.25


def young_cap(external: int, share: float) -> int:
    return math.floor(external * share + 1e-9)


def private_rng(secret: bytes, round_idx: int) -> random.Random:
    """The draw's randomness: from the node's secret (its identity key) and the round, so that nobody else can
    predict it and a restarted node draws as it would have."""
    digest = hashlib.sha256(b"dgrpo/draw/1\x00" + secret + round_idx.to_bytes(8, "big")).digest()
    return random.Random(int.from_bytes(digest, "big"))


SCAN_FACTOR = 4  # key every offered rollout where at most this many times J completions are offered


def draw(
    admitted: Sequence[Admitted],
    me: str,
    rules: DrawRules,
    weight: Callable[[str], float],
    young: Callable[[str], bool],
    rng: random.Random,
    top_up: bool = True,
    offered: int | None = None,
    own: Sequence[int] | None = None,
    per_rollout: int | None = None,
    everyone_young: bool = False,
    max_weight: float = 1.0,
    by_weight: Mapping[float, Sequence[int]] | None = None,
) -> Drawn:
    """The draw. ``offered`` (peers' admitted completions), ``own`` (positions of the node's own rollouts in
    ``admitted``) and ``per_rollout`` (the most completions a rollout may hold: the plan's share) are counted by
    the admit stage, with the other per-message work; without them they are counted here. ``everyone_young``:
    the caller knows no senior author (so every author here is young), which lets the sampling path run
    uncapped (the node's ``top_up`` case). ``max_weight``: at least every author's weight
    (:meth:`Seniority.max_weight`); the sampling path keeps a sample with probability ``w / max_weight``, the same
    distribution with fewer rejections where every weight is small (the start of a run: everyone fresh, 1/6).
    ``by_weight``: peers' admitted rollouts (positions) by their author's weight, indexed by the admit stage
    (:attr:`dgrpo.round.outcome.Admission.by_weight`): the sampling path then picks a weight class in
    proportion to its total weight and a rollout in it uniformly, with no rejection by weight at all."""
    if offered is None:
        offered = sum(len(a.rollout.completions) for a in admitted if a.rollout.author != me)
    if own is None:
        own = [j for j, a in enumerate(admitted) if a.rollout.author == me]
    if rules.external is None:
        by_author = Counter(a.rollout.author for a in admitted for _ in a.rollout.completions)
        by_author.pop(me, None)
        return Drawn(tuple(admitted), offered, offered, 0, dict(by_author), True)
    state = _DrawState(admitted, rules, weight, young)
    if offered > SCAN_FACTOR * rules.external:
        # A node that knows no senior sees only young authors: the keyed pass would take the cap's worth first
        # and top up from the same order, i.e. the top J keys; sampling uncapped is the same draw.
        uncapped = everyone_young and top_up
        per = per_rollout or max(len(a.rollout.completions) for a in admitted)
        if by_weight is not None:
            state.sample_classes(rng, per, not uncapped, by_weight)
        else:
            state.sample(me, rng, not uncapped, min(1.0, max(max_weight, 1e-9)))
    if state.total < rules.external and not state.settled:
        state.scan(me, rng, top_up)
    kept_at = sorted({*own, *state.taken})  # in the admitted order (by prompt, author, part), as later stages expect
    kept = [admitted[j] if j not in state.taken else _subset(admitted[j], sorted(state.taken[j])) for j in kept_at]
    return Drawn(
        tuple(kept),
        offered=offered,
        drawn=state.total,
        young_drawn=state.young_taken,
        by_author=dict(state.per_author),
        full=state.total >= rules.external,
    )


class _DrawState:
    """What has been drawn so far, and the rules a next completion must pass."""

    def __init__(
        self,
        admitted: Sequence[Admitted],
        rules: DrawRules,
        weight: Callable[[str], float],
        young: Callable[[str], bool],
    ) -> None:
        assert rules.external is not None
        self.admitted = admitted
        self.rules = rules
        self.external = rules.external
        self.cap = young_cap(rules.external, rules.young_share)
        self._weight = weight
        self._young = young
        self._weights: dict[str, float] = {}
        self._youth: dict[str, bool] = {}
        self.taken: dict[int, list[int]] = {}  # rollout position -> completion positions taken
        self.per_author: Counter[str] = Counter()
        self.young_taken = 0
        self.total = 0
        self.settled = False  # sampling found that nothing more may be drawn (no keyed pass needed)

    def weight(self, author: str) -> float:
        if author not in self._weights:
            self._weights[author] = min(max(self._weight(author), 1e-9), 1.0)
        return self._weights[author]

    def young(self, author: str) -> bool:
        if author not in self._youth:
            self._youth[author] = self._young(author)
        return self._youth[author]

    def take(self, j: int, capped: bool, rng: random.Random) -> bool:
        """Take rollout ``j``: all of its completions the rules leave room for (a rollout is SAPO's unit, a prompt's
        group of answers; J, the per-author bound and the young cap still count completions). Where the room is
        smaller than the rollout, which of its completions are taken is drawn too (``rng``), so that an author
        cannot choose which of its answers a capped draw keeps. Returns whether anything was taken."""
        author = self.admitted[j].rollout.author
        room = min(self.external - self.total, self.rules.per_author - self.per_author[author])
        is_young = self.young(author)
        if capped and is_young:
            room = min(room, self.cap - self.young_taken)
        taken = self.taken.get(j)
        n = len(self.admitted[j].rollout.completions)
        if room <= 0 or (taken is not None and len(taken) >= n):
            return False
        left = list(range(n)) if taken is None else [i for i in range(n) if i not in taken]
        chosen = left if room >= len(left) else sorted(rng.sample(left, room))
        self.taken[j] = chosen if taken is None else sorted(taken + chosen)
        self.per_author[author] += len(chosen)
        self.young_taken += is_young * len(chosen)
        self.total += len(chosen)
        return True

    def sample(self, me: str, rng: random.Random, capped: bool = True, bound: float = 1.0) -> None:
        """Rejection sampling: O(J) expected steps when most of what is offered is eligible. ``bound``: no
        weight exceeds it, so keeping with probability ``w / bound`` samples in proportion to ``w`` still."""
        admitted, weights, weight = self.admitted, self._weights, self.weight
        count = len(admitted)
        uniform = rng.random
        # Per try a few hundred nanoseconds: at the start of a run most samples are rejected by weight (fresh
        # authors 1/(K+1) against the most senior one's bound), so the loop is what grows past N = 3.
        for _ in range(16 * self.external + 64):
            if self.total >= self.external:
                return
            j = min(int(uniform() * count), count - 1)
            author = admitted[j].rollout.author
            if author == me:
                continue
            w = weights.get(author)
            if uniform() * bound >= (weight(author) if w is None else w):
                continue
            self.take(j, capped, rng)

    def sample_classes(
        self, rng: random.Random, per_rollout: int, capped: bool, by_weight: Mapping[float, Sequence[int]]
    ) -> None:
        """Sampling by weight class: a class with probability proportional to its weight times its rollouts, a
        rollout in it uniformly, so every peer's rollout comes with probability proportional to its author's
        weight, as in :meth:`sample`, without rejections by weight. Once young authors gave the cap's worth, their
        classes (weight below 1: not yet ``young_rounds`` rounds) leave the pool: a crowd of young identities
        costs no tries then. ``per_rollout``: the most completions a rollout holds (sizes the seniors left)."""
        pools = [(min(max(w, 1e-9), 1.0), positions) for w, positions in sorted(by_weight.items()) if positions]
        uniform = rng.random
        cumulative = list(itertools.accumulate(w * len(positions) for w, positions in pools))
        young_closed = False
        for _ in range(16 * self.external + 64):
            if self.total >= self.external or not pools:
                return
            if capped and not young_closed and self.young_taken >= self.cap:
                pools = [(w, positions) for w, positions in pools if w >= 1.0]
                young_closed = True
                # Nobody young may be drawn any more: what is left is the seniors' rollouts. Where they are few,
                # key them (the keyed pass on them alone draws as the full one would) rather than sample among
                # rollouts that are mostly taken already.
                left = [j for _, positions in pools for j in positions]
                if len(left) * per_rollout <= SCAN_FACTOR * self.external:
                    self.scan("", rng, False, sorted(left))
                    self.settled = True
                    return
                cumulative = list(itertools.accumulate(w * len(positions) for w, positions in pools))
            # a class in proportion to its total weight (at most K + 1 classes), then a rollout in it uniformly
            c = min(bisect.bisect_right(cumulative, uniform() * cumulative[-1]), len(pools) - 1)
            positions = pools[c][1]
            self.take(positions[min(int(uniform() * len(positions)), len(positions) - 1)], capped, rng)

    def scan(self, me: str, rng: random.Random, top_up: bool, positions: Sequence[int] | None = None) -> None:
        """Key every offered rollout (Efraimidis-Spirakis) and take them in decreasing key order; with
        ``positions``, only those rollouts (peers' ones)."""
        keyed = []
        for j in range(len(self.admitted)) if positions is None else positions:  # in the admitted order
            author = self.admitted[j].rollout.author
            if author != me:
                keyed.append((rng.random() ** (1.0 / self.weight(author)), j))
        keyed.sort(key=lambda t: -t[0])
        # The second pass tops up with young authors' completions where seniors gave too few; only for a node
        # that knows no senior author yet (``top_up``): once it has one, young authors never exceed the cap.
        for capped in (True, False) if top_up else (True,):
            for _, j in keyed:
                if self.total >= self.external:
                    return
                self.take(j, capped, rng)


def _subset(a: Admitted, positions: list[int]) -> Admitted:
    r = a.rollout
    if len(positions) == len(r.completions):  # all of it (positions are distinct): no copy
        return a
    return Admitted(r.subset(positions), a.prompt)
