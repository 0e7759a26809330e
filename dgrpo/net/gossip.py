"""Bytes-level publish/subscribe over py-libp2p 0.8.1 gossipsub (``/meshsub/1.2.0``, strict signing, yamux),
with the behaviours that lose messages silently worked around (``shared/notes/libp2p.md``):

- Deliveries go straight into one bounded trio channel per topic, with the forwarding peer; a full channel
  is counted (``dropped``) and never blocks the network. (py-libp2p's subscription holds 32 and drops.)
- ``publish`` refuses what py-libp2p would drop (RPCs over 1 MiB) and paces itself on the per-peer outbound
  queues (32 RPCs; the excess is dropped without error). The spam limit is raised from 10/s.
- Sequence numbers start at the wall clock in ns, as go-libp2p-pubsub's (``counter: uint64(time.Now()
  .UnixNano())``); py-libp2p starts at seconds, so a publisher restarted within seconds reuses
  ``(from, seqno)`` and its new messages are dropped as seen. The message id stays ``from || seqno``:
  py-libp2p's message cache (IHAVE/IWANT) always uses that id, so a content-hash id would make peers
  re-request every gossiped message, and the equivocation check keys on ``(from, seqno)`` regardless.
- Adaptive gossip is off: after a quiet minute it moves the heartbeat to 30-60 s.
- Closing flushes: py-libp2p has no flush, and a peer drops what it received but had not read yet when the
  connection closes. We wait for our queues to drain, then for a read receipt from every peer.
- Writes to a peer's stream are serialized per RPC (py-libp2p interleaves large ones when a peer connects),
  and a malformed RPC closes that peer's stream instead of killing the node.
- An inbound RPC over ``max_inbound_rpc_size`` (py-libp2p resets that peer's stream; it reconnects) is a counted
  rejection, reason ``oversize_rpc``, by peer (``rejections_by_peer``), logged (at most one line per peer per
  ``OVERSIZE_LOG_SECONDS``) and reported to the ``on_rejection`` hook (the transport's blacklisting). Our own
  publish refuses anything that large, so an honest peer never sends one.
- Request/response streams beside gossipsub (:mod:`dgrpo.net.streams`): ``serve_streams`` and ``open_stream``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, fields
from typing import Any

import libp2p
import multihash
import trio
from libp2p.custom_types import TProtocol
from libp2p.discovery.events.peerDiscovery import peerDiscovery
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, PROTOCOL_ID_V12
from libp2p.pubsub.pb import rpc_pb2
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from dgrpo.errors import DgrpoError
from dgrpo.net.discovery import Discovery
from dgrpo.net.gossip_config import LIBP2P_MAX_RPC_BYTES
from dgrpo.net.gossip_config import GossipConfig as GossipConfig  # re-exported: the node's settings
from dgrpo.net.host import noise_only as noise_only  # re-exported
from dgrpo.net.host import queue_idle, resource_manager, trim_router_state
from dgrpo.net.own_dialers import ROUTER_OPTIONS, disable_auto_connector
from dgrpo.net.pubsub import DeliveringPubsub, ReceiptGossipSub
from dgrpo.net.queue_watch import QueueWatch
from dgrpo.net.stream_watch import StreamWatch
from dgrpo.net.streams import Stream, StreamError, StreamHandler, serve
from dgrpo.net.traversal import Traversal
from dgrpo.net.traversal_config import TraversalConfig
from dgrpo.protocol.counting import PeerReasons

logger = logging.getLogger(__name__)

MAX_TOPIC_BYTES = 256
POLL_SECONDS = 0.002  # for waits py-libp2p signals no event for (queue lengths, peer counts)
OVERSIZE_RPC = "oversize_rpc"  # an inbound RPC over max_inbound_rpc_size, decided here, before any validator
TRANSPORT_REASONS = (OVERSIZE_RPC,)
OVERSIZE_LOG_SECONDS = 10.0  # a flooding peer gets one log line per this many seconds, with the count it sent

Validator = Callable[[bytes, str, str], bool]
"""``fn(data, source peer id, forwarding peer id) -> accept``. A function typed ``str | None`` for the
forwarder fits too; our own publishes never reach validators."""


class GossipError(DgrpoError):
    """Misuse of the gossip layer (bad topic or peer id, publish after close, ...)."""


class MessageTooLargeError(GossipError):
    """A payload over ``max_message_bytes``: py-libp2p would drop it without error."""


class GossipTimeoutError(GossipError):
    """A readiness wait (peers, mesh) ran out of time."""


@dataclass(frozen=True)
class GossipMessage:
    data: bytes
    source: str  # the author's peer id (the signed ``from`` field)
    forwarder: str | None  # the peer that handed it to us; None for our own publishes
    seqno: bytes
    received_at: float  # time.time() at delivery


@dataclass(frozen=True)
class GossipStatistics:
    published: int
    received: int
    dropped: int
    validator_rejected: int
    pacing_timeouts: int
    stuck_peers: int  # times publish stopped waiting for a peer whose queue did not move
    dropped_to_peers: int  # RPCs not sent because a peer's outbound queue was full
    refused_blacklisted: int  # pubsub streams a blacklisted peer opened again, reset unread
    bootstrap_attempts: int
    bootstrap_failures: int
    connected_peers: int
    oversize_rpc: int  # inbound RPCs over max_inbound_rpc_size (each reset that peer's stream)
    dead_streams: int  # connections closed because their pubsub stream died (dgrpo.net.stream_watch)
    publish_to: int = 0  # peers our own messages go to besides the mesh (seniors: publish_directly_to)
    yielded: int = 0  # forwarded messages dropped from a full outbound queue for ours or a senior's (in dropped)


def _check_topic(topic: str) -> None:
    if not topic or len(topic.encode()) > MAX_TOPIC_BYTES:
        raise GossipError(f"topic must be 1 to {MAX_TOPIC_BYTES} bytes, got {topic!r}")


def drained(send: trio.MemorySendChannel[Any]) -> bool:
    """Whether everything sent on a memory channel has been taken and handled: nothing buffered and the reader
    parked waiting for more. An empty buffer alone is not enough: trio hands an item straight to a waiting
    reader, which holds it unhandled until the scheduler runs it (and trio runs ready tasks in no fixed order)."""
    stats = send.statistics()
    return stats.current_buffer_used == 0 and stats.tasks_waiting_receive > 0


def _peer_id(peer_id: str) -> ID:
    try:
        peer = ID.from_base58(peer_id)
        multihash.decode(peer.to_bytes())  # from_base58 accepts any base58 text
        return peer
    except Exception as error:
        raise GossipError(f"not a peer id: {peer_id!r}") from error


class GossipNode:
    """A gossipsub peer. Create with ``async with GossipNode.open(config, key_pair) as node``."""

    def __init__(self, config: GossipConfig, host: Any, traversal: TraversalConfig | None = None) -> None:
        self.config = config
        self._host = host
        self.traversal_config = traversal or TraversalConfig()
        self.traversal = Traversal(host, self.traversal_config)
        self.peer_id: str = host.get_id().to_base58()
        router_options: dict[str, Any] = {  # a dict: py-libp2p annotates heartbeat_interval as int; it sleeps on it
            "protocols": [PROTOCOL_ID_V12, PROTOCOL_ID_V11],
            "degree": config.degree,
            "degree_low": config.degree_low,
            "degree_high": config.degree_high,
            "heartbeat_interval": config.heartbeat_interval,
            "adaptive_gossip_enabled": False,
            "max_messages_per_topic_per_second": config.max_messages_per_topic_per_second,
            **ROUTER_OPTIONS,  # no dials from a PRUNE's peer records (dgrpo.net.own_dialers)
        }
        self._router: Any = ReceiptGossipSub(**router_options)
        self._pubsub: Any = DeliveringPubsub(
            host,
            self._router,
            strict_signing=config.strict_signing,
            max_inbound_rpc_size=config.max_inbound_rpc_size,
            deliver=self._deliver,
            on_oversize=self._on_oversize,
        )
        self._pubsub.counter = time.time_ns()
        self._inboxes: dict[str, tuple[trio.MemorySendChannel[GossipMessage], bool]] = {}
        self._counts: Counter[str] = Counter()
        self.discovery = Discovery(host, config, self.traversal, self._counts, self.blacklisted)
        self.peering = self.discovery.peering
        self._rejected = PeerReasons(config.max_tracked_peers)  # rejections decided here, by peer and reason
        self._log_gate: dict[str, tuple[float, int]] = {}  # peer -> (time of its last log line, events since)
        self._on_rejection: Callable[[str, str], None] = lambda peer, reason: None
        self._closed = False
        # peer -> (queue length last seen, time it last moved or was short): a queue that stays long without
        # moving belongs to a frozen or stalled peer, and publish must not wait on it (one peer must never
        # set everyone's pace: a SIGSTOPped peer made every honest round wait pacing_timeout).
        self._queue_watch = QueueWatch(config.max_outbound_queue, config.stuck_after)
        self._stream_watch = StreamWatch(config.dead_stream_after)

    @classmethod
    @asynccontextmanager
    async def open(
        cls, config: GossipConfig, key_pair: Any, traversal: TraversalConfig | None = None
    ) -> AsyncIterator[GossipNode]:
        """Start host, Pubsub, GossipSub (in that order: a dial before pubsub runs fails), NAT traversal
        (:mod:`dgrpo.net.traversal`: AutoNAT, relay, hole punching), then keep the bootstrap peers dialled in
        the background. On a clean exit, flush (up to ``shutdown_flush_timeout``). Connections
        are closed explicitly: leaving the host's context only cancels its tasks, and a peer in the same process
        would never see the sockets close."""
        listen = [Multiaddr(config.listen)]
        tc = traversal or TraversalConfig()
        host = libp2p.new_host(
            key_pair=key_pair,
            listen_addrs=listen,
            muxer_preference="YAMUX",
            sec_opt=noise_only(key_pair),
            resource_manager=resource_manager(tc.max_peers, tc.max_per_ip),
            enable_mDNS=tc.mdns,
        )
        disable_auto_connector(host)  # whom to dial is the peering loop's decision (dgrpo.net.own_dialers)
        node = cls(config, host, tc)
        if tc.mdns:  # py-libp2p's mDNS only fills the peer store; the peering loop dials what it finds
            peerDiscovery.register_peer_discovered_handler(node.discovery.on_discovered)
        async with (
            host.run(listen_addrs=listen),
            background_trio_service(node._pubsub),
            background_trio_service(node._router),
        ):
            await node._pubsub.wait_until_ready()
            async with node.traversal.running(), trio.open_nursery() as nursery:
                for addr in config.bootstrap:
                    nursery.start_soon(node.discovery.keep_dialled, addr)
                nursery.start_soon(node._housekeeping)
                clean = False
                try:
                    yield node
                    clean = True
                finally:
                    node._closed = True
                    deadline = trio.current_time() + config.shutdown_flush_timeout + 5.0
                    with trio.CancelScope(deadline=deadline, shield=True):
                        if clean:  # after an error or a cancellation, py-libp2p's senders are gone
                            await node._flush(config.shutdown_flush_timeout)
                        await host.close()
                    for send, _ in node._inboxes.values():
                        send.close()
                    peerDiscovery.unregister_peer_discovered_handler(node.discovery.on_discovered)
                    nursery.cancel_scope.cancel()

    def listen_addrs(self) -> list[str]:
        """What we announce (:meth:`dgrpo.net.discovery.Discovery.listen_addrs`): circuits first."""
        return self.discovery.listen_addrs()

    def local_addrs(self) -> list[str]:
        """The addresses we listen on, with ``/p2p/<peer id>`` (no circuits; wildcards expanded)."""
        return self.discovery.local_addrs()

    async def dial(self, peer_id: str, addrs: Sequence[str]) -> str | None:
        """Connect to ``peer_id`` at ``addrs``: "direct", "relayed" or None (:meth:`Discovery.dial`)."""
        return await self.discovery.dial(peer_id, addrs)

    async def exchange_peers(self, known: Callable[[], Mapping[str, Sequence[str]]]) -> None:
        """Keep ``target_peers`` connections (:meth:`Discovery.exchange_peers`). Runs until cancelled."""
        await self.discovery.exchange_peers(known)

    def connected_peers(self) -> set[str]:
        """Peers with an open pubsub stream (connected and ready to gossip)."""
        return {peer.to_base58() for peer in self._pubsub.peers}

    def mesh_peers(self, topic: str) -> set[str]:
        return {peer.to_base58() for peer in self._router.mesh.get(topic, ()) if peer in self._pubsub.peers}

    def blacklisted(self) -> set[str]:
        return {peer.to_base58() for peer in self._pubsub.get_blacklisted_peers()}

    def statistics(self) -> GossipStatistics:
        counts = {f.name: self._counts[f.name] for f in fields(GossipStatistics)}
        counts["stuck_peers"] = self._queue_watch.stuck_count
        dropped = sum(self._router.dropped_to_peer.values())
        refused = sum(self._pubsub.refused_blacklisted.values())
        return GossipStatistics(
            **{
                **counts,
                "connected_peers": len(self._pubsub.peers),
                "dropped_to_peers": dropped,
                "refused_blacklisted": refused,
                "publish_to": len(self._router.publish_to),
                "yielded": self._router.yielded,
            }
        )

    def dropped_to_peer(self) -> dict[str, int]:
        """Messages py-libp2p dropped because the peer's outbound queue was full, per peer."""
        return dict(self._router.dropped_to_peer)

    def stuck_peers(self) -> set[str]:
        """Peers publish currently does not wait for (their queue has not moved for ``stuck_after`` s)."""
        return set(self._queue_watch.stuck)  # a copy: the status server reads it from its own thread

    def rejections_by_peer(self) -> dict[str, dict[str, int]]:
        """Rejections decided by the gossip layer itself (``TRANSPORT_REASONS``), by peer then reason (a copy)."""
        return self._rejected.snapshot()

    def rejections_of(self, peer: str) -> int:
        """How many rejections of ``peer`` the gossip layer has counted (0 once it is forgotten)."""
        return self._rejected.total(peer)

    def on_rejection(self, fn: Callable[[str, str], None]) -> None:
        """Call ``fn(peer, reason)`` after each rejection counted here (the transport's blacklisting policy)."""
        self._on_rejection = fn

    async def wait_for_peers(self, n: int, timeout: float) -> None:
        """Return once ``n`` peers have a pubsub stream; :class:`GossipTimeoutError` after ``timeout`` s."""
        await self._poll(lambda: len(self._pubsub.peers) >= n, timeout, f"{n} peers")

    async def wait_for_mesh(self, topic: str, n: int, timeout: float) -> None:
        """Return once ``n`` peers are in our mesh for ``topic``; :class:`GossipTimeoutError` otherwise."""
        await self._poll(lambda: len(self.mesh_peers(topic)) >= n, timeout, f"{n} mesh peers on {topic!r}")

    async def _poll(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        with trio.move_on_after(timeout):
            while not ready():
                await trio.sleep(POLL_SECONDS)
            return
        raise GossipTimeoutError(f"{self.peer_id}: no {what} after {timeout} s")

    async def subscribe(self, topic: str, *, include_own: bool = False) -> trio.MemoryReceiveChannel[GossipMessage]:
        """Join ``topic``. Messages arrive on the returned channel (closed with the node); our own publishes
        only with ``include_own``."""
        _check_topic(topic)
        if topic in self._inboxes:
            raise GossipError(f"already subscribed to {topic!r}")
        send, receive = trio.open_memory_channel[GossipMessage](self.config.inbound_queue)
        self._inboxes[topic] = (send, include_own)
        await self._pubsub.subscribe(topic)
        return receive

    def idle(self, topic: str) -> bool:
        """Whether every message delivered on ``topic`` so far has been taken by its reader (see :func:`drained`)."""
        entry = self._inboxes.get(topic)
        return entry is None or drained(entry[0])

    def set_validator(self, topic: str, fn: Validator) -> None:
        """Judge each message others send on ``topic`` before it is delivered or forwarded: a rejected one is
        neither. An exception in ``fn`` is a rejection (logged). py-libp2p caches the verdict per message id
        for 5 min, so it should depend on the message, not on the forwarder or the time."""
        _check_topic(topic)
        my_id = self._host.get_id()

        def validator(forwarder: ID, msg: rpc_pb2.Message) -> bool:
            if forwarder == my_id:
                return True  # our own publish
            source = ID(msg.from_id).to_base58()
            try:
                accepted = bool(fn(msg.data, source, forwarder.to_base58()))
            except Exception:
                logger.warning("validator for %r raised on a message from %s; rejected", topic, source, exc_info=True)
                accepted = False
            self._counts["validator_rejected"] += not accepted
            return accepted

        self._pubsub.set_topic_validator(topic, validator, False)

    async def publish(self, topic: str, data: bytes) -> None:
        """Sign and send ``data``, first waiting (up to ``pacing_timeout``) while a peer's outbound queue is longer
        than ``max_outbound_queue``: py-libp2p drops what does not fit in it."""
        _check_topic(topic)
        if self._closed:
            raise GossipError("publish on a closed GossipNode")
        if len(data) > self.config.max_message_bytes:
            raise MessageTooLargeError(
                f"message of {len(data)} bytes exceeds max_message_bytes={self.config.max_message_bytes} "
                f"(py-libp2p drops RPCs over {LIBP2P_MAX_RPC_BYTES} bytes without error)"
            )
        await self._pace()
        await self._pubsub.publish(topic, data)
        self._counts["published"] += 1

    def publish_directly_to(self, peer_ids: Iterable[str]) -> None:
        """Send our own messages to these peers (their connections permitting) besides the mesh."""
        self._router.publish_to = frozenset(_peer_id(p) for p in peer_ids)

    async def blacklist(self, peer_id: str) -> None:
        """Ignore everything ``peer_id`` sends or forwards from now on, and close our connection to it."""
        peer = _peer_id(peer_id)
        self._pubsub.add_to_blacklist(peer)
        # py-libp2p closes the pubsub stream but leaves the peer in the mesh with its outbound queue open.
        self._router.remove_peer(peer)
        queue = self._pubsub.peer_queues.pop(peer, None)
        if queue is not None:
            queue.close()
        await self._host.disconnect(peer)

    # ----------------------------------------------------------------- request/response streams
    def serve_streams(self, protocol: str, handler: StreamHandler) -> None:
        """Answer streams of ``protocol`` with ``handler`` (:func:`dgrpo.net.streams.serve`)."""
        serve(self._host, protocol, handler)

    async def open_stream(self, peer_id: str, protocol: str, addrs: Sequence[str] = ()) -> Stream:
        """A new stream of ``protocol`` to ``peer_id``, dialling it first at ``addrs`` (multiaddrs ending in
        ``/p2p/<peer_id>``; others are ignored) when we are not connected. :class:`StreamError` on failure."""
        try:
            peer = _peer_id(peer_id)
            # Dialled as peer exchange dials (circuits first: a peer that announces one says it is not publicly
            # reachable, and its direct addresses are private ones a dial would wait out).
            if peer not in self._host.get_connected_peers() and addrs and await self.dial(peer_id, addrs) is None:
                raise GossipError(f"no address of {peer_id} answered")
            raw = await self._host.new_stream(peer, [TProtocol(protocol)])
        except Exception as error:  # unreachable, protocol not supported, a dial timeout, a bad peer id
            raise StreamError(f"cannot open {protocol} to {peer_id}: {type(error).__name__}: {error}") from error
        return Stream(raw, peer_id)

    def _deliver(self, msg: rpc_pb2.Message, forwarder: ID | None) -> None:
        via = None if forwarder is None or forwarder == self._host.get_id() else forwarder.to_base58()
        message = GossipMessage(msg.data, ID(msg.from_id).to_base58(), via, msg.seqno, time.time())
        for topic in msg.topicIDs:
            send, include_own = self._inboxes.get(topic, (None, False))
            if send is None or (via is None and not include_own):
                continue
            try:
                send.send_nowait(message)
                self._counts["received"] += 1
            except trio.WouldBlock:
                self._counts["dropped"] += 1
            except trio.ClosedResourceError:
                pass

    def _on_oversize(self, peer_id: ID, size: int) -> None:
        """py-libp2p has reset the peer's stream without reading the RPC (it reconnects; what it had in flight is
        lost). Count it, log it (rate-limited per peer), report it. Runs in py-libp2p's read task: never raises."""
        peer = peer_id.to_base58()
        self._counts[OVERSIZE_RPC] += 1
        self._rejected.add(peer, OVERSIZE_RPC)
        if len(self._log_gate) >= self._rejected.cap:  # only at the cap can a peer have been forgotten
            for gone in [p for p in self._log_gate if p not in self._rejected]:
                del self._log_gate[gone]
        self._log_oversize(peer, size)
        try:
            self._on_rejection(peer, OVERSIZE_RPC)
        except Exception:  # a bug in the hook must not end the peer's read task (and with it the node)
            logger.exception("rejection hook failed for %s", peer)

    def _log_oversize(self, peer: str, size: int) -> None:
        now = time.monotonic()
        last, since = self._log_gate.get(peer, (-OVERSIZE_LOG_SECONDS, 0))
        if now - last < OVERSIZE_LOG_SECONDS:
            self._log_gate[peer] = (last, since + 1)
            return
        self._log_gate[peer] = (now, 0)
        more = f" (and {since} more since the last line)" if since else ""
        logger.warning(
            "rejected an inbound RPC of %d bytes from %s (%s: max_inbound_rpc_size is %d); its stream was reset%s",
            size,
            peer,
            OVERSIZE_RPC,
            self.config.max_inbound_rpc_size,
            more,
        )

    def _live_queues(self) -> list[Any]:
        """Outbound queues of current peers (py-libp2p can leave those of departed peers behind)."""
        return [queue for peer, queue in self._pubsub.peer_queues.items() if peer in self._pubsub.peers]

    async def _pace(self) -> None:
        """Wait while a peer's outbound queue is longer than ``max_outbound_queue``, except for peers whose queue
        has not moved for ``stuck_after`` s: for those, py-libp2p drops what does not fit (counted per peer in
        :meth:`dropped_to_peer`), and they catch up on the round from heartbeats when they move again."""

        def backlog() -> bool:
            return any(length > self.config.max_outbound_queue for length in self._watch_queues().values())

        with trio.move_on_after(self.config.pacing_timeout):
            while backlog():
                await trio.sleep(POLL_SECONDS)
            return
        self._counts["pacing_timeouts"] += 1
        logger.warning("a peer's outbound queue stayed full for %s s; publishing anyway", self.config.pacing_timeout)

    def _watch_queues(self) -> dict[str, int]:
        """The lengths of the live queues publish waits for, updating which peers are stuck."""
        live = {
            peer.to_base58(): len(queue)
            for peer, queue in self._pubsub.peer_queues.items()
            if peer in self._pubsub.peers
        }
        return self._queue_watch.update(live, time.monotonic())

    async def _flush(self, timeout: float) -> None:
        """Wait until our outbound queues are empty, then until every peer has read what we sent."""
        if timeout <= 0:  # a node that published nothing (a joiner's throwaway host) has nothing to flush
            return
        with trio.move_on_after(timeout):
            while not all(queue_idle(queue) for queue in self._live_queues()):
                await trio.sleep(POLL_SECONDS)
            async with trio.open_nursery() as nursery:
                for peer in list(self._pubsub.peers):
                    nursery.start_soon(self._router.read_receipt, peer)
            return
        logger.warning("closing unflushed after %s s (%d RPCs queued)", timeout, sum(map(len, self._live_queues())))

    async def _housekeeping(self) -> None:
        while True:
            await trio.sleep(self.config.heartbeat_interval)
            trim_router_state(self._router, self.config.equivocation_cache)
            await self._close_dead_streams()

    async def _close_dead_streams(self) -> None:
        """Close the connections whose pubsub stream died (:mod:`dgrpo.net.stream_watch`), to be dialled again."""
        connected = {peer.to_base58(): peer for peer in self._host.get_connected_peers()}
        for name in self._stream_watch.update(set(connected), self.connected_peers(), time.monotonic()):
            self._counts["dead_streams"] += 1
            logger.warning(
                "%s: connected without a pubsub stream for %s s; closing the connection to dial it again",
                name, self.config.dead_stream_after,
            )  # fmt: skip
            with suppress(Exception):
                await self._host.disconnect(connected[name])
