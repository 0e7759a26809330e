"""The gossip layer over real py-libp2p: three nodes in one trio process on 127.0.0.1, chained A - B - C
(B dials A, C dials B; C has no connection to A). Waits poll readiness or wait until every task is blocked
(the whole network lives in this process), never a fixed sleep."""

from __future__ import annotations

import logging
import re
import socket
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V12
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.rpc_queue import RpcQueue

from dgrpo.net.gossip import (
    LIBP2P_MAX_RPC_BYTES,
    GossipConfig,
    GossipError,
    GossipMessage,
    GossipNode,
    GossipTimeoutError,
    MessageTooLargeError,
)
from dgrpo.net.pubsub import ReceiptGossipSub

TOPIC = "rollouts"
FAST_DIAL = {"bootstrap_backoff_initial": 0.05, "bootstrap_backoff_max": 0.2, "shutdown_flush_timeout": 1.0}


def config(**overrides: Any) -> GossipConfig:
    return GossipConfig(**{**FAST_DIAL, **overrides})


@dataclass(frozen=True)
class Chain:
    a: GossipNode
    b: GossipNode
    c: GossipNode
    inbox: dict[str, trio.MemoryReceiveChannel[GossipMessage]]  # by node name


@asynccontextmanager
async def chain() -> AsyncIterator[Chain]:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(GossipNode.open(config(), create_new_key_pair()))
        b = await stack.enter_async_context(GossipNode.open(config(bootstrap=a.listen_addrs()), create_new_key_pair()))
        c = await stack.enter_async_context(GossipNode.open(config(bootstrap=b.listen_addrs()), create_new_key_pair()))
        await b.wait_for_peers(2, timeout=10)
        inbox = {name: await node.subscribe(TOPIC) for name, node in zip("abc", (a, b, c), strict=True)}
        await a.wait_for_mesh(TOPIC, 1, timeout=10)
        await b.wait_for_mesh(TOPIC, 2, timeout=10)
        await c.wait_for_mesh(TOPIC, 1, timeout=10)
        yield Chain(a, b, c, inbox)


def run(test: Callable[[], Awaitable[None]], limit: float = 30.0) -> None:
    async def main() -> None:
        with trio.fail_after(limit):
            await test()

    try:
        trio.run(main)
    except BaseExceptionGroup as group:  # a failed assert comes back wrapped in every nursery it crossed
        raise _root_cause(group) from None


def _root_cause(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = next((e for e in error.exceptions if not isinstance(e, trio.Cancelled)), error.exceptions[0])
    return error


async def quiescent() -> None:
    """Every task in the process (all three nodes) is blocked and no socket is readable: nothing is in flight."""
    await trio.testing.wait_all_tasks_blocked(cushion=0.01)


def pending(channel: trio.MemoryReceiveChannel[GossipMessage]) -> list[bytes]:
    return [m.data for m in iter(lambda: _receive_nowait(channel), None)]


def _receive_nowait(channel: trio.MemoryReceiveChannel[GossipMessage]) -> GossipMessage | None:
    try:
        return channel.receive_nowait()
    except trio.WouldBlock:
        return None


def test_config_rejects_inconsistent_values() -> None:
    with pytest.raises(ValueError, match="degree_low <= degree <= degree_high"):
        GossipConfig(degree=3, degree_low=4)
    with pytest.raises(ValueError, match="max_message_bytes must be <="):
        GossipConfig(max_message_bytes=1024 * 1024)
    with pytest.raises(ValueError, match="not a multiaddr ending in /p2p/<id>"):
        GossipConfig(bootstrap=("/ip4/127.0.0.1/tcp/4001",))
    with pytest.raises(ValueError, match="extra"):
        GossipConfig(heartbeat=1.0)  # type: ignore[call-arg]


def test_lonely_node_reports_its_address_and_times_out_waiting() -> None:
    async def main() -> None:
        async with GossipNode.open(config(), create_new_key_pair()) as node:
            (addr,) = node.listen_addrs()
            assert re.fullmatch(rf"/ip4/127\.0\.0\.1/tcp/[1-9]\d*/p2p/{node.peer_id}", addr)
            await node.subscribe(TOPIC)
            with pytest.raises(GossipTimeoutError, match=f"no 1 mesh peers on '{TOPIC}' after 0.05 s"):
                await node.wait_for_mesh(TOPIC, 1, timeout=0.05)
            with pytest.raises(GossipError, match="already subscribed"):
                await node.subscribe(TOPIC)

    run(main)


def test_message_reaches_b_and_c_exactly_once() -> None:
    async def main() -> None:
        async with chain() as net:
            assert net.c.connected_peers() == {net.b.peer_id}  # C is only linked to B
            await net.a.publish(TOPIC, b"hello")
            at_b = await net.inbox["b"].receive()
            at_c = await net.inbox["c"].receive()
            assert (at_b.data, at_b.source, at_b.forwarder) == (b"hello", net.a.peer_id, net.a.peer_id)
            assert (at_c.data, at_c.source, at_c.forwarder) == (b"hello", net.a.peer_id, net.b.peer_id)
            await quiescent()
            assert pending(net.inbox["a"]) == []  # own publishes are not echoed
            assert pending(net.inbox["b"]) == pending(net.inbox["c"]) == []
            assert net.a.statistics().published == 1
            assert net.c.statistics().received == 1

    run(main)


def test_rejected_message_is_neither_delivered_nor_forwarded() -> None:
    async def main() -> None:
        seen_by_c: list[bytes] = []

        def b_validator(data: bytes, source: str, forwarder: str) -> bool:
            if data == b"boom":
                raise ValueError("validator bug")
            return not data.startswith(b"bad")

        def c_validator(data: bytes, source: str, forwarder: str | None) -> bool:
            seen_by_c.append(data)
            return True

        async with chain() as net:
            net.b.set_validator(TOPIC, b_validator)
            net.c.set_validator(TOPIC, c_validator)
            for payload in (b"bad-1", b"boom", b"good-1"):
                await net.a.publish(TOPIC, payload)
            assert (await net.inbox["b"].receive()).data == b"good-1"
            assert (await net.inbox["c"].receive()).data == b"good-1"
            await quiescent()
            assert pending(net.inbox["b"]) == pending(net.inbox["c"]) == []
            assert seen_by_c == [b"good-1"]  # C never saw the rejected ones, though it would accept them
            assert net.b.statistics().validator_rejected == 2

    run(main)


def test_two_hundred_paced_messages_all_arrive() -> None:
    async def main() -> None:
        async with chain() as net:
            count, filler = 200, bytes(4096)
            for i in range(count):
                await net.a.publish(TOPIC, i.to_bytes(4, "big") + filler)
            got = [int.from_bytes((await net.inbox["c"].receive()).data[:4], "big") for _ in range(count)]
            assert sorted(got) == list(range(count))
            await quiescent()
            assert pending(net.inbox["c"]) == []
            assert net.c.statistics().dropped == net.b.statistics().dropped == 0

    run(main)


def test_oversize_publish_raises_and_the_largest_allowed_arrives() -> None:
    async def main() -> None:
        async with chain() as net:
            limit = net.a.config.max_message_bytes
            with pytest.raises(MessageTooLargeError, match=f"exceeds max_message_bytes={limit}"):
                await net.a.publish(TOPIC, bytes(limit + 1))
            with pytest.raises(GossipError, match="topic must be"):
                await net.a.publish("", b"x")
            await net.a.publish(TOPIC, b"\x01" * limit)
            assert (await net.inbox["c"].receive()).data == b"\x01" * limit
            assert net.a.statistics().published == 1

    run(main)


def test_blacklisted_peer_is_no_longer_heard() -> None:
    async def main() -> None:
        async with chain() as net:
            await net.c.publish(TOPIC, b"before")
            assert (await net.inbox["b"].receive()).data == b"before"
            await net.b.blacklist(net.c.peer_id)
            assert net.b.blacklisted() == {net.c.peer_id}
            # C re-dials its bootstrap peer B; B reads nothing from it: the stream is reset, the connection closed.
            while not net.b._pubsub.refused_blacklisted[net.c.peer_id]:
                await trio.sleep(0.01)
            assert net.b.statistics().refused_blacklisted >= 1
            await net.c.publish(TOPIC, b"after")
            await net.a.publish(TOPIC, b"from-a")
            assert (await net.inbox["b"].receive()).data == b"from-a"
            for i in range(3):
                await net.b.publish(TOPIC, b"from-b-%d" % i)
            await quiescent()
            assert pending(net.inbox["b"]) == []
            assert net.c.peer_id not in net.b.connected_peers()
            # B keeps no state for the re-dialled C: no subscriptions, no messages queued for it.
            c = ID.from_base58(net.c.peer_id)
            assert all(c not in peers for peers in net.b._pubsub.peer_topics.values())
            assert c not in net.b._router._pending_messages
            with pytest.raises(GossipError, match="not a peer id"):
                await net.b.blacklist("nonsense")

    run(main)


class _ResetRacesDisconnect:
    """A pubsub stream whose reset lets the peer's dead-peer handler run first (as when the connection closes
    during the reset): the entry is gone from ``pubsub.peers`` by the time the reset returns."""

    def __init__(self, stream: Any, peers: dict[Any, Any], peer: ID) -> None:
        self._stream, self._peers, self._peer = stream, peers, peer

    async def reset(self) -> None:
        self._peers.pop(self._peer, None)
        await self._stream.reset()


def test_blacklisting_survives_a_disconnect_during_the_stream_reset() -> None:
    """py-libp2p 0.8.1 deletes the peer's entry after the reset unconditionally: a KeyError that took down the
    whole Pubsub service (and the node) in a 4-daemon testnet. The node must shrug it off and keep working."""

    async def main() -> None:
        async with chain() as net:
            pubsub: Any = net.b._pubsub
            c = ID.from_base58(net.c.peer_id)
            pubsub.peers[c] = _ResetRacesDisconnect(pubsub.peers[c], pubsub.peers, c)
            await pubsub._teardown_if_connected(c)
            assert c not in pubsub.peers
            await net.b.blacklist(net.c.peer_id)
            await net.a.publish(TOPIC, b"still-working")
            assert (await net.inbox["b"].receive()).data == b"still-working"

    run(main)


def test_unreachable_bootstrap_backs_off_and_node_still_works(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    dead_peer = ID.from_pubkey(create_new_key_pair().public_key).to_base58()
    dead = f"/ip4/127.0.0.1/tcp/{dead_port}/p2p/{dead_peer}"

    async def main() -> None:
        async with (
            GossipNode.open(config(), create_new_key_pair()) as a,
            GossipNode.open(config(bootstrap=(dead, *a.listen_addrs())), create_new_key_pair()) as d,
        ):
            inbox = await a.subscribe(TOPIC)
            await d.subscribe(TOPIC)
            await d.wait_for_mesh(TOPIC, 1, timeout=10)
            await d.publish(TOPIC, b"still here")
            assert (await inbox.receive()).data == b"still here"
            while d.statistics().bootstrap_failures < 4:
                await trio.sleep(0.01)
            stats = d.statistics()
            assert stats.bootstrap_attempts == stats.bootstrap_failures + 1  # one success, to A

    with caplog.at_level(logging.WARNING, logger="dgrpo.net.gossip"):
        run(main)
    failures = [r for r in caplog.records if r.getMessage().startswith(f"bootstrap dial to {dead} failed")]
    delays = [r.args[-1] for r in failures if isinstance(r.args, tuple)]
    assert delays[:4] == [0.05, 0.1, 0.2, 0.2]  # exponential, capped at bootstrap_backoff_max


def test_restarted_publisher_is_not_mistaken_for_a_replay() -> None:
    """py-libp2p numbers messages from the wall clock in seconds; a publisher restarted within a second would
    reuse (from, seqno) and its new message be dropped as already seen."""

    async def main() -> None:
        key = create_new_key_pair()
        async with GossipNode.open(config(), create_new_key_pair()) as b:
            inbox = await b.subscribe(TOPIC)
            seqnos = []
            for payload in (b"first life", b"second life"):
                async with GossipNode.open(config(bootstrap=b.listen_addrs()), key) as a:
                    await a.subscribe(TOPIC)
                    await a.wait_for_mesh(TOPIC, 1, timeout=10)
                    await b.wait_for_mesh(TOPIC, 1, timeout=10)
                    await a.publish(TOPIC, payload)
                    message = await inbox.receive()
                    assert (message.data, message.source) == (payload, a.peer_id)
                    seqnos.append(message.seqno)
                while b.connected_peers():
                    await trio.sleep(0.01)
            assert seqnos[1] > seqnos[0]

    run(main, limit=15)


@asynccontextmanager
async def pair() -> AsyncIterator[Chain]:
    """A and B connected and meshed on TOPIC (``c`` is B again: a chain of two)."""
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(GossipNode.open(config(), create_new_key_pair()))
        b = await stack.enter_async_context(GossipNode.open(config(bootstrap=a.listen_addrs()), create_new_key_pair()))
        inbox = {"a": await a.subscribe(TOPIC), "b": await b.subscribe(TOPIC)}
        await a.wait_for_mesh(TOPIC, 1, timeout=10)
        await b.wait_for_mesh(TOPIC, 1, timeout=10)
        yield Chain(a, b, b, inbox)


def test_concurrent_large_rpcs_to_one_peer_do_not_interleave() -> None:
    # py-libp2p writes to a new peer from its sending task and directly (recent messages); yamux locks each
    # 64 KiB frame only, so two RPCs over the send window interleaved and killed the reader (a late joiner).
    from libp2p.pubsub.pb import rpc_pb2

    async def main() -> None:
        async with pair() as net:
            stream = net.a._pubsub.peers[ID.from_base58(net.b.peer_id)]
            big = [rpc_pb2.RPC(subscriptions=[rpc_pb2.RPC.SubOpts(subscribe=False, topicid=c * 400_000)]) for c in "xy"]
            async with trio.open_nursery() as nursery:
                for rpc in big:
                    nursery.start_soon(net.a._pubsub.write_msg, stream, rpc)
            await net.a.publish(TOPIC, b"still readable")
            assert (await net.inbox["b"].receive()).data == b"still readable"

    run(main)


def test_a_malformed_rpc_closes_the_stream_not_the_node(caplog: pytest.LogCaptureFixture) -> None:
    from libp2p.utils.varint import encode_varint_prefixed

    async def main() -> None:
        async with pair() as net:
            stream = net.a._pubsub.peers[ID.from_base58(net.b.peer_id)]
            await stream.write(encode_varint_prefixed(b"\xff\xff\xff\xff"))  # not a protobuf RPC
            await quiescent()
            assert "malformed pubsub RPC" in caplog.text
            await net.b.publish(TOPIC, b"B runs on")  # (it treats A as gone, as for a bad length prefix)
        # ... and both nodes closed cleanly: before, the DecodeError escaped py-libp2p and ended B here

    with caplog.at_level(logging.WARNING, logger="dgrpo.net.gossip"):
        run(main)


def test_an_iwant_answer_is_split_under_the_receivers_inbound_limit() -> None:
    # A peer that missed a whole federated update asks for all its chunks in one IWANT (32 messages of 128 KiB
    # and more). py-libp2p 0.8.1 answers from its message cache through the peer's outbound queue, which splits
    # the answer (a port of go-libp2p-pubsub's RPC.split) into RPCs of at most 1 MiB: each stays under the
    # receiver's inbound limit, and none of the messages is dropped.
    router = ReceiptGossipSub(protocols=[PROTOCOL_ID_V12], degree=6, degree_low=4, degree_high=12)
    peer = ID(b"\x00\x24" + bytes(range(36)))
    queue = RpcQueue()
    me = ID(b"\x00\x24" + bytes([99]) * 36)
    router.pubsub = types.SimpleNamespace(my_id=me, peer_queues={peer: queue})  # what handle_iwant, send_rpc use
    wanted = []
    for i in range(32):
        msg = rpc_pb2.Message(from_id=b"a" * 38, data=bytes([i]) * 131_000, seqno=i.to_bytes(8, "big"), topicIDs=["t"])
        router.mcache.put(msg)
        wanted.append((msg.from_id + msg.seqno).hex().encode())  # py-libp2p's wire form of a message id
    trio.run(router.handle_iwant, rpc_pb2.ControlIWant(messageIDs=wanted), peer)
    parts = []
    while (part := queue._queue.pop()) is not None:
        parts.append(part)
    sizes = [p.ByteSize() for p in parts]
    assert len(parts) >= 4 and max(sizes) <= LIBP2P_MAX_RPC_BYTES < GossipConfig().max_inbound_rpc_size
    assert [m.seqno for p in parts for m in p.publish] == [i.to_bytes(8, "big") for i in range(32)]


def test_own_messages_also_go_straight_to_the_peers_trusted_besides_the_mesh() -> None:
    # A mesh of Sybils must not keep a node's own rollouts and heartbeats from its senior peers: they go to
    # ``publish_to`` as well (if joined to the topic), forwarded messages only to the mesh, as before.
    router = ReceiptGossipSub(protocols=[PROTOCOL_ID_V12], degree=6, degree_low=4, degree_high=12)
    me, mesh, senior, unsubscribed, origin = (ID(b"\x00\x24" + bytes([i]) * 36) for i in range(5))
    router.pubsub = types.SimpleNamespace(my_id=me, peer_topics={"t": {mesh, senior, origin}})
    router.mesh = {"t": {mesh}}
    router.publish_to = frozenset({senior, unsubscribed})
    assert set(router._get_peers_to_send(["t"], me, me)) == {mesh, senior}
    assert set(router._get_peers_to_send(["t"], origin, origin)) == {mesh}  # forwarded: the mesh only
    router.publish_to = frozenset()
    assert set(router._get_peers_to_send(["t"], me, me)) == {mesh}


def test_a_full_queue_keeps_room_for_our_own_and_our_seniors_messages() -> None:
    # py-libp2p's outbound queue (32 RPCs a peer) refuses what comes when full. Filled with forwarded messages
    # of young identities, it would refuse our own rollouts; now ours and our seniors' go ahead (the priority
    # tier) and take the place of the newest forwarded message of anyone else, which is dropped and counted.
    from libp2p.pubsub.rpc_queue import OutBoundQueueSize, RpcQueue

    router = ReceiptGossipSub(protocols=[PROTOCOL_ID_V12], degree=6, degree_low=4, degree_high=12)
    me, peer, senior, sybil = (ID(b"\x00\x24" + bytes([i]) * 36) for i in range(4))
    queue = RpcQueue()
    router.pubsub = types.SimpleNamespace(my_id=me, peer_queues={peer: queue}, peer_topics={})
    router.publish_to = frozenset({senior})

    def rpc(origin: ID, seqno: int) -> rpc_pb2.RPC:
        message = rpc_pb2.Message(from_id=origin.to_bytes(), seqno=seqno.to_bytes(8, "big"), topicIDs=["t"])
        return rpc_pb2.RPC(publish=[message])

    for k in range(OutBoundQueueSize):
        router.send_rpc(peer, rpc(sybil, k))
    assert len(queue) == OutBoundQueueSize
    router.send_rpc(peer, rpc(sybil, 99))  # someone else's, into a full queue: refused, as before
    assert router.dropped_to_peer[peer.to_base58()] == 1 and router.yielded == 0
    router.send_rpc(peer, rpc(me, 1))
    router.send_rpc(peer, rpc(senior, 2))
    assert len(queue) == OutBoundQueueSize and router.yielded == 2
    assert router.dropped_to_peer[peer.to_base58()] == 3
    sent = [queue._queue.pop() for _ in range(OutBoundQueueSize)]
    origins = [ID(r.publish[0].from_id) for r in sent if r is not None]
    assert origins[:2] == [me, senior]  # ahead of the forwarded ones
    seqnos = [int.from_bytes(r.publish[0].seqno, "big") for r in sent[2:] if r is not None]
    assert seqnos == list(range(OutBoundQueueSize - 2))  # the newest two forwarded ones made room


def test_the_read_loop_still_reads_rpcs_through_the_rebound_name() -> None:
    # DeliveringPubsub counts oversize RPCs by rebinding this one name in py-libp2p's read loop: a version that
    # renames it would count nothing, silently.
    from libp2p.pubsub.pubsub import Pubsub

    assert "read_varint_prefixed_bytes_limited" in Pubsub.continuously_read_stream.__code__.co_names


@pytest.mark.parametrize("size", [GossipConfig().max_inbound_rpc_size + 1, 10 * 1024 * 1024])
def test_an_oversize_rpc_is_a_counted_rejection_of_its_peer_and_the_node_lives_on(
    size: int, caplog: pytest.LogCaptureFixture
) -> None:
    from dgrpo.net.hostile import send_raw_rpc, signed_message

    async def main() -> None:
        async with AsyncExitStack() as stack:
            net = await stack.enter_async_context(pair())
            # a third node connected to B: B must keep it while it resets A's stream
            c = await stack.enter_async_context(
                GossipNode.open(config(bootstrap=net.b.listen_addrs()), create_new_key_pair())
            )
            inbox_c = await c.subscribe(TOPIC)
            await net.b.wait_for_mesh(TOPIC, 2, timeout=10)
            reported: list[tuple[str, str]] = []
            net.b.on_rejection(lambda peer, reason: reported.append((peer, reason)))
            rpc = rpc_pb2.RPC(publish=[signed_message(net.a, TOPIC, b"x" * size)])
            assert rpc.ByteSize() > net.b.config.max_inbound_rpc_size
            await send_raw_rpc(net.a, net.b.peer_id, rpc)
            await net.b._poll(lambda: net.b.statistics().oversize_rpc == 1, 10, "the oversize RPC counted")
            assert net.b.rejections_by_peer() == {net.a.peer_id: {"oversize_rpc": 1}}
            assert reported == [(net.a.peer_id, "oversize_rpc")]
            assert f"rejected an inbound RPC of {rpc.ByteSize()} bytes from {net.a.peer_id}" in caplog.text
            assert pending(net.inbox["b"]) == []  # none of it was delivered
            assert c.peer_id in net.b.connected_peers()
            # A's stream was reset; py-libp2p opens a new one on the live connection, and gossip flows again
            await net.a.wait_for_mesh(TOPIC, 1, timeout=20)
            await net.b.wait_for_mesh(TOPIC, 2, timeout=20)
            await net.a.publish(TOPIC, b"after the reset")
            assert (await net.inbox["b"].receive()).data == b"after the reset"
            assert (await inbox_c.receive()).data == b"after the reset"
            assert net.b.statistics().oversize_rpc == 1

    with caplog.at_level(logging.WARNING, logger="dgrpo.net.gossip"):
        run(main, limit=60)


def test_a_flood_of_oversize_rpcs_is_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    # The counting itself, without the network: B's read loop reports three oversize RPCs from one peer.
    async def main() -> None:
        async with GossipNode.open(config(max_tracked_peers=2), create_new_key_pair()) as node:
            peers = [ID.from_pubkey(create_new_key_pair().public_key) for _ in range(3)]
            for _ in range(3):
                node._pubsub._on_oversize(peers[0], 2_000_000)
            assert caplog.text.count("rejected an inbound RPC") == 1
            node._pubsub._on_oversize(peers[1], 2_000_000)
            node._pubsub._on_oversize(peers[2], 2_000_000)  # over max_tracked_peers: the least recent goes
            assert node.rejections_by_peer() == {
                peers[1].to_base58(): {"oversize_rpc": 1},
                peers[2].to_base58(): {"oversize_rpc": 1},
            }
            assert node.statistics().oversize_rpc == 5

    with caplog.at_level(logging.WARNING, logger="dgrpo.net.gossip"):
        run(main)
