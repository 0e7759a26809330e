"""The draw stage: bounded work per node (issue 24; SAPO, arXiv 2509.08721, trains each node on I local and J
external rollouts a round). Between admit and defend::

    admit -> draw -> defend -> score -> advantages -> update

A node keeps every completion of its own (I) and draws at most ``external`` (J) of its peers' admitted
completions, so what it verifies, scores and trains on is bounded by J, not by the size of the network. The
draw happens at round close, after the round's rollouts have arrived, with the node's private randomness
(:func:`private_rng`): a publisher cannot know who will use its completions, nor aim at one node. Without a bound
(``external`` None, the default) every admitted completion is kept: the papers' all-gather.

Rules, in order: each completion of a peer gets the Efraimidis-Spirakis key ``u ** (1 / w)`` (``u`` uniform,
``w`` its author's seniority weight, :class:`dgrpo.defense.seniority.Seniority`), which samples without
replacement with probability proportional to ``w``; completions are taken in decreasing key order, skipping one
whose author already gave ``per_author``, or whose author is young once young authors gave ``young_cap`` (the
floor of ``young_share * external``), until ``external`` are taken. A node that knows no senior author yet (the
start of a run: everyone is young) tops up in a second pass, in the same order, from the young authors' skipped
completions, so that it trains on its peers at all; a node that knows one never does (it then trains on fewer
than ``external`` when seniors offer too few). **The bound**: whatever the number of young identities, once a
node knows a senior author they make up at most ``floor(young_share * external)`` of the external completions it
draws in any round, at most ``per_author`` each.
A drawn completion keeps its rollout's index, so the plan binding and the sampling proof judge it as before.

**Cost.** Keying every offered completion costs O(offered): the draw would grow with the network like the receive
path. Where many more are offered than drawn (``offered > SCAN_FACTOR * external``) the draw samples instead: a
uniform position among the admitted rollouts and a uniform completion of it, kept with probability ``w`` (the
weights are at most 1) unless it is the node's own, taken already or capped. Each kept sample is then drawn with
probability proportional to ``w`` among the eligible completions not yet taken: the same successive sampling
without replacement as the keys give, in O(J) expected steps while most offered completions are eligible. Where
that does not finish within ``16 * external + 64`` tries (most of what is offered is capped: a Sybil crowd) the
remaining draws fall back to the keyed pass, so the rules and the bound never depend on which path ran. A node
that knows no senior samples uncapped: every author is young then, and the keyed pass's two passes amount to the
top J keys. Under a crowd of young identities beside a few seniors the cap rejects most samples and the fallback
runs: the draw then costs O(offered) again, as before.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
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


SCAN_FACTOR = 4  # key every offered completion when at most this many times J are offered


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
) -> Drawn:
    """The draw. ``offered`` (peers' admitted completions), ``own`` (positions of the node's own rollouts in
    ``admitted``) and ``per_rollout`` (the most completions a rollout may hold: the plan's share) are counted by
    the admit stage, with the other per-message work; without them they are counted here. ``everyone_young``:
    the caller knows no senior author (so every author here is young), which lets the sampling path run
    uncapped (the node's ``top_up`` case). ``max_weight``: at least every author's weight
    (:meth:`Seniority.max_weight`); the sampling path keeps a sample with probability ``w / max_weight``, the same
    distribution with fewer rejections where every weight is small (the start of a run: everyone fresh, 1/6)."""
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
        state.sample(me, rng, per, not uncapped, min(1.0, max(max_weight, 1e-9)))
    if state.total < rules.external:
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
        self.taken: dict[int, list[int]] = defaultdict(list)
        self.chosen: set[tuple[int, int]] = set()
        self.per_author: Counter[str] = Counter()
        self.young_taken = 0
        self.total = 0

    def weight(self, author: str) -> float:
        if author not in self._weights:
            self._weights[author] = min(max(self._weight(author), 1e-9), 1.0)
        return self._weights[author]

    def young(self, author: str) -> bool:
        if author not in self._youth:
            self._youth[author] = self._young(author)
        return self._youth[author]

    def take(self, j: int, i: int, capped: bool) -> bool:
        """Take completion ``i`` of rollout ``j`` if the rules allow it."""
        author = self.admitted[j].rollout.author
        if (j, i) in self.chosen or self.per_author[author] >= self.rules.per_author:
            return False
        is_young = self.young(author)
        if capped and is_young and self.young_taken >= self.cap:
            return False
        self.chosen.add((j, i))
        self.taken[j].append(i)
        self.per_author[author] += 1
        self.young_taken += is_young
        self.total += 1
        return True

    def sample(self, me: str, rng: random.Random, per_rollout: int, capped: bool = True, bound: float = 1.0) -> None:
        """Rejection sampling: O(J) expected steps when most of what is offered is eligible. ``bound``: no
        weight exceeds it, so keeping with probability ``w / bound`` samples in proportion to ``w`` still."""
        n = len(self.admitted)
        for _ in range(16 * self.external + 64):
            if self.total >= self.external:
                return
            j = rng.randrange(n)
            rollout = self.admitted[j].rollout
            i = rng.randrange(per_rollout)
            if rollout.author == me or i >= len(rollout.completions):
                continue
            if rng.random() * bound >= self.weight(rollout.author):
                continue
            self.take(j, i, capped)

    def scan(self, me: str, rng: random.Random, top_up: bool) -> None:
        """Key every offered completion (Efraimidis-Spirakis) and take them in decreasing key order."""
        keyed = []
        for j, a in enumerate(self.admitted):  # one key per completion, in the admitted order: reproducible
            if a.rollout.author == me:
                continue
            w = self.weight(a.rollout.author)
            for i in range(len(a.rollout.completions)):
                keyed.append((rng.random() ** (1.0 / w), j, i))
        keyed.sort(key=lambda t: -t[0])
        # The second pass tops up with young authors' completions where seniors gave too few; only for a node
        # that knows no senior author yet (``top_up``): once it has one, young authors never exceed the cap.
        for capped in (True, False) if top_up else (True,):
            for _, j, i in keyed:
                if self.total >= self.external:
                    return
                self.take(j, i, capped)


def _subset(a: Admitted, positions: list[int]) -> Admitted:
    r = a.rollout
    if len(positions) == len(r.completions):  # all of it (positions are distinct): no copy
        return a
    rollout = r.model_copy(
        update={
            "completions": tuple(r.completions[p] for p in positions),
            "indices": tuple(r.indices[p] for p in positions),
        }
    )
    return Admitted(rollout, a.prompt)
