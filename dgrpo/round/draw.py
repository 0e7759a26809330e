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


def draw(
    admitted: Sequence[Admitted],
    me: str,
    rules: DrawRules,
    weight: Callable[[str], float],
    young: Callable[[str], bool],
    rng: random.Random,
    top_up: bool = True,
) -> Drawn:
    units = [
        (j, i) for j, a in enumerate(admitted) if a.rollout.author != me for i in range(len(a.rollout.completions))
    ]
    if rules.external is None:
        by_author = Counter(admitted[j].rollout.author for j, _ in units)
        return Drawn(tuple(admitted), len(units), len(units), 0, dict(by_author), True)
    keyed = []
    for j, i in units:  # one draw per unit, in the admitted order: reproducible for a given rng
        w = max(weight(admitted[j].rollout.author), 1e-9)
        keyed.append((rng.random() ** (1.0 / w), j, i))
    keyed.sort(key=lambda t: -t[0])
    cap = young_cap(rules.external, rules.young_share)
    taken: dict[int, list[int]] = defaultdict(list)
    per_author: Counter[str] = Counter()
    young_taken = total = 0
    chosen: set[tuple[int, int]] = set()
    # The second pass tops up with young authors' completions where seniors gave too few; only for a node that
    # knows no senior author yet (``top_up``): once it has one, young authors never exceed the cap.
    for capped in (True, False) if top_up else (True,):
        for _, j, i in keyed:
            if total >= rules.external:
                break
            author = admitted[j].rollout.author
            if (j, i) in chosen or per_author[author] >= rules.per_author:
                continue
            is_young = young(author)
            if capped and is_young and young_taken >= cap:
                continue
            chosen.add((j, i))
            taken[j].append(i)
            per_author[author] += 1
            young_taken += is_young
            total += 1
    kept = [  # in the admitted order (by prompt, author, part), as the stages after expect
        a if a.rollout.author == me else _subset(a, sorted(taken[j]))
        for j, a in enumerate(admitted)
        if a.rollout.author == me or j in taken
    ]
    return Drawn(
        tuple(kept),
        offered=len(units),
        drawn=total,
        young_drawn=young_taken,
        by_author=dict(per_author),
        full=total >= rules.external,
    )


def _subset(a: Admitted, positions: list[int]) -> Admitted:
    r = a.rollout
    rollout = r.model_copy(
        update={
            "completions": tuple(r.completions[p] for p in positions),
            "indices": tuple(r.indices[p] for p in positions),
        }
    )
    return Admitted(rollout, a.prompt)
