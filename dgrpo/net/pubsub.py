"""py-libp2p 0.8.1's Pubsub and GossipSub with what dgrpo changes in them (``shared/notes/libp2p.md``).

- :class:`DeliveringPubsub` hands every delivery, with the peer that forwarded it, to one callback instead of
  32-slot subscription buffers, and works around four faults of 0.8.1, each described where it is fixed:
  subscriptions from blacklisted peers, RPC writes interleaving on one stream, a malformed RPC killing the
  node, and a KeyError on blacklisting. It also reports each inbound RPC over ``max_inbound_rpc_size`` (which
  py-libp2p only logs) to ``on_oversize(peer, claimed size)``.
- :class:`ReceiptGossipSub` adds read receipts (an IHAVE of an unknown id, answered by an IWANT), sends our own
  messages to our seniors besides the mesh, and keeps room for ours and theirs in a full outbound queue.

:mod:`dgrpo.net.gossip` builds its node from these two.
"""

from __future__ import annotations

import contextvars
import logging
import secrets
import types
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from typing import Any

import libp2p.pubsub.pubsub as libp2p_pubsub
import trio
from google.protobuf.message import DecodeError
from libp2p.io.abc import Reader
from libp2p.io.exceptions import MessageTooLarge
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.utils import safe_bytes_from_hex
from libp2p.utils.varint import decode_uvarint, read_varint_prefixed_bytes_limited

from dgrpo.net.sender_records import consume_once, install

logger = logging.getLogger("dgrpo.net.gossip")  # the node's logger: these are its warnings
RECEIPT_TOPIC = "dgrpo/read-receipt"  # named in read receipts, never subscribed to (docs/protocol.md)


# The forwarder of the message being pushed. Every push runs in its own task (or in the publisher's), and trio
# gives each task its own context, so concurrent pushes never see each other's value.
_FORWARDER: contextvars.ContextVar[ID | None] = contextvars.ContextVar("dgrpo_gossip_forwarder", default=None)

# The claimed sizes of oversize RPCs seen by the read loop running in this task (one task per peer stream).
_OVERSIZE: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("dgrpo_gossip_oversize", default=None)
_VARINT_MAX_BYTES = 10  # a 64-bit varint


class _PrefixTap(Reader):
    """A reader that keeps the first bytes read through it: the RPC's varint length prefix."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.head = b""

    async def read(self, n: int | None = None) -> bytes:
        data: bytes = await self.reader.read(n)
        if len(self.head) < _VARINT_MAX_BYTES:
            self.head += data[: _VARINT_MAX_BYTES - len(self.head)]
        return data


async def _read_rpc_noting_oversize(reader: Any, max_length: int) -> bytes:
    """py-libp2p's RPC read, which raises MessageTooLarge from the length prefix alone (the body is never
    read, so a 10 MiB claim costs nothing); the claimed size is noted for the read loop's caller."""
    tap = _PrefixTap(reader)
    try:
        return await read_varint_prefixed_bytes_limited(tap, max_length)
    except MessageTooLarge:
        noted = _OVERSIZE.get()
        if noted is not None:
            noted.append(decode_uvarint(tap.head))
        raise


# py-libp2p 0.8.1's read loop (``Pubsub.continuously_read_stream``) with one name rebound: its RPC read. The loop
# catches MessageTooLarge itself (logs, resets the stream, drops the peer) and exposes no hook, and it is 90
# lines: rebinding the one call keeps every other line of it py-libp2p's. tests/test_gossip.py checks that the
# loop still calls that name, so an upgrade that renames it fails a test instead of silently counting nothing.
install()  # gossipsub's handle_rpc checks each RPC's sender record once more
_READ_LOOP = types.FunctionType(
    Pubsub.continuously_read_stream.__code__,
    {
        **vars(libp2p_pubsub),
        "read_varint_prefixed_bytes_limited": _read_rpc_noting_oversize,
        "maybe_consume_signed_record": consume_once,  # dgrpo.net.sender_records
    },
    "continuously_read_stream",
    Pubsub.continuously_read_stream.__defaults__,
    Pubsub.continuously_read_stream.__closure__,
)


class DeliveringPubsub(Pubsub):
    """Pubsub that hands deliveries to ``deliver(message, forwarder)`` instead of 32-slot subscription buffers."""

    def __init__(
        self,
        *args: Any,
        deliver: Callable[[rpc_pb2.Message, ID | None], None],
        on_oversize: Callable[[ID, int], None] = lambda peer, size: None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._deliver = deliver
        self._on_oversize = on_oversize
        self._write_locks: weakref.WeakKeyDictionary[Any, trio.Lock] = weakref.WeakKeyDictionary()
        self.refused_blacklisted: Counter[str] = Counter()  # pubsub streams a blacklisted peer opened, refused

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

    async def continuously_read_stream(self, stream: Any) -> None:
        """py-libp2p's loop, unchanged (see ``_READ_LOOP``), except that an RPC over ``max_inbound_rpc_size``,
        after py-libp2p has reset the stream and dropped the peer as before, is reported to ``on_oversize``."""
        noted: list[int] = []
        token = _OVERSIZE.set(noted)
        try:
            await _READ_LOOP(self, stream)
        finally:
            _OVERSIZE.reset(token)
        for size in noted:  # at most one: the loop ends at the first
            self._on_oversize(stream.muxed_conn.peer_id, size)

    async def stream_handler(self, stream: Any) -> None:
        """py-libp2p 0.8.1 closes a peer's stream on a bad length prefix but lets a protobuf DecodeError escape,
        which takes down the connection's tasks and the node: one malformed RPC from any peer was fatal.

        A blacklisted peer that dials in again gets no reader: its stream is reset and its connection closed.
        py-libp2p would read and decode every RPC it sends, only to drop the messages one by one; a blacklisted
        flooder redialling every second kept honest rounds 2.8x slower (``benchmarks/reliability_faults.py``)."""
        peer_id = stream.muxed_conn.peer_id
        if self.is_peer_blacklisted(peer_id):
            self.refused_blacklisted[peer_id.to_base58()] += 1
            with suppress(Exception):
                await stream.reset()
            with suppress(Exception):
                await self.host.disconnect(peer_id)
            return
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
    answers an IHAVE of an unknown message id (for a topic it joined, in go and js; for any, in py-libp2p) with
    an IWANT: that IWANT proves it has read all we sent before."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._receipts: dict[tuple[ID, bytes], trio.Event] = {}
        # RPCs py-libp2p dropped because a peer's outbound queue was full (a frozen or slow peer), per peer:
        # py-libp2p only records them in a debug log.
        self.dropped_to_peer: Counter[str] = Counter()
        # Peers our own messages always go to, besides the mesh (gossipsub v1.1's flood publishing, which
        # py-libp2p lacks, limited to the peers the node trusts: :meth:`GossipNode.publish_directly_to`).
        self.publish_to: frozenset[ID] = frozenset()
        self._protected: frozenset[bytes] = frozenset()
        self._protected_for: frozenset[ID] | None = None
        self.yielded = 0  # forwarded messages dropped from a full queue to make room for ours or a senior's

    def _get_peers_to_send(
        self, topic_ids: Iterable[str], msg_forwarder: ID, origin: ID, msg_id: bytes | None = None
    ) -> Iterator[ID]:
        """The mesh's peers, and for a message of our own also every peer in ``publish_to`` that joined its
        topic: a mesh made of Sybils (young identities, slow or silent on purpose) cannot then keep our
        rollouts and heartbeats from the peers that did verified work with us. Seen: 50 Sybils beside 3 honest
        daemons, the node they bootstrapped to heard neither honest peer after round 27 and they declared it
        departed (both honest peers in 0 of 20 rounds; 20 of 20 with this, ``benchmarks/sybil.py``)."""
        topic_ids = list(topic_ids)
        peers = set(super()._get_peers_to_send(topic_ids, msg_forwarder, origin, msg_id))
        if self.publish_to and self.pubsub is not None and origin == self.pubsub.my_id:
            for topic in topic_ids:
                joined = self.pubsub.peer_topics.get(topic, ())
                peers.update(p for p in self.publish_to if p in joined and p != msg_forwarder)
        yield from peers

    def _handle_dropped_rpc(self, peer_id: ID, rpc: rpc_pb2.RPC, reason: str) -> None:
        if rpc.publish:
            self.dropped_to_peer[peer_id.to_base58()] += len(rpc.publish)
        super()._handle_dropped_rpc(peer_id, rpc, reason)

    def _protected_origins(self) -> frozenset[bytes]:
        """Our own id and ``publish_to``'s (the seniors): whose messages keep their place in a full queue."""
        if self._protected_for is not self.publish_to:
            me = (self.pubsub.my_id.to_bytes(),) if self.pubsub is not None else ()
            self._protected = frozenset((*me, *(p.to_bytes() for p in self.publish_to)))
            self._protected_for = self.publish_to
        return self._protected

    def send_rpc(self, peer_id: ID, rpc: rpc_pb2.RPC, priority: bool = False) -> None:
        """py-libp2p's per-peer outbound queue holds 32 RPCs and refuses what comes when it is full, whoever
        wrote it. Young identities are free: 50 Sybils publishing their rollouts for the coming rounds at once
        filled every honest node's queues to its honest peers with forwarded junk, and the honest nodes' own
        rollouts, refused there, missed their peers' rounds (both honest peers in 19-21 of 30 rounds; 29-30 with
        this: ``benchmarks/sybil.py --fast``). Messages of our own and of our seniors (:attr:`publish_to`) now go
        ahead of forwarded ones (the queue's priority tier, which py-libp2p uses for control messages), and
        where the queue is full they take the place of the newest forwarded message of anyone else, which is
        dropped instead (counted in :attr:`dropped_to_peer`)."""
        if rpc.publish and self.pubsub is not None:
            protected = self._protected_origins()
            if any(m.from_id in protected for m in rpc.publish):
                queue = self.pubsub.peer_queues.get(peer_id)
                if queue is not None:
                    self._make_room(peer_id, queue, protected)
                priority = True
        super().send_rpc(peer_id, rpc, priority)

    def _make_room(self, peer_id: ID, queue: Any, protected: frozenset[bytes]) -> None:
        """Drop the newest queued RPC that carries only others' forwarded messages, if the queue is full."""
        tiers = getattr(queue, "_queue", None)
        waiting = getattr(tiers, "_non_priority", None)
        if tiers is None or waiting is None or len(queue) < tiers.max_size:
            return
        for i in range(len(waiting) - 1, -1, -1):
            queued = waiting[i]
            if queued.publish and not any(m.from_id in protected for m in queued.publish):
                del waiting[i]
                self.dropped_to_peer[peer_id.to_base58()] += len(queued.publish)
                self.yielded += len(queued.publish)
                return

    def receipt_topics(self, peer: ID) -> list[str]:
        """The topics a read-receipt IHAVE names: ``RECEIPT_TOPIC``, which py-libp2p answers (it answers an IHAVE
        for any topic), and the first (sorted) topic ``peer`` announced it subscribes to. go-libp2p-pubsub and
        js-libp2p's gossipsub ignore an IHAVE for a topic they have not joined, so without the second a peer
        running them would never answer, and every shutdown would wait ``shutdown_flush_timeout`` for it."""
        subscribed = getattr(self.pubsub, "peer_topics", {})
        joined = sorted(topic for topic, peers in subscribed.items() if peer in peers)
        return [RECEIPT_TOPIC, *joined[:1]]

    async def read_receipt(self, peer: ID) -> None:
        """Wait until ``peer`` has read every RPC we sent it before; the caller bounds the wait (a peer that
        never answers only delays our shutdown by that bound)."""
        token = b"\xff" + secrets.token_bytes(15)  # not ASCII, so py-libp2p does not try to parse it as hex
        event = self._receipts[(peer, token)] = trio.Event()
        try:
            control = rpc_pb2.ControlMessage()
            for topic in self.receipt_topics(peer):  # one token: the first IWANT for it is the receipt
                control.ihave.append(rpc_pb2.ControlIHave(topicID=topic, messageIDs=[token]))
            await self.emit_control_message(control, peer)
            await event.wait()
        finally:
            del self._receipts[(peer, token)]

    async def handle_iwant(self, iwant_msg: rpc_pb2.ControlIWant, sender_peer_id: ID) -> None:
        for wire_id in iwant_msg.messageIDs:
            event = self._receipts.get((sender_peer_id, safe_bytes_from_hex(wire_id) or b""))
            if event is not None:
                event.set()
        await super().handle_iwant(iwant_msg, sender_peer_id)
