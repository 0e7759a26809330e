"""Reachability (:mod:`dgrpo.net.reachability`): the two py-libp2p 0.8.1 AutoNAT bugs it works around, each pinned
here with real hosts on 127.0.0.1 in one trio process, and its verdict rules with hand-worked cases.

1. Dial-back that does not dial: py-libp2p's ``AutoNATService`` server "dials back" with ``host.connect`` (its
   ``_try_dial``), which returns at once while any connection to the peer exists, and the asking peer is always
   connected (it asked over that connection). So it answers OK for an address nobody listens on
   (:func:`test_libp2p_autonat_reports_a_closed_port_reachable`). Our :class:`DialBackAutoNAT` dials a fresh
   connection and completes the handshake: E_DIAL_ERROR for the closed port and for a listener with another
   identity, OK for the asking peer's real listen address
   (:func:`test_dial_back_autonat_really_dials`).
2. No answer counted as a "no": py-libp2p's client records a refusal (E_DIAL_REFUSED, the server never dialled)
   and a server it could not even ask as failed dial-backs, so one such server makes a public node PRIVATE
   (:func:`test_libp2p_autonat_counts_a_refusal_and_a_silent_server_as_private`). :meth:`Reachability.record`
   keeps only OK and E_DIAL_ERROR as verdicts; E_DIAL_REFUSED, E_BAD_REQUEST and E_INTERNAL_ERROR go to
   ``no_answer`` (:func:`test_record_keeps_only_ok_and_dial_error_as_verdicts` and the real refusal in
   :func:`test_a_refusal_is_no_verdict`).
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.host.autonat.autonat import AUTONAT_PROTOCOL_ID, AutoNATService, AutoNATStatus
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes
from multiaddr import Multiaddr

from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.reachability import (
    PRIVATE,
    PUBLIC,
    UNKNOWN,
    DialBackAutoNAT,
    Reachability,
    ask,
    dial_back_candidates,
    strip_p2p,
)
from dgrpo.net.traversal_config import TraversalConfig

FAST = {"bootstrap_backoff_initial": 0.05, "bootstrap_backoff_max": 0.2, "shutdown_flush_timeout": 0.5}
QUIET = TraversalConfig(use_relays=False, hole_punching=False)  # only AutoNAT is under test here
ASK_TIMEOUT = 10.0


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on (bound by the kernel, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def refuses_connections(port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return True
    await stream.aclose()
    return False


@asynccontextmanager
async def server_and_client() -> AsyncIterator[tuple[GossipNode, GossipNode]]:
    """Two gossip nodes on 127.0.0.1, the client connected to the server (as an AutoNAT client always is)."""
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(GossipNode.open(GossipConfig(**FAST), create_new_key_pair(), QUIET))
        cfg = GossipConfig(**FAST, bootstrap=tuple(server.local_addrs()))
        client = await stack.enter_async_context(GossipNode.open(cfg, create_new_key_pair(), QUIET))
        await client.wait_for_peers(1, timeout=10)
        yield server, client


def listen_addr(node: GossipNode) -> Multiaddr:
    return strip_p2p(Multiaddr(node.local_addrs()[0]))


# ----------------------------------------------------------------- bug 1: the dial-back, with real hosts
def test_libp2p_autonat_reports_a_closed_port_reachable() -> None:
    """Pins py-libp2p's bug: should this test start failing, 0.8.1's server has been fixed upstream and
    :class:`DialBackAutoNAT` may no longer be needed."""

    async def main() -> None:
        with trio.fail_after(40):
            async with server_and_client() as (server, client):
                server_id = ID.from_base58(server.peer_id)
                AutoNATService(server._host, serve=True, confirmations=1)  # replaces the server's AutoNAT handler
                port = closed_port()
                assert await refuses_connections(port)
                closed = Multiaddr(f"/ip4/127.0.0.1/tcp/{port}")
                assert ID.from_base58(client.peer_id) in server._host.get_network().connections
                status = await ask(client.traversal.autonat, server_id, [closed], timeout=ASK_TIMEOUT)
                assert status == Message.OK  # without dialling: nobody listens there
                assert await refuses_connections(port)

    trio.run(main)


def test_dial_back_autonat_really_dials() -> None:
    async def main() -> None:
        with trio.fail_after(40):
            async with server_and_client() as (server, client):
                server_id = ID.from_base58(server.peer_id)
                ours = DialBackAutoNAT(server._host, dial_back_timeout=3.0)  # the handler registered last answers
                closed = Multiaddr(f"/ip4/127.0.0.1/tcp/{closed_port()}")
                autonat = client.traversal.autonat

                assert await ask(autonat, server_id, [closed], timeout=ASK_TIMEOUT) == Message.E_DIAL_ERROR
                assert ours.dial_backs >= 1
                # A listener with another identity (the server's own) fails the handshake's peer id check.
                wrong = listen_addr(server)
                assert await ask(autonat, server_id, [wrong], timeout=ASK_TIMEOUT) == Message.E_DIAL_ERROR
                # The client's real listen address: dialled and proven, and the swarm's connection survives.
                real = listen_addr(client)
                assert await ask(autonat, server_id, [closed, real], timeout=ASK_TIMEOUT) == Message.OK
                assert ID.from_base58(client.peer_id) in server._host.get_network().connections
                assert server.peer_id in client.connected_peers()

    trio.run(main)


def test_dial_back_autonat_dials_back_only_the_peer_that_asks() -> None:
    """py-libp2p's server dials whichever peer id a request names; ours refuses a request about another peer
    (E_BAD_REQUEST), so a peer cannot have the server probe someone else."""

    async def main() -> None:
        with trio.fail_after(40):
            async with server_and_client() as (server, client):
                server_id = ID.from_base58(server.peer_id)
                ours = DialBackAutoNAT(server._host, dial_back_timeout=3.0)
                other = ID.from_pubkey(create_new_key_pair().public_key)
                request = Message(type=Message.DIAL)
                request.dial.peer.id = other.to_bytes()
                request.dial.peer.addrs.append(listen_addr(client).to_bytes())
                stream = await client._host.new_stream(server_id, [AUTONAT_PROTOCOL_ID])
                await stream.write(encode_varint_prefixed(request.SerializeToString()))
                answer = Message()
                answer.ParseFromString(await read_varint_prefixed_bytes(stream))
                await stream.close()
                assert answer.dialResponse.status == Message.E_BAD_REQUEST
                assert (ours.bad_requests, ours.dial_backs) == (1, 0)
                # the same request about itself is dialled back
                real = listen_addr(client)
                assert await ask(client.traversal.autonat, server_id, [real], timeout=ASK_TIMEOUT) == Message.OK

    trio.run(main)


# ----------------------------------------------------------------- bug 2: no answer is not a "no"
def test_libp2p_autonat_counts_a_refusal_and_a_silent_server_as_private() -> None:
    """Pins py-libp2p's client bug (it is why :class:`Reachability` keeps its own verdicts)."""

    async def main() -> None:
        with trio.fail_after(40):
            async with server_and_client() as (server, client):
                server_id = ID.from_base58(server.peer_id)
                other_ip = Multiaddr("/ip4/10.1.2.3/tcp/4001")  # not the IP the server sees: it may not dial it
                libp2p_client = AutoNATService(client._host, serve=False, confirmations=1)
                status, _ = await libp2p_client.query_server(server_id, [other_ip.to_bytes()], timeout=ASK_TIMEOUT)
                assert status == Message.E_DIAL_REFUSED
                assert libp2p_client.dial_results == {server_id: False}  # recorded as "did not dial us back"
                libp2p_client.update_status()
                assert libp2p_client.get_status() == AutoNATStatus.PRIVATE

                # A server it cannot ask at all (no address known) is also a "no".
                silent = ID.from_pubkey(create_new_key_pair().public_key)
                fresh = AutoNATService(client._host, serve=False, confirmations=1)
                assert await fresh.check_reachability([silent]) == AutoNATStatus.PRIVATE
                assert fresh.dial_results == {silent: False}

    trio.run(main)


def test_a_refusal_is_no_verdict() -> None:
    async def main() -> None:
        with trio.fail_after(40):
            async with server_and_client() as (server, client):
                server_id = ID.from_base58(server.peer_id)
                server._host.set_stream_handler(AUTONAT_PROTOCOL_ID, DialBackAutoNAT(server._host, 3.0).handle_stream)
                refused = await ask(
                    client.traversal.autonat, server_id, [Multiaddr("/ip4/10.1.2.3/tcp/4001")], ASK_TIMEOUT
                )
                assert refused == Message.E_DIAL_REFUSED
                reach = Reachability(confirmations=1)
                reach.record(server.peer_id, refused)
                assert reach.status == UNKNOWN
                assert reach.snapshot()["no_verdict"] == {server.peer_id: "E_DIAL_REFUSED"}
                assert reach.verdicts == {}

                ok = await ask(client.traversal.autonat, server_id, [listen_addr(client)], ASK_TIMEOUT)
                assert ok == Message.OK
                reach.record(server.peer_id, ok)
                assert reach.status == PUBLIC
                assert reach.no_answer == {}  # a verdict replaces the server's earlier non-answer

    trio.run(main)


# ----------------------------------------------------------------- Reachability's rules, by hand
@pytest.mark.parametrize(
    ("status", "name"),
    [
        (Message.E_DIAL_REFUSED, "E_DIAL_REFUSED"),
        (Message.E_BAD_REQUEST, "E_BAD_REQUEST"),
        (Message.E_INTERNAL_ERROR, "E_INTERNAL_ERROR"),
    ],
)
def test_record_keeps_only_ok_and_dial_error_as_verdicts(status: int, name: str) -> None:
    reach = Reachability(confirmations=1)
    reach.record("s1", status)
    assert reach.verdicts == {}
    assert reach.no_answer == {"s1": name}
    assert reach.status == UNKNOWN

    reach.record("s2", Message.OK)
    reach.record("s3", Message.E_DIAL_ERROR)
    assert {s: ok for s, (ok, _) in reach.verdicts.items()} == {"s2": True, "s3": False}
    assert reach.snapshot() == {
        "status": UNKNOWN,  # one yes, one no: no majority
        "dialled_back_by": ["s2"],
        "not_dialled_back_by": ["s3"],
        "no_verdict": {"s1": name},
    }


def test_newest_verdict_per_server_counts() -> None:
    reach = Reachability(confirmations=1)
    reach.record("s1", Message.E_DIAL_ERROR)
    assert reach.status == PRIVATE
    reach.record("s1", Message.OK)  # the same server, later: replaces, does not add
    assert len(reach.verdicts) == 1
    assert reach.status == PUBLIC


def reachability(confirmations: int, yes: int, no: int) -> Reachability:
    reach = Reachability(confirmations=confirmations)
    for i in range(yes):
        reach.record(f"yes{i}", Message.OK)
    for i in range(no):
        reach.record(f"no{i}", Message.E_DIAL_ERROR)
    return reach


@pytest.mark.parametrize(
    ("confirmations", "yes", "no", "expected"),
    [
        (1, 0, 0, UNKNOWN),  # nobody asked yet
        (1, 1, 0, PUBLIC),
        (1, 0, 1, PRIVATE),
        (1, 1, 1, UNKNOWN),  # a tie is no majority
        (1, 2, 2, UNKNOWN),
        (1, 2, 1, PUBLIC),
        (1, 1, 2, PRIVATE),
        (2, 1, 0, UNKNOWN),  # one server is not enough confirmations
        (2, 1, 1, UNKNOWN),
        (2, 2, 1, PUBLIC),  # 2 >= 2 confirmations and 2 > 1
        (2, 1, 2, PRIVATE),
        (2, 2, 2, UNKNOWN),
        (2, 2, 3, PRIVATE),
        (3, 2, 0, UNKNOWN),
        (3, 3, 2, PUBLIC),
        (3, 0, 3, PRIVATE),
    ],
)
def test_status_needs_confirmations_and_a_majority(confirmations: int, yes: int, no: int, expected: str) -> None:
    assert reachability(confirmations, yes, no).status == expected


def test_one_hostile_server_cannot_talk_a_private_node_public() -> None:
    reach = reachability(confirmations=1, yes=0, no=2)
    reach.record("liar", Message.OK)
    assert reach.status == PRIVATE  # 1 yes against 2 no


# ----------------------------------------------------------------- addresses
def test_dial_back_candidates_add_the_listen_port_on_each_observed_ip() -> None:
    listen = [Multiaddr("/ip4/10.0.1.2/tcp/4001")]
    observed = [Multiaddr("/ip4/203.0.113.11/tcp/5555")]
    assert [str(a) for a in dial_back_candidates(listen, observed)] == [
        "/ip4/10.0.1.2/tcp/4001",
        "/ip4/203.0.113.11/tcp/4001",
    ]


def test_dial_back_candidates_dedup_and_keep_order() -> None:
    listen = [Multiaddr("/ip4/10.0.1.2/tcp/4001"), Multiaddr("/ip4/10.0.1.2/tcp/4002")]
    observed = [
        Multiaddr("/ip4/203.0.113.11/tcp/5555"),
        Multiaddr("/ip4/203.0.113.11/tcp/6666"),  # the same IP at another NAT port: no new candidate
        Multiaddr("/ip4/10.0.1.2/tcp/7777"),  # our own LAN IP: its candidates are our listen addresses
        Multiaddr("/ip4/198.51.100.9/tcp/1/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"),
        Multiaddr("/dns4/example.com/tcp/4001"),  # no IP: nothing to offer
    ]
    assert [str(a) for a in dial_back_candidates(listen, observed)] == [
        "/ip4/10.0.1.2/tcp/4001",
        "/ip4/10.0.1.2/tcp/4002",
        "/ip4/203.0.113.11/tcp/4001",
        "/ip4/203.0.113.11/tcp/4002",
        "/ip4/198.51.100.9/tcp/4001",
        "/ip4/198.51.100.9/tcp/4002",
    ]
    assert dial_back_candidates(listen, []) == listen
    assert dial_back_candidates([], observed) == []


def test_dial_back_candidates_ipv6_and_portless_listeners() -> None:
    listen = [Multiaddr("/ip6/fd00::2/tcp/4001"), Multiaddr("/ip4/10.0.1.2/udp/4001/quic-v1")]
    observed = [Multiaddr("/ip6/2001:db8::7/tcp/9999")]
    assert [str(a) for a in dial_back_candidates(listen, observed)] == [
        "/ip6/fd00::2/tcp/4001",
        "/ip4/10.0.1.2/udp/4001/quic-v1",
        "/ip6/2001:db8::7/tcp/4001",  # the QUIC listener has no TCP port to offer
    ]


RELAY = "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
PEER = "12D3KooWH3uVF6wv47WnArKHk5p6cvgCJEb74UTmxztmQDc298L3"


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        (f"/ip4/1.2.3.4/tcp/4001/p2p/{PEER}", "/ip4/1.2.3.4/tcp/4001"),
        ("/ip4/1.2.3.4/tcp/4001", "/ip4/1.2.3.4/tcp/4001"),
        (f"/ip6/::1/tcp/4001/p2p/{PEER}", "/ip6/::1/tcp/4001"),
        # only the trailing /p2p goes: a circuit keeps its relay
        (f"/ip4/1.2.3.4/tcp/4001/p2p/{RELAY}/p2p-circuit/p2p/{PEER}", f"/ip4/1.2.3.4/tcp/4001/p2p/{RELAY}/p2p-circuit"),
        (f"/p2p/{PEER}", f"/p2p/{PEER}"),  # nothing would be left: unchanged
    ],
)
def test_strip_p2p(addr: str, expected: str) -> None:
    assert str(strip_p2p(Multiaddr(addr))) == expected


def test_verdicts_expire() -> None:
    import time as _time

    r = Reachability(confirmations=1, max_age=60.0)
    r.verdicts["old"] = (True, _time.time() - 61.0)
    assert r.status == UNKNOWN and r.snapshot()["dialled_back_by"] == []
    r.record("new", Message.E_DIAL_ERROR)
    assert r.status == PRIVATE  # the stale "public" from a server long gone does not outvote it
