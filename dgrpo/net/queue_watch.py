"""Which peers' outbound queues a publish waits for (:meth:`dgrpo.net.gossip.GossipNode._pace`).

A node paces its own publishing on its peers' outbound queues (py-libp2p's hold 32 RPCs and refuse what comes when
full), so that a burst of its own rollouts is not dropped. A peer that stopped reading (SIGSTOPped, frozen, or
slow on purpose) would then make every publish wait ``pacing_timeout``: honest rounds took 17.8 s instead of
about 1 s (``tests/test_gossip_defences.py``). Only a queue that shrinks, or stays short, shows that its peer
reads; one that stays long for ``stuck_after`` seconds is not waited for any more (py-libp2p drops what does not
fit, counted per peer), until it moves again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

logger = logging.getLogger("dgrpo.net.gossip")  # the node's logger: these are its warnings


class QueueWatch:
    """The length of each live peer's outbound queue over time, and which peers are stuck."""

    def __init__(self, max_outbound_queue: int, stuck_after: float) -> None:
        self.max_outbound_queue = max_outbound_queue
        self.stuck_after = stuck_after
        self._seen: dict[str, tuple[int, float]] = {}  # peer -> (length, since when it has not shrunk)
        self.stuck: set[str] = set()
        self.stuck_count = 0  # times a peer was found stuck (``/status`` ``gossip.stuck_peers``)

    def update(self, lengths: Mapping[str, int], now: float) -> dict[str, int]:
        """Given the live peers' queue lengths at ``now``, the lengths of those a publish waits for (every live
        peer that is not stuck); peers no longer live are forgotten."""
        for peer in set(self._seen) - set(lengths):
            del self._seen[peer]
            self.stuck.discard(peer)
        waiting: dict[str, int] = {}
        for peer, length in lengths.items():
            seen, since = self._seen.get(peer, (-1, now))
            # Only a shrinking (or short) queue shows the peer reads: ours grows it, and a frozen peer's queue
            # grows to py-libp2p's 32 and stays there.
            if length < seen or length <= self.max_outbound_queue:
                since = now
            self._seen[peer] = (length, since)
            if now - since > self.stuck_after:
                if peer not in self.stuck:
                    self.stuck.add(peer)
                    self.stuck_count += 1
                    logger.warning(
                        "%s's outbound queue has not moved for %s s (%d RPCs): not waiting for it; what does not "
                        "fit is dropped to it and counted",
                        peer,
                        self.stuck_after,
                        length,
                    )
                continue
            if peer in self.stuck:
                self.stuck.discard(peer)
                logger.info("%s's outbound queue moves again", peer)
            waiting[peer] = length
        return waiting
