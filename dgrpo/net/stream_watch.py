"""Connections whose pubsub stream died: closed, so that they are dialled again.

py-libp2p keeps a connection open after the peer's pubsub stream fails, and retries the stream a bounded number
of times; under load (50 Sybils connecting to one node at once) every retry failed, and the honest peers kept an
open connection without gossip for good: the bootstrap loop redials only peers that are not connected, and peer
exchange dials nobody from a node already over ``target_peers``. Seen in ``benchmarks/sybil.py``: an honest node
lost both honest peers and ran its rounds alone. A peer that had a pubsub stream, is still connected, and has had
none for ``after`` seconds has its connection closed; whichever side holds the other in its bootstrap list or
peer exchange dials again, and the new connection opens a new stream.
"""

from __future__ import annotations

from collections.abc import Set


class StreamWatch:
    def __init__(self, after: float) -> None:
        self.after = after
        self._gossiped: set[str] = set()  # peers that had a pubsub stream while connected
        self._since: dict[str, float] = {}  # peer -> when it was first seen connected without a stream

    def update(self, connected: Set[str], gossiping: Set[str], now: float) -> list[str]:
        """The peers whose connection to close now. ``connected``: connected at the host; ``gossiping``: with an
        open pubsub stream. A peer that never had a stream here (an AutoNAT dial-back, a joiner asking for the
        manifest) is left alone; one that disconnected is forgotten."""
        self._gossiped = (self._gossiped | set(gossiping)) & set(connected)
        stale = self._gossiped - set(gossiping)
        self._since = {peer: self._since.get(peer, now) for peer in stale}
        due = sorted(peer for peer, since in self._since.items() if now - since >= self.after)
        for peer in due:
            self._gossiped.discard(peer)
            del self._since[peer]
        return due
