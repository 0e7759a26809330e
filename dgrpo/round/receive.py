"""The receive stage: a node's buffer of received rollouts, per round, until quorum or the deadline.

A round closes at quorum (every expected peer has sent all the parts it announced) or at a deadline, so a
peer that vanishes mid-round cannot stall the others. Whether an arriving rollout is kept is the admit
stage's decision (:func:`dgrpo.round.admit.arrival_reason`: closed or too-far-future round, bad part,
duplicate part, full round), counted there; messages a little ahead (a faster peer) wait for their round.

In async mode (``staleness`` = the run's S > 0) a node never waits: each step at round t :meth:`drain` hands
it every author's complete rollouts of rounds t-S..t that arrived so far (with ``rollout.async_rounds_per_peer``
set, at most that many rounds of each, its newest), and keeps what is still incomplete (its other parts
in flight) or over that bound for a later step; a rollout of a round older than t-S is dropped as
``closed_round``. What was drained stays known, so a repeat is still a ``duplicate_part``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Container, Iterable

import trio

from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import Rollout
from dgrpo.round.admit import Admitter, arrival_reason


class RoundInbox:
    def __init__(self, admitter: Admitter | None = None, limits: Limits | None = None, staleness: int = 0) -> None:
        self.admitter = admitter
        self.limits = admitter.limits if admitter is not None else limits or Limits()
        self.current = 0
        # Until the node opens its first round it does not know which round is current (a late joiner is
        # still learning the network's): it keeps the newest rounds it hears of, up to rounds_ahead back.
        self.opened = False
        self._rounds: dict[int, dict[tuple[str, int], Rollout]] = defaultdict(dict)
        self._parts: dict[tuple[int, str], int] = {}
        self._held: Counter[tuple[int, str]] = Counter()  # (round, author) -> messages kept
        self.staleness = staleness  # async mode's S: rounds before the current one still taken
        self._taken: dict[int, set[tuple[str, int]]] = defaultdict(set)  # async: (author, part) drained
        # Async mode: the latest round anyone may publish for (the daemon's horizon, None: unknown). An async
        # node behind its peers keeps their rollouts up to it, not only ``rounds_ahead`` past its own round: it
        # moves up to their round at its next step and uses them then.
        self.horizon: int | None = None
        self._changed = trio.Event()
        self.rejected: Counter[str] = Counter()  # arrival rejections by reason (also in the admitter's counts)
        # author -> the newest round it sent a kept rollout for: with heartbeats, how far along each peer is
        # (a rollout can arrive before the heartbeat that announces its round).
        self.latest: dict[str, int] = {}
        # Told of every rollout not kept, with the reason: the transport gives back the quota slot it took at
        # gossipsub's validation (a rejected message must not use up its author's quota).
        self.on_rejected: Callable[[Rollout, str], None] | None = None

    def open(self, round_idx: int) -> None:
        """Start collecting ``round_idx``; anything buffered for older rounds is dropped and counted."""
        self.opened = True
        self._advance(round_idx)

    def _advance(self, round_idx: int) -> None:
        self.current = round_idx
        for old in [r for r in self._rounds if r < round_idx - self.staleness]:
            stale = self._rounds.pop(old)
            self.rejected["closed_round"] += len(stale)
            if self.admitter is not None:
                for author, _ in stale:
                    self.admitter.count("closed_round", author)
        self._forget_before(round_idx - self.staleness)

    def _forget_before(self, round_idx: int) -> None:
        """Drop the per-author bookkeeping of rounds before ``round_idx`` (bounded memory in a long run)."""
        for key in [k for k in self._held if k[0] < round_idx]:
            del self._held[key]
        for key in [k for k in self._parts if k[0] < round_idx]:
            del self._parts[key]
        for old in [r for r in self._taken if r < round_idx]:
            del self._taken[old]

    def add(self, rollout: Rollout) -> str | None:
        """File a received rollout; returns a rejection reason, or None when kept."""
        if not self.opened and rollout.round - self.limits.rounds_ahead > self.current:
            self._advance(rollout.round - self.limits.rounds_ahead)
        bucket = self._rounds.get(rollout.round, {})
        mine = self._held[(rollout.round, rollout.author)]
        taken = self._taken.get(rollout.round)
        seen: Container[tuple[str, int]] = bucket if not taken else bucket.keys() | taken
        held = len(bucket) + len(taken or ())
        ahead = self.horizon if self.staleness and self.horizon is not None else None
        if self.admitter is not None:
            reason = self.admitter.on_arrival(rollout, self.current, held, seen, mine, self.staleness, ahead)
        else:
            reason = arrival_reason(rollout, self.current, held, seen, self.limits, 0, None, self.staleness, ahead)
        if reason is not None:
            self.rejected[reason] += 1
            if self.on_rejected is not None:
                self.on_rejected(rollout, reason)
            return reason
        self._rounds[rollout.round][(rollout.author, rollout.part)] = rollout
        self._parts[(rollout.round, rollout.author)] = rollout.parts
        self._held[(rollout.round, rollout.author)] += 1
        self.latest[rollout.author] = max(rollout.round, self.latest.get(rollout.author, 0))
        self._changed.set()
        self._changed = trio.Event()
        return None

    def complete(self, round_idx: int, authors: Iterable[str]) -> bool:
        """True once every author in ``authors`` has delivered every part of the round: as many as the run's
        plan has prompts (an author announcing more cannot hold the round open; the admit stage rejects it),
        or, without a plan, as many as it announced."""
        bucket = self._rounds.get(round_idx, {})
        plan = self.admitter.plan if self.admitter is not None else None
        for author in authors:
            parts = plan.parts if plan is not None else self._parts.get((round_idx, author))
            if parts is None or sum(1 for (a, p) in bucket if a == author and p < parts) < parts:
                return False
        return True

    def authors(self, round_idx: int) -> set[str]:
        return {a for (a, _) in self._rounds.get(round_idx, {})}

    async def wait_complete(
        self,
        round_idx: int,
        authors: Iterable[str],
        still_expected: Callable[[set[str]], set[str]] | None = None,
        recheck_seconds: float = 0.25,
    ) -> set[str]:
        """Wait until every author still expected has delivered; returns those no longer expected.
        ``still_expected(expected)`` (re-asked on every arrival and every ``recheck_seconds``) narrows the set as
        peers announce ``stopping``, fall silent or disconnect: a round never waits for the dead."""
        expected = set(authors)
        waiting = expected
        while True:
            if still_expected is not None:
                waiting = expected & still_expected(expected)
            if self.complete(round_idx, waiting):
                return expected - waiting
            changed = self._changed
            if still_expected is None:
                await changed.wait()
            else:
                with trio.move_on_after(recheck_seconds):
                    await changed.wait()

    def take(self, round_idx: int) -> list[Rollout]:
        """Close the round and return what arrived for it; later arrivals for it count as ``closed_round``."""
        self.current = max(self.current, round_idx + 1)
        self._forget_before(self.current)
        return list(self._rounds.pop(round_idx, {}).values())

    def drain(self, round_idx: int, per_author: int | None = None) -> list[Rollout]:
        """Async mode: every author's complete rollouts (all of its plan's parts; without a plan, all it
        announced) of rounds up to ``round_idx`` that arrived so far. An author whose parts are still in
        flight keeps them here for a later step, until its round falls out of the window. ``per_author``: at
        most that many rounds of one author, its newest complete ones; older complete ones stay for a later step
        (and leave with the window). Without it a straggler, which hears every fast peer's rounds of S steps at
        each of its own, trained on all of them at once: its steps grew with its lag (160 completions against a
        sync round's 48 with a 3x straggler) and it fell 8x behind instead of 3x."""
        plan = self.admitter.plan if self.admitter is not None else None
        taken: Counter[str] = Counter()
        out: list[Rollout] = []
        for r in sorted((k for k in self._rounds if k <= round_idx), reverse=True):  # newest first
            bucket = self._rounds[r]
            by_author: dict[str, list[tuple[str, int]]] = defaultdict(list)
            for key in bucket:
                by_author[key[0]].append(key)
            for author, keys in by_author.items():
                parts = plan.parts if plan is not None else self._parts.get((r, author), 0)
                if sum(1 for (_, p) in keys if p < parts) < parts:
                    continue
                if per_author is not None and taken[author] >= per_author:
                    continue
                taken[author] += 1
                for key in keys:
                    out.append(bucket.pop(key))
                    self._taken[r].add(key)
            if not bucket:
                del self._rounds[r]
        out.sort(key=lambda rollout: rollout.round)  # oldest first, as the window was drained before
        return out

    async def pump(self, channel: trio.MemoryReceiveChannel[Rollout]) -> None:
        """Drain a transport's inbound channel promptly into the inbox (never let gossip buffers fill)."""
        async for rollout in channel:
            self.add(rollout)
