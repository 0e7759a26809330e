"""Per-round collection of received rollouts: buffering, quorum and stale-round rejection.

A round closes at quorum (every expected peer has sent all the parts it announced) or at a deadline, so a
peer that vanishes mid-round cannot stall the others. Messages for rounds already closed are counted and
dropped; messages a little ahead (a faster peer) are kept until their round opens.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

import trio

from dgrpo.protocol.messages import Rollout


class RoundInbox:
    def __init__(self, max_rounds_ahead: int = 2, max_messages_per_round: int = 10_000) -> None:
        self.max_rounds_ahead = max_rounds_ahead
        self.max_messages_per_round = max_messages_per_round
        self.current = 0
        self._rounds: dict[int, dict[tuple[str, int], Rollout]] = defaultdict(dict)
        self._parts: dict[tuple[int, str], int] = {}
        self._changed = trio.Event()
        self.rejected: Counter[str] = Counter()

    def open(self, round_idx: int) -> None:
        """Start collecting ``round_idx``; anything buffered for older rounds is dropped and counted."""
        self.current = round_idx
        for old in [r for r in self._rounds if r < round_idx]:
            self.rejected["closed_round"] += len(self._rounds.pop(old))

    def add(self, rollout: Rollout) -> str | None:
        """File a received rollout; returns a rejection reason, or None when kept."""
        if rollout.round < self.current:
            self.rejected["closed_round"] += 1
            return "closed_round"
        if rollout.round > self.current + self.max_rounds_ahead:
            self.rejected["future_round"] += 1
            return "future_round"
        if rollout.part >= rollout.parts:
            self.rejected["bad_part"] += 1
            return "bad_part"
        bucket = self._rounds[rollout.round]
        key = (rollout.author, rollout.part)
        if key in bucket:
            self.rejected["duplicate_part"] += 1
            return "duplicate_part"
        if len(bucket) >= self.max_messages_per_round:
            self.rejected["round_full"] += 1
            return "round_full"
        bucket[key] = rollout
        self._parts[(rollout.round, rollout.author)] = rollout.parts
        self._changed.set()
        self._changed = trio.Event()
        return None

    def complete(self, round_idx: int, authors: Iterable[str]) -> bool:
        """True once every author in ``authors`` has delivered every part it announced for the round."""
        bucket = self._rounds.get(round_idx, {})
        for author in authors:
            parts = self._parts.get((round_idx, author))
            if parts is None or sum(1 for (a, _) in bucket if a == author) < parts:
                return False
        return True

    def authors(self, round_idx: int) -> set[str]:
        return {a for (a, _) in self._rounds.get(round_idx, {})}

    async def wait_complete(self, round_idx: int, authors: Iterable[str]) -> None:
        expected = set(authors)
        while not self.complete(round_idx, expected):
            await self._changed.wait()

    def take(self, round_idx: int) -> list[Rollout]:
        """Close the round and return what arrived for it; later arrivals for it count as ``closed_round``."""
        self.current = max(self.current, round_idx + 1)
        return list(self._rounds.pop(round_idx, {}).values())

    async def pump(self, channel: trio.MemoryReceiveChannel[Rollout]) -> None:
        """Drain a transport's inbound channel promptly into the inbox (never let gossip buffers fill)."""
        async for rollout in channel:
            self.add(rollout)
