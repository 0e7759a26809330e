"""Bytes-level publish/subscribe over py-libp2p gossipsub (``/meshsub/1.2.0``, strict signing, yamux), with
the defaults of py-libp2p 0.8.1 that lose messages silently replaced (see ``shared/notes/libp2p.md``).

What this layer adds to bare py-libp2p, and why:

- Deliveries go straight from gossipsub into one bounded trio channel per topic, with the peer that
  forwarded each message; a full channel is counted (``dropped``), never silent, and never blocks the
  network. (py-libp2p's own subscription buffers 32 messages, drops the rest, and does not say who
  forwarded a message.)
- ``publish`` refuses payloads py-libp2p would drop (RPCs over 1 MiB), and paces itself on the per-peer
  outbound queues (32 RPCs each, excess dropped without error).
- Sequence numbers start at the wall clock in nanoseconds, as go-libp2p-pubsub does (``pubsub.go``:
  ``counter: uint64(time.Now().UnixNano())``). py-libp2p starts at seconds, so a publisher restarted
  within seconds reuses ``(from, seqno)`` pairs and its fresh messages are dropped as seen or as
  equivocation. The message id stays go's default ``from || seqno``: py-libp2p's message cache (IHAVE /
  IWANT) always uses that id, so a content-hash id would make peers re-request every gossiped message,
  and the equivocation check keys on ``(from, seqno)`` whatever the id is.
- The router's adaptive mode is off: after a quiet minute it judges the network unhealthy and moves the
  heartbeat to 30-60 s. Its unpruned per-message bookkeeping is trimmed on our own tick.
- Bootstrap peers are dialled in the background with exponential backoff and re-dialled when dropped;
  closing waits (bounded) for the outbound queues to drain, since py-libp2p has no flush.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from typing import Annotated, Any, Self

import libp2p
import multihash
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dgrpo.errors import DgrpoError

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
LIBP2P_MAX_RPC_BYTES = MIB  # py-libp2p's per-RPC limit; outbound RPCs above it are dropped silently
RPC_OVERHEAD_BYTES = 8 * 1024  # room for from/seqno/topic/signature/key and the signed peer record
MAX_TOPIC_BYTES = 256

Validator = Callable[[bytes, str, str], bool]
"""``fn(data, source peer id, forwarding peer id) -> accept``; a function typed with ``str | None`` for the
forwarder fits too (our own publishes never reach validators)."""


class GossipError(DgrpoError):
    """Misuse of the gossip layer (bad topic or peer id, publish after close, ...)."""


class MessageTooLargeError(GossipError):
    """A payload larger than ``max_message_bytes``; py-libp2p would drop it without error."""


class GossipTimeoutError(GossipError):
    """A readiness wait (peers, mesh) ran out of time."""


class GossipConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    listen: Annotated[str, Field(description="listen multiaddr; tcp/0 picks a free port")] = "/ip4/127.0.0.1/tcp/0"
    bootstrap: Annotated[
        tuple[str, ...], Field(description="peers to dial and keep dialled, as multiaddrs ending in /p2p/<id>")
    ] = ()
    heartbeat_interval: Annotated[
        float, Field(gt=0.0, description="gossipsub heartbeat in s (py-libp2p's 120 s forms meshes very slowly)")
    ] = 1.0
    degree: Annotated[int, Field(ge=1, description="target mesh degree D")] = 6
    degree_low: Annotated[int, Field(ge=1, description="mesh degree below which peers are grafted (D_lo)")] = 4
    degree_high: Annotated[int, Field(ge=1, description="mesh degree above which peers are pruned (D_hi)")] = 12
    # py-libp2p's default of 10 messages/s per (forwarding peer, topic) also counts our own publishes and
    # drops the excess without error: a node sending one message per rollout group, or a relay forwarding
    # several authors' rollouts through one peer, exceeds it within a round. 1000/s still stops a flood.
    max_messages_per_topic_per_second: Annotated[
        float, Field(gt=0.0, description="spam limit per (forwarding peer, topic); excess is not forwarded")
    ] = 1000.0
    max_message_bytes: Annotated[
        int,
        Field(ge=1, description="largest payload publish accepts; py-libp2p silently drops RPCs over 1 MiB"),
    ] = LIBP2P_MAX_RPC_BYTES - RPC_OVERHEAD_BYTES
    max_inbound_rpc_size: Annotated[
        int, Field(ge=1, description="largest inbound RPC; a bigger one resets the peer's stream")
    ] = LIBP2P_MAX_RPC_BYTES + 64 * 1024
    max_outbound_queue: Annotated[
        int, Field(ge=1, le=31, description="publish waits while a peer's outbound queue (32 RPCs) is longer")
    ] = 8
    pacing_poll: Annotated[float, Field(gt=0.0, description="s between queue checks while pacing")] = 0.002
    pacing_timeout: Annotated[
        float, Field(gt=0.0, description="s publish waits for a slow peer before sending anyway (counted)")
    ] = 10.0
    inbound_queue: Annotated[
        int, Field(ge=1, description="messages buffered per subscribed topic; more are dropped and counted")
    ] = 4096
    bootstrap_backoff_initial: Annotated[float, Field(gt=0.0, description="s before the first redial")] = 0.5
    bootstrap_backoff_max: Annotated[float, Field(gt=0.0, description="cap on the redial backoff, in s")] = 30.0
    dial_timeout: Annotated[float, Field(gt=0.0, description="s one bootstrap dial may take")] = 10.0
    strict_signing: Annotated[bool, Field(description="sign our messages, drop unsigned or forged ones")] = True
    equivocation_cache: Annotated[
        int, Field(ge=1, description="messages gossipsub keeps for equivocation checks (it keeps whole messages)")
    ] = 256
    shutdown_flush_timeout: Annotated[float, Field(ge=0.0, description="s close waits for queues to drain")] = 5.0

    @field_validator("listen")
    @classmethod
    def _parse_listen(cls, value: str) -> str:
        Multiaddr(value)
        return value

    @field_validator("bootstrap")
    @classmethod
    def _parse_bootstrap(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for addr in value:
            try:
                info_from_p2p_addr(Multiaddr(addr))
            except Exception as error:
                raise ValueError(f"bootstrap address {addr!r} is not a multiaddr ending in /p2p/<id>") from error
        return value

    @model_validator(mode="after")
    def _check_bounds(self) -> Self:
        if not self.degree_low <= self.degree <= self.degree_high:
            raise ValueError("need degree_low <= degree <= degree_high")
        if self.max_message_bytes > LIBP2P_MAX_RPC_BYTES - RPC_OVERHEAD_BYTES:
            raise ValueError(f"max_message_bytes must be <= {LIBP2P_MAX_RPC_BYTES - RPC_OVERHEAD_BYTES}")
        if self.max_inbound_rpc_size < self.max_message_bytes + RPC_OVERHEAD_BYTES:
            raise ValueError("max_inbound_rpc_size must be >= max_message_bytes + RPC_OVERHEAD_BYTES")
        if self.bootstrap_backoff_initial > self.bootstrap_backoff_max:
            raise ValueError("need bootstrap_backoff_initial <= bootstrap_backoff_max")
        return self


@dataclass(frozen=True)
class GossipMessage:
    data: bytes
    source: str
    """Peer id of the author (the signed ``from`` field)."""
    forwarder: str | None
    """Peer that handed the message to us; None for our own publishes."""
    seqno: bytes
    received_at: float
    """Wall clock (``time.time()``) at delivery."""


@dataclass(frozen=True)
class GossipStatistics:
    published: int
    received: int
    dropped: int
    validator_rejected: int
    pacing_timeouts: int
    bootstrap_attempts: int
    bootstrap_failures: int
    connected_peers: int


@dataclass
class _Counters:
    published: int = 0
    received: int = 0
    dropped: int = 0
    validator_rejected: int = 0
    pacing_timeouts: int = 0
    bootstrap_attempts: int = 0
    bootstrap_failures: int = 0


# The peer that forwarded the message being pushed; each push runs in its own task (or the publisher's), and
# trio gives every task its own context, so concurrent pushes do not see each other's value.
_FORWARDER: contextvars.ContextVar[ID | None] = contextvars.ContextVar("dgrpo_gossip_forwarder", default=None)


class _Pubsub(Pubsub):
    """Pubsub whose deliveries go to ``deliver(message, forwarder)`` instead of 32-slot subscription buffers."""

    def __init__(self, *args: Any, deliver: Callable[[rpc_pb2.Message, ID | None], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deliver = deliver

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        token = _FORWARDER.set(msg_forwarder)
        try:
            await super().push_msg(msg_forwarder, msg)
        finally:
            _FORWARDER.reset(token)

    def notify_subscriptions(self, publish_message: rpc_pb2.Message) -> None:
        self._deliver(publish_message, _FORWARDER.get())


def _check_topic(topic: str) -> None:
    if not topic or len(topic.encode()) > MAX_TOPIC_BYTES:
        raise GossipError(f"topic must be 1 to {MAX_TOPIC_BYTES} bytes, got {topic!r}")


def _peer_id(peer_id: str) -> ID:
    try:
        peer = ID.from_base58(peer_id)
        multihash.decode(peer.to_bytes())  # from_base58 accepts any base58 text
        return peer
    except Exception as error:
        raise GossipError(f"not a peer id: {peer_id!r}") from error


def _queue_idle(queue: Any) -> bool:
    """True when an outbound queue is empty and its sender waits for more (so its last write finished)."""
    notify = getattr(queue, "_notify", None)
    waiting = notify is None or notify.statistics().tasks_waiting > 0
    return len(queue) == 0 and waiting


def _trim_router_state(router: Any, keep: int) -> None:
    """Bound gossipsub bookkeeping that grows with every message (py-libp2p 0.8.1)."""
    seen = router.equivocation_detection  # dict in insertion order; holds whole messages
    for key in list(seen)[: max(0, len(seen) - keep)]:
        del seen[key]
    router.recent_message_deliveries.clear()  # read only by the adaptive mode, which is off
    router.recent_peer_connections.clear()
    router.recent_peer_disconnections.clear()


class GossipNode:
    """A gossipsub peer. Create with ``async with GossipNode.open(config, key_pair) as node``."""

    def __init__(self, config: GossipConfig, host: Any) -> None:
        self.config = config
        self._host = host
        self.peer_id: str = host.get_id().to_base58()
        router_options: dict[str, Any] = {
            "protocols": [PROTOCOL_ID_V12, PROTOCOL_ID_V11],
            "degree": config.degree,
            "degree_low": config.degree_low,
            "degree_high": config.degree_high,
            "heartbeat_interval": config.heartbeat_interval,  # annotated int in py-libp2p; it is slept on
            "adaptive_gossip_enabled": False,
            "max_messages_per_topic_per_second": config.max_messages_per_topic_per_second,
        }
        self._router: Any = GossipSub(**router_options)
        self._pubsub: Any = _Pubsub(
            host,
            self._router,
            strict_signing=config.strict_signing,
            max_inbound_rpc_size=config.max_inbound_rpc_size,
            deliver=self._deliver,
        )
        pass  # TEMP
        self._inboxes: dict[str, tuple[trio.MemorySendChannel[GossipMessage], bool]] = {}
        self._counters = _Counters()
        self._closed = False

    @classmethod
    @asynccontextmanager
    async def open(cls, config: GossipConfig, key_pair: Any) -> AsyncIterator[GossipNode]:
        """Start host, Pubsub and GossipSub (in that order: dialling before pubsub runs fails), then keep the
        bootstrap peers dialled in the background. On a clean exit, first wait up to ``shutdown_flush_timeout``
        for the outbound queues to drain. Connections are then closed explicitly: leaving the host's context
        only cancels its tasks, and peers in the same process would never see the sockets close."""
        listen = [Multiaddr(config.listen)]
        host = libp2p.new_host(key_pair=key_pair, listen_addrs=listen, muxer_preference="YAMUX")
        node = cls(config, host)
        async with (
            host.run(listen_addrs=listen),
            background_trio_service(node._pubsub),
            background_trio_service(node._router),
        ):
            await node._pubsub.wait_until_ready()
            async with trio.open_nursery() as nursery:
                for addr in config.bootstrap:
                    nursery.start_soon(node._keep_dialled, addr)
                nursery.start_soon(node._housekeeping)
                clean = False
                try:
                    yield node
                    clean = True
                finally:
                    node._closed = True
                    with trio.move_on_after(config.shutdown_flush_timeout + 5.0, shield=True):
                        if clean:  # after an error or a cancellation the senders are gone: nothing to wait for
                            await node._flush(config.shutdown_flush_timeout)
                        await host.close()
                    for send, _ in node._inboxes.values():
                        send.close()
                    nursery.cancel_scope.cancel()

    # --- observable state ---

    def listen_addrs(self) -> list[str]:
        """Full multiaddrs, with the bound port and ``/p2p/<peer id>``."""
        return [str(addr) for addr in self._host.get_addrs()]

    def connected_peers(self) -> set[str]:
        """Peers with an open pubsub stream (connected and ready to gossip)."""
        return {peer.to_base58() for peer in self._pubsub.peers}

    def mesh_peers(self, topic: str) -> set[str]:
        return {peer.to_base58() for peer in self._router.mesh.get(topic, ()) if peer in self._pubsub.peers}

    def blacklisted(self) -> set[str]:
        return {peer.to_base58() for peer in self._pubsub.get_blacklisted_peers()}

    def statistics(self) -> GossipStatistics:
        counts = {f.name: getattr(self._counters, f.name) for f in fields(_Counters)}
        return GossipStatistics(**counts, connected_peers=len(self._pubsub.peers))

    async def wait_for_peers(self, n: int, timeout: float) -> None:
        """Return once at least ``n`` peers have a pubsub stream; :class:`GossipTimeoutError` otherwise."""
        await self._poll(lambda: len(self._pubsub.peers) >= n, timeout, f"{n} peers")

    async def wait_for_mesh(self, topic: str, n: int, timeout: float) -> None:
        """Return once at least ``n`` peers are in our mesh for ``topic``."""
        await self._poll(lambda: len(self.mesh_peers(topic)) >= n, timeout, f"{n} mesh peers on {topic!r}")

    async def _poll(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        with trio.move_on_after(timeout):
            while not ready():
                await trio.sleep(0.01)  # py-libp2p has no event for "n peers"; polling is cheap
            return
        raise GossipTimeoutError(f"{self.peer_id}: no {what} after {timeout} s")

    # --- pub/sub ---

    async def subscribe(self, topic: str, *, include_own: bool = False) -> trio.MemoryReceiveChannel[GossipMessage]:
        """Join ``topic``; messages arrive on the returned channel (closed when the node closes). Our own
        publishes are left out unless ``include_own``."""
        _check_topic(topic)
        if topic in self._inboxes:
            raise GossipError(f"already subscribed to {topic!r}")
        send, receive = trio.open_memory_channel[GossipMessage](self.config.inbound_queue)
        self._inboxes[topic] = (send, include_own)
        await self._pubsub.subscribe(topic)
        return receive

    def set_validator(self, topic: str, fn: Validator) -> None:
        """Judge every message others send on ``topic`` before it is delivered or forwarded; a rejected one
        is neither. An exception in ``fn`` counts as a rejection. py-libp2p caches the verdict per message id
        for 5 minutes, so ``fn`` should depend on the message, not on when or by whom it was forwarded."""
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
            if not accepted:
                self._counters.validator_rejected += 1
            return accepted

        self._pubsub.set_topic_validator(topic, validator, False)

    async def publish(self, topic: str, data: bytes) -> None:
        """Sign and send ``data``. Waits (up to ``pacing_timeout``) while a peer's outbound queue is longer than
        ``max_outbound_queue``, because py-libp2p drops what does not fit in it."""
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
        self._counters.published += 1

    async def blacklist(self, peer_id: str) -> None:
        """Drop everything ``peer_id`` sends or forwards from now on, and close our connection to it."""
        peer = _peer_id(peer_id)
        self._pubsub.add_to_blacklist(peer)
        # py-libp2p's blacklist closes the pubsub stream but leaves the peer in the router's mesh and its
        # outbound queue open (control messages pile up there); remove both.
        self._router.remove_peer(peer)
        queue = self._pubsub.peer_queues.pop(peer, None)
        if queue is not None:
            queue.close()
        await self._host.disconnect(peer)

    # --- internals ---

    def _deliver(self, msg: rpc_pb2.Message, forwarder: ID | None) -> None:
        via = None if forwarder is None or forwarder == self._host.get_id() else forwarder.to_base58()
        own = via is None
        message = GossipMessage(
            data=msg.data,
            source=ID(msg.from_id).to_base58(),
            forwarder=via,
            seqno=msg.seqno,
            received_at=time.time(),
        )
        for topic in msg.topicIDs:
            inbox = self._inboxes.get(topic)
            if inbox is None or (own and not inbox[1]):
                continue
            try:
                inbox[0].send_nowait(message)
                self._counters.received += 1
            except trio.WouldBlock:
                self._counters.dropped += 1
            except trio.ClosedResourceError:
                pass

    def _live_queues(self) -> list[Any]:
        """Outbound queues of peers we gossip with (py-libp2p can leave queues of departed peers behind)."""
        return [queue for peer, queue in self._pubsub.peer_queues.items() if peer in self._pubsub.peers]

    def _longest_queue(self) -> int:
        return max(map(len, self._live_queues()), default=0)

    async def _pace(self) -> None:
        if self._longest_queue() <= self.config.max_outbound_queue:
            return
        with trio.move_on_after(self.config.pacing_timeout):
            while self._longest_queue() > self.config.max_outbound_queue:
                await trio.sleep(self.config.pacing_poll)  # no event fires when a queue shrinks
            return
        self._counters.pacing_timeouts += 1
        logger.warning("a peer's outbound queue stayed full for %.1f s; publishing anyway", self.config.pacing_timeout)

    async def _flush(self, timeout: float) -> None:
        with trio.move_on_after(timeout):
            while not all(_queue_idle(queue) for queue in self._live_queues()):
                await trio.sleep(0.005)
            return
        logger.warning("closed before the outbound queues drained (%d RPCs left)", sum(map(len, self._live_queues())))

    async def _housekeeping(self) -> None:
        while True:
            await trio.sleep(self.config.heartbeat_interval)
            _trim_router_state(self._router, self.config.equivocation_cache)

    async def _keep_dialled(self, addr: str) -> None:
        """Dial a bootstrap peer until connected, backing off exponentially; re-dial if the connection drops.
        Failures are logged, never raised: an unreachable bootstrap peer must not take the node down."""
        info = info_from_p2p_addr(Multiaddr(addr))
        if info.peer_id == self._host.get_id():
            return
        delay, failures = self.config.bootstrap_backoff_initial, 0
        while not self._pubsub.is_peer_blacklisted(info.peer_id):
            if info.peer_id not in self._host.get_connected_peers():
                self._counters.bootstrap_attempts += 1
                try:
                    with trio.fail_after(self.config.dial_timeout):
                        await self._host.connect(info)
                except Exception as error:
                    self._counters.bootstrap_failures += 1
                    failures += 1
                    reason = f"{type(error).__name__}: {error}".replace("\n", " ")
                    logger.warning(
                        "bootstrap dial to %s failed (%d in a row, %s); retrying in %s s", addr, failures, reason, delay
                    )
                    await trio.sleep(delay)
                    delay = min(2 * delay, self.config.bootstrap_backoff_max)
                    continue
                logger.info("connected to bootstrap peer %s", addr)
                delay, failures = self.config.bootstrap_backoff_initial, 0
            await trio.sleep(self.config.heartbeat_interval)  # then check the connection is still there
