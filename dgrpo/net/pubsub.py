"""py-libp2p 0.8.1's Pubsub and GossipSub with what dgrpo changes in them (``shared/notes/libp2p.md``).

- :class:`DeliveringPubsub` hands every delivery, with the peer that forwarded it, to one callback instead of
  32-slot subscription buffers, and works around four faults of 0.8.1, each described where it is fixed:
  subscriptions from blacklisted peers, RPC writes interleaving on one stream, a malformed RPC killing the
  node, and a KeyError on blacklisting.
- :class:`ReceiptGossipSub` adds read receipts (an IHAVE of an unknown id, answered by an IWANT).

:mod:`dgrpo.net.gossip` builds its node from these two.
"""

from __future__ import annotations

import contextvars
import logging
import secrets
import weakref
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import trio
from google.protobuf.message import DecodeError
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.utils import safe_bytes_from_hex

logger = logging.getLogger("dgrpo.net.gossip")  # the node's logger: these are its warnings


# The forwarder of the message being pushed. Every push runs in its own task (or in the publisher's), and trio
# gives each task its own context, so concurrent pushes never see each other's value.
_FORWARDER: contextvars.ContextVar[ID | None] = contextvars.ContextVar("dgrpo_gossip_forwarder", default=None)


class DeliveringPubsub(Pubsub):
    """Pubsub that hands deliveries to ``deliver(message, forwarder)`` instead of 32-slot subscription buffers."""

    def __init__(self, *args: Any, deliver: Callable[[rpc_pb2.Message, ID | None], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deliver = deliver
        self._write_locks: weakref.WeakKeyDictionary[Any, trio.Lock] = weakref.WeakKeyDictionary()

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        token = _FORWARDER.set(msg_forwarder)
        try:
            await super().push_msg(msg_forwarder, msg)
        finally:
            _FORWARDER.reset(token)

    def notify_subscriptions(self, publish_message: rpc_pb2.Message) -> None:
        self._deliver(publish_message, _FORWARDER.get())

    def handle_subscription(self, origin_id: ID, sub_message: rpc_pb2.RPC.SubOpts) -> None:
        """Subscriptions from a blacklisted peer are ignored (as go-libp2p-pubsub ignores such a peer). py-libp2p
        0.8.1 takes them from a blacklisted peer that dials in again and then queues every message we publish
        for it (100 at a time, with a warning each), although it never registers it as a peer."""
        if self.is_peer_blacklisted(origin_id):
            return
        super().handle_subscription(origin_id, sub_message)

    async def write_msg(self, stream: Any, rpc_msg: rpc_pb2.RPC) -> bool:
        """One RPC at a time per stream. py-libp2p 0.8.1 writes to a peer's stream from its sending task and,
        when the peer connects, directly (``flush_pending_messages``, ``send_recent_messages``); yamux locks
        each 64 KiB frame, not the whole write, so two RPCs longer than the send window interleave and the
        peer reads garbage. A late joiner of a federation (128 KiB update chunks in the message cache) got
        exactly that and died of the DecodeError below, every time."""
        lock = self._write_locks.get(stream)
        if lock is None:
            lock = self._write_locks[stream] = trio.Lock()
        async with lock:
            ok: bool = await super().write_msg(stream, rpc_msg)
            return ok

    async def stream_handler(self, stream: Any) -> None:
        """py-libp2p 0.8.1 closes a peer's stream on a bad length prefix but lets a protobuf DecodeError escape,
        which takes down the connection's tasks and the node: one malformed RPC from any peer was fatal."""
        try:
            await super().stream_handler(stream)
        except DecodeError:
            peer_id = stream.muxed_conn.peer_id
            logger.warning("malformed pubsub RPC from %s: closing its stream", peer_id)
            with suppress(Exception):
                await stream.reset()
            self._handle_dead_peer(peer_id)

    async def _teardown_if_connected(self, peer_id: ID) -> None:
        """py-libp2p 0.8.1's version (run by ``add_to_blacklist``) resets the peer's stream and then does
        ``del self.peers[peer_id]``; when the connection closes during that reset (we disconnect a blacklisted
        peer at once), the dead-peer handler has already removed the entry, and the KeyError takes down the
        Pubsub service and with it the node (seen in a 4-daemon testnet, 1 run in 5)."""
        stream = self.peers.get(peer_id)
        if stream is not None:
            with suppress(Exception):  # a stream that is already gone needs no reset
                await stream.reset()
            if self.peers.get(peer_id) is stream:
                del self.peers[peer_id]
        self._forget_all_subscriptions(peer_id)


class ReceiptGossipSub(GossipSub):
    """GossipSub with read receipts. Gossipsub has no acknowledgement, but a peer reads our RPCs in order and
    answers an IHAVE of an unknown message id with an IWANT: that IWANT proves it has read all we sent before."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._receipts: dict[tuple[ID, bytes], trio.Event] = {}
        # RPCs py-libp2p dropped because a peer's outbound queue was full (a frozen or slow peer), per peer:
        # py-libp2p only records them in a debug log.
        self.dropped_to_peer: Counter[str] = Counter()

    def _handle_dropped_rpc(self, peer_id: ID, rpc: rpc_pb2.RPC, reason: str) -> None:
        if rpc.publish:
            self.dropped_to_peer[peer_id.to_base58()] += len(rpc.publish)
        super()._handle_dropped_rpc(peer_id, rpc, reason)

    async def read_receipt(self, peer: ID) -> None:
        token = b"\xff" + secrets.token_bytes(15)  # not ASCII, so py-libp2p does not try to parse it as hex
        event = self._receipts[(peer, token)] = trio.Event()
        try:
            await self.emit_ihave("dgrpo/read-receipt", [token], peer)
            await event.wait()
        finally:
            del self._receipts[(peer, token)]

    async def handle_iwant(self, iwant_msg: rpc_pb2.ControlIWant, sender_peer_id: ID) -> None:
        for wire_id in iwant_msg.messageIDs:
            event = self._receipts.get((sender_peer_id, safe_bytes_from_hex(wire_id) or b""))
            if event is not None:
                event.set()
        await super().handle_iwant(iwant_msg, sender_peer_id)
