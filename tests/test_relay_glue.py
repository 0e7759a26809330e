"""The circuit relay glue (:mod:`dgrpo.net.relay`, :mod:`dgrpo.net.traversal`) with three real gossip nodes on
127.0.0.1 in one trio process: a relay R (``relay_service``), and A and B, which use relays.

- A reserves a slot on R by itself (the relay loop) and announces ``<R>/p2p/R/p2p-circuit/p2p/A`` first among its
  listen addresses; once it is publicly reachable it gives the slot up.
- py-libp2p's ``host.connect`` with only that circuit address does not connect: the swarm drops relay-only
  addresses (the first claim of :mod:`dgrpo.net.relay`'s docstring), so a relayed dial has to go to the circuit
  transport directly.
- B reaches A through the circuit (:meth:`GossipNode.dial` returns "relayed"), both sides call the connection
  "relayed", and it carries streams and gossip.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.network.exceptions import SwarmException
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from multiaddr import Multiaddr

from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.reachability import UNKNOWN
from dgrpo.net.relay import transport_addrs_of
from dgrpo.net.streams import Stream
from dgrpo.net.traversal import is_circuit
from dgrpo.net.traversal_config import TraversalConfig

FAST = {"bootstrap_backoff_initial": 0.05, "bootstrap_backoff_max": 0.2, "shutdown_flush_timeout": 0.5}
LOOP = {"peering_interval": 0.05, "hole_punching": False}  # no DCUtR: on loopback it would upgrade A-B to direct
RELAY = TraversalConfig(relay_service=True, use_relays=False, **LOOP)
# On loopback every AutoNAT server can dial A back, so with one confirmation A would find itself public at once and
# (rightly) give up its relay slot. Two confirmations cannot be had from R alone, A's only direct peer: A stays
# "unknown", which is what a node behind NAT sees before any server has answered, and it wants relays.
PRIVATE_ISH = TraversalConfig(use_relays=True, reachability_confirmations=2, **LOOP)
ECHO = "/dgrpo/test/echo/1.0.0"


@dataclass(frozen=True)
class Nodes:
    relay: GossipNode
    a: GossipNode
    b: GossipNode


@asynccontextmanager
async def three_nodes() -> AsyncIterator[Nodes]:
    async with AsyncExitStack() as stack:
        relay = await stack.enter_async_context(GossipNode.open(GossipConfig(**FAST), create_new_key_pair(), RELAY))
        via_relay = GossipConfig(**FAST, bootstrap=tuple(relay.local_addrs()))
        a = await stack.enter_async_context(GossipNode.open(via_relay, create_new_key_pair(), PRIVATE_ISH))
        b = await stack.enter_async_context(GossipNode.open(via_relay, create_new_key_pair(), PRIVATE_ISH))
        await a.wait_for_peers(1, timeout=10)
        await b.wait_for_peers(1, timeout=10)
        yield Nodes(relay, a, b)


async def until(ready: Callable[[], bool], timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not ready():
            await trio.sleep(0.02)


def circuit_addrs(node: GossipNode) -> list[str]:
    return [a for a in node.listen_addrs() if is_circuit(a)]


async def a_holds_a_slot(nodes: Nodes) -> str:
    """Wait for A's relay loop to reserve on R; A's announced circuit address."""
    await until(lambda: nodes.a.traversal.client.relays() == [nodes.relay.peer_id])
    return circuit_addrs(nodes.a)[0]


def test_a_reserves_on_the_relay_and_announces_the_circuit() -> None:
    async def main() -> None:
        with trio.fail_after(40):
            async with three_nodes() as nodes:
                relay, a = nodes.relay, nodes.a
                addr = await a_holds_a_slot(nodes)
                relay_addr = relay.local_addrs()[0]  # .../tcp/<port>/p2p/<R>
                assert addr == f"{relay_addr}/p2p-circuit/p2p/{a.peer_id}"
                assert a.listen_addrs()[0] == addr  # circuits first: they work from anywhere
                assert set(a.local_addrs()) < set(a.listen_addrs())  # then its own
                assert a.traversal.reachability.status == UNKNOWN  # see PRIVATE_ISH
                assert relay.traversal.snapshot()["relay_service_reservations"] >= 1
                assert relay.traversal.client.relays() == []  # R serves; it does not use relays
                # py-libp2p's own listen addresses cannot carry the circuit (basic_host strips it): ours do.
                assert not any(is_circuit(str(x)) for x in a._host.get_addrs())
                # Once public (two servers dialled A back; recorded by hand here), A gives the slot up.
                a.traversal.reachability.record("server-1", Message.OK)
                a.traversal.reachability.record("server-2", Message.OK)
                await until(lambda: a.traversal.client.relays() == [])
                assert circuit_addrs(a) == []

    trio.run(main)


def test_host_connect_drops_relay_only_addresses() -> None:
    """Pins the py-libp2p behaviour :mod:`dgrpo.net.relay` works around. Should this start failing, the swarm
    dials circuits itself and :meth:`RelayClient.dial` may be simplified."""

    async def main() -> None:
        with trio.fail_after(40):
            async with three_nodes() as nodes:
                a, b = nodes.a, nodes.b
                addr = await a_holds_a_slot(nodes)
                a_id = ID.from_base58(a.peer_id)
                assert transport_addrs_of(b._host, a_id) == []  # B knows no direct address of A to fall back on
                with pytest.raises(SwarmException, match="relay-only"):
                    await b._host.connect(PeerInfo(a_id, [Multiaddr(addr)]))
                assert a_id not in b._host.get_network().connections
                assert a.peer_id not in b.traversal.connections()

    trio.run(main)


def test_b_reaches_a_through_the_relay() -> None:
    async def main() -> None:
        with trio.fail_after(40):
            async with three_nodes() as nodes:
                a, b = nodes.a, nodes.b
                await a_holds_a_slot(nodes)
                assert a.peer_id not in b.traversal.connections()

                async def echo(stream: Stream) -> None:
                    await stream.write(await stream.read_exactly(5))
                    await stream.close()

                a.serve_streams(ECHO, echo)
                assert await b.dial(a.peer_id, a.listen_addrs()) == "relayed"
                assert b.traversal.connections()[a.peer_id] == "relayed"
                assert b.traversal.dials["relayed_ok"] == 1
                assert b.traversal.client.relayed_dials == 1
                await until(lambda: b.peer_id in a.traversal.connections())
                assert a.traversal.connections()[b.peer_id] == "relayed"
                # The connection carries streams (over R, which only relays bytes, and counts them) ...
                relayed = nodes.relay.traversal.protocol.relayed_bytes
                stream = await b.open_stream(a.peer_id, ECHO)
                await stream.write(b"hello")
                assert await stream.read_exactly(5) == b"hello"
                await stream.close()
                assert nodes.relay.traversal.protocol.relayed_bytes >= relayed + 10  # noise-framed, both ways
                assert (
                    nodes.relay.traversal.snapshot()["relay_service_bytes"]
                    == nodes.relay.traversal.protocol.relayed_bytes
                )
                # ... and gossip: a pubsub stream each way.
                await until(lambda: a.peer_id in b.connected_peers() and b.peer_id in a.connected_peers())
                assert b.traversal.connections()[a.peer_id] == "relayed"  # still: nothing dialled A directly

    trio.run(main)


def test_a_punch_is_recorded_where_it_succeeds_even_if_no_poll_saw_the_relayed_leg() -> None:
    """CI once saw a pair of homes connected direct with no hole punch recorded: the relayed connection had been
    upgraded between two polls of the connection kinds. DCUtR's success path (``_schedule_relay_close``) records
    the peer itself now."""
    from dgrpo.net.traversal import PromptDCUtR, Traversal

    dcutr = PromptDCUtR.__new__(PromptDCUtR)  # no host: only the success hook is under test
    dcutr.punched = set()
    dcutr._nursery = None  # py-libp2p's schedule is then a no-op
    peer = ID.from_pubkey(create_new_key_pair().public_key)
    dcutr._schedule_relay_close(peer)
    assert dcutr.punched == {peer.to_base58()}

    traversal = Traversal.__new__(Traversal)
    traversal.dcutr, traversal.upgraded, traversal._seen_relayed = dcutr, set(), set()
    traversal.connections = lambda: {peer.to_base58(): "direct"}  # type: ignore[method-assign]
    traversal._track_upgrades()
    assert traversal.upgraded == {peer.to_base58()}, "direct now, never seen relayed, but punched"
    dcutr.punched.clear()
    other = Traversal.__new__(Traversal)
    other.dcutr, other.upgraded, other._seen_relayed = dcutr, set(), set()
    other.connections = lambda: {peer.to_base58(): "direct"}  # type: ignore[method-assign]
    other._track_upgrades()
    assert other.upgraded == set(), "a connection that was direct from the start is no hole punch"


def test_the_status_shows_a_punch_before_the_relay_loop_polls_it() -> None:
    """CI saw the homes direct in ``connections`` while ``hole_punched`` was still empty: the status was asked
    between DCUtR's success and the relay loop's next pass, which alone copied punches into ``upgraded``."""
    from dgrpo.net.traversal import PromptDCUtR, Traversal

    dcutr = PromptDCUtR.__new__(PromptDCUtR)
    dcutr.punched, dcutr._nursery = set(), None
    punched, seen, plain = (ID.from_pubkey(create_new_key_pair().public_key).to_base58() for _ in range(3))
    dcutr.punched.add(punched)
    traversal = Traversal.__new__(Traversal)
    traversal.dcutr, traversal.upgraded, traversal._seen_relayed = dcutr, set(), {seen}
    kinds = {punched: "direct", seen: "direct", plain: "direct"}
    assert traversal.hole_punched(kinds) == sorted([punched, seen])  # no poll ran; a plain direct peer is no punch
    assert traversal.upgraded == set()
    assert traversal.hole_punched({seen: "relayed"}) == [punched]
