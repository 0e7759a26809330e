"""Peer exchange's choices (:class:`dgrpo.net.peering.Peering`) and the connection bounds of the host
(:class:`dgrpo.net.host.PerIPLimiter`, :func:`dgrpo.net.host.resource_manager`), with numbers worked out by hand,
and those bounds inside py-libp2p's swarm (real hosts on 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

import libp2p
import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.network.exceptions import SwarmException
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.host import PerIPLimiter, noise_only, resource_manager
from dgrpo.net.peering import Backoff, Peering, subnet_of
from dgrpo.net.traversal_config import TraversalConfig

RELAY = "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
NOW = 1000.0


def tcp(ip: str, port: int = 4001) -> str:
    return f"/ip4/{ip}/tcp/{port}" if ":" not in ip else f"/ip6/{ip}/tcp/{port}"


def circuit(peer: str) -> str:
    return f"/ip4/198.51.100.1/tcp/4001/p2p/{RELAY}/p2p-circuit/p2p/{peer}"


def peering(seed: int = 0, **config: float) -> Peering:
    return Peering(TraversalConfig(**config), me="me", seed=seed)


# ----------------------------------------------------------------- subnet_of
@pytest.mark.parametrize(
    ("addrs", "expected"),
    [
        ([tcp("203.0.113.77")], "203.0.113.0/24"),
        ([tcp("203.0.113.77"), tcp("198.51.100.1")], "203.0.113.0/24"),  # the first direct address
        ([tcp("2001:db8:abcd:12::1")], "2001:db8:abcd::/48"),
        ([tcp("2001:db8:abcd:ffff:1::9")], "2001:db8:abcd::/48"),
        ([circuit("peer")], None),  # relay-only: its relays differ, it has no address block
        ([circuit("peer"), tcp("10.0.7.9")], "10.0.7.0/24"),  # circuits are skipped, not the direct one after
        (["/dns4/example.com/tcp/4001"], None),
        ([], None),
    ],
)
def test_subnet_of(addrs: list[str], expected: str | None) -> None:
    assert subnet_of(addrs) == expected


# ----------------------------------------------------------------- candidates
def test_candidates_fill_only_what_is_missing() -> None:
    known = {"c1": [tcp("10.0.0.1")], **{f"p{i}": [tcp(f"10.0.{i}.1")] for i in range(1, 5)}}
    chosen = peering(target_peers=3).candidates(known, connected={"c1"}, excluded=set(), now=NOW)
    assert len(chosen) == 2  # 3 wanted, 1 held
    assert set(chosen) <= {"p1", "p2", "p3", "p4"}
    assert len(set(chosen)) == 2
    assert peering(target_peers=3).candidates(known, {"c1", "x", "y"}, set(), NOW) == []
    assert peering(target_peers=3).candidates(known, {"c1", "x", "y", "z"}, set(), NOW) == []


def test_candidates_skip_self_excluded_addressless_and_backing_off_peers() -> None:
    known: dict[str, Sequence[str]] = {
        "me": [tcp("10.0.1.1")],
        "bad": [tcp("10.0.2.1")],
        "slow": [tcp("10.0.3.1")],
        "due": [tcp("10.0.4.1")],
        "mute": [],
        "ok": [tcp("10.0.5.1")],
    }
    p = peering(target_peers=8)
    p.backoff["slow"] = Backoff(failures=2, until=NOW + 0.001)
    p.backoff["due"] = Backoff(failures=3, until=NOW)  # its backoff ends now: due again
    assert sorted(p.candidates(known, connected=set(), excluded={"bad"}, now=NOW)) == ["due", "ok"]
    assert sorted(p.candidates(known, connected=set(), excluded={"bad"}, now=NOW + 0.001)) == ["due", "ok", "slow"]


def test_at_most_max_per_subnet_per_ipv4_24_counting_connected_peers() -> None:
    known = {
        "c1": [tcp("10.0.0.5")],  # connected, in 10.0.0.0/24
        "a1": [tcp("10.0.0.6")],
        "a2": [tcp("10.0.0.7")],
        "a3": [tcp("10.0.0.200", 9999)],
        "a4": [circuit("a4"), tcp("10.0.0.8")],  # a circuit first does not hide its block
        "b1": [tcp("10.0.1.6")],
        "b2": [tcp("10.0.1.7")],
        "b3": [tcp("10.0.1.8")],
    }
    for seed in range(20):  # whatever the shuffle picks first
        chosen = peering(seed, target_peers=8, max_per_subnet=2).candidates(known, {"c1"}, set(), NOW)
        assert len([p for p in chosen if p.startswith("a")]) == 1  # 2 per block, c1 holds one
        assert len([p for p in chosen if p.startswith("b")]) == 2
        assert len(chosen) == 3


def test_at_most_max_per_subnet_per_ipv6_48() -> None:
    known = {
        "v1": [tcp("2001:db8:1::1")],
        "v2": [tcp("2001:db8:1:ffff::2")],  # the same /48 as v1
        "v3": [tcp("2001:db8:2::1")],
    }
    for seed in range(20):
        chosen = peering(seed, target_peers=8, max_per_subnet=1).candidates(known, set(), set(), NOW)
        assert len(chosen) == 2
        assert "v3" in chosen
        assert len({"v1", "v2"} & set(chosen)) == 1


def test_relay_only_peers_have_no_subnet_limit() -> None:
    known = {f"r{i}": [circuit(f"r{i}")] for i in range(4)}
    connected = {"c1"}  # not in known: no address block to count
    chosen = peering(target_peers=8, max_per_subnet=1).candidates(known, connected, set(), NOW)
    assert sorted(chosen) == ["r0", "r1", "r2", "r3"]


def test_the_shuffle_is_seeded() -> None:
    known = {f"p{i:02d}": [tcp(f"10.0.{i}.1")] for i in range(20)}
    first = peering(7, target_peers=5).candidates(known, set(), set(), NOW)
    assert first == peering(7, target_peers=5).candidates(known, set(), set(), NOW)
    orders = {tuple(peering(seed, target_peers=20).candidates(known, set(), set(), NOW)) for seed in range(5)}
    assert all(sorted(order) == sorted(known) for order in orders)
    assert len(orders) > 1  # different seeds, different orders
    assert tuple(sorted(known)) not in orders  # not whoever sorts (or answered) first


# ----------------------------------------------------------------- record: backoff
def test_exponential_backoff_with_jitter_and_cap() -> None:
    p = peering(redial_initial_seconds=1.0, redial_max_seconds=5.0)
    for failures, delay in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (5, 5.0), (6, 5.0)]:  # 1, 2, 4, then the cap
        p.record("x", None, NOW)
        assert p.backoff["x"].failures == failures
        assert 0.5 * delay <= p.backoff["x"].until - NOW <= delay
    assert "x" not in p.dialled


def test_jitter_spreads_over_half_to_all_of_the_delay() -> None:
    p = peering(redial_initial_seconds=2.0, redial_max_seconds=2.0)
    for i in range(200):
        p.record(f"p{i}", None, NOW)
    waits = [b.until - NOW for b in p.backoff.values()]
    assert all(1.0 <= w <= 2.0 for w in waits)
    assert min(waits) < 1.1 and max(waits) > 1.9  # spread, not a constant: peers that lost a relay do not stampede
    again = peering(redial_initial_seconds=2.0, redial_max_seconds=2.0)
    for i in range(200):
        again.record(f"p{i}", None, NOW)
    assert [b.until for b in again.backoff.values()] == [b.until for b in p.backoff.values()]  # seeded


def test_success_clears_the_backoff() -> None:
    p = peering(redial_initial_seconds=1.0, redial_max_seconds=60.0)
    for _ in range(4):
        p.record("x", None, NOW)
    assert p.backoff["x"].failures == 4
    p.record("x", "relayed", NOW + 1)
    assert "x" not in p.backoff
    assert p.dialled == {"x": "relayed"}
    p.record("x", None, NOW + 2)  # a later failure starts over at the initial delay
    assert p.backoff["x"].failures == 1
    assert 0.5 <= p.backoff["x"].until - (NOW + 2) <= 1.0


def test_a_failed_peer_is_not_a_candidate_until_its_backoff_ends() -> None:
    p = peering(target_peers=8, redial_initial_seconds=4.0, redial_max_seconds=60.0)
    known = {"x": [tcp("10.0.0.1")]}
    p.record("x", None, NOW)
    until = p.backoff["x"].until
    assert NOW + 2.0 <= until <= NOW + 4.0
    assert p.candidates(known, set(), set(), until - 0.001) == []
    assert p.candidates(known, set(), set(), until) == ["x"]


def test_run_dials_candidates_and_records_outcomes() -> None:
    p = peering(target_peers=4, redial_initial_seconds=60.0, redial_max_seconds=60.0, peering_interval=0.01)
    known = {"down": [tcp("10.0.1.1")], "up": [circuit("up")]}
    connected: set[str] = set()
    dialled: list[str] = []
    passes = 0

    def table() -> dict[str, list[str]]:
        nonlocal passes
        passes += 1
        return known

    async def dial(peer: str, addrs: Sequence[str]) -> str | None:
        dialled.append(peer)
        assert list(addrs) == known[peer]
        if peer == "up":
            connected.add(peer)
            return "relayed"
        return None

    async def main() -> None:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(p.run, table, lambda: set(connected), set, dial)
                while passes < 5:
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()

    trio.run(main)
    assert sorted(dialled) == ["down", "up"]  # once each: "down" backs off 30-60 s, "up" is connected
    assert p.dialled == {"up": "relayed"}
    assert p.backoff["down"].failures == 1


# ----------------------------------------------------------------- per-IP limits
def test_per_ip_limiter_caps_each_address() -> None:
    limiter = PerIPLimiter(2)
    assert limiter.acquire("203.0.113.5") and limiter.acquire("203.0.113.5")
    assert not limiter.acquire("203.0.113.5")
    assert limiter.refused == 1
    assert not limiter.allow("203.0.113.5")  # the resource manager's check: a refusal too
    assert limiter.refused == 2
    assert limiter.acquire("203.0.113.6")  # another address has its own slots
    assert limiter.acquire("2001:db8::1") and limiter.acquire("2001:db8::1")
    assert not limiter.acquire("2001:db8::1")
    assert limiter.refused == 3
    limiter.release("203.0.113.5")  # a connection closed: its slot is free again
    assert limiter.allow("203.0.113.5")
    assert limiter.acquire("203.0.113.5")
    assert not limiter.acquire("203.0.113.5")
    assert limiter.refused == 4


@pytest.mark.parametrize("ip", ["127.0.0.1", "127.0.0.2", "::1"])
def test_loopback_is_exempt(ip: str) -> None:
    limiter = PerIPLimiter(1)
    assert all(limiter.acquire(ip) for _ in range(10))
    assert limiter.allow(ip)
    assert limiter.refused == 0
    limiter.release(ip)
    assert limiter.acquire("203.0.113.5")
    assert not limiter.acquire("203.0.113.5")  # the cap still holds for everyone else


def admit(manager: Any, peer: str, ip: str) -> Any:
    """A connection's admission as py-libp2p 0.8.1's swarm does it: a pre-upgrade scope (no peer id yet), then the
    connection's own, then the first is released; both count while the second is taken. The held scope or None."""
    pre = manager.open_connection(None, endpoint_ip=ip)
    if pre is None:
        return None
    scope = manager.open_connection(peer, endpoint_ip=ip)
    pre.close()
    return scope


def test_resource_manager_bounds_per_ip_and_in_total() -> None:
    manager = resource_manager(max_peers=4, max_per_ip=2)
    limiter = manager.cidr_limiter
    assert isinstance(limiter, PerIPLimiter)
    ip = "203.0.113.5"
    held = [admit(manager, peer, ip) for peer in ("p1", "p2", "p3")]
    assert [scope is not None for scope in held] == [True, True, False]  # max_per_ip from one IP, not one fewer
    assert limiter.refused == 1  # the third, refused and counted
    held[0].close()  # a connection closed: its slot is free again
    fourth = admit(manager, "p4", ip)
    assert fourth is not None
    assert admit(manager, "p5", ip) is None
    assert limiter.refused == 2
    # Loopback is exempt from the per-IP cap, not from max_peers: 2 held, 2 more fit.
    assert [admit(manager, p, "127.0.0.1") is not None for p in ("l1", "l2", "l3")] == [True, True, False]
    assert limiter.refused == 2
    fourth.close()
    assert admit(manager, "l3", "127.0.0.1") is not None


FAST = {"bootstrap_backoff_initial": 0.05, "bootstrap_backoff_max": 0.2, "shutdown_flush_timeout": 0.5}


async def admitted_by(server: GossipNode, stack: AsyncExitStack) -> bool:
    """Connect a fresh host to ``server``; whether the server keeps the connection. A refusal before the handshake
    fails the dial; one after it (the connection's own scope) closes a connection the dialler thought it had."""
    listen = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
    key_pair = create_new_key_pair()
    client: Any = libp2p.new_host(
        key_pair=key_pair, listen_addrs=listen, muxer_preference="YAMUX", sec_opt=noise_only(key_pair)
    )
    await stack.enter_async_context(client.run(listen_addrs=listen))
    try:
        await client.connect(info_from_p2p_addr(Multiaddr(server.local_addrs()[0])))
    except SwarmException:
        return False
    server_id, client_id = ID.from_base58(server.peer_id), client.get_id()
    while True:
        if client_id in server._host.get_network().connections:
            return True
        if server_id not in client.get_network().connections:
            return False
        await trio.sleep(0.01)


def test_the_swarm_admits_max_per_ip_connections_from_one_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        with trio.fail_after(30):
            config = TraversalConfig(max_per_ip=2, use_relays=False, hole_punching=False)
            async with AsyncExitStack() as stack:
                server = await stack.enter_async_context(
                    GossipNode.open(GossipConfig(**FAST), create_new_key_pair(), config)
                )
                limiter = server._host.get_network()._resource_manager.cidr_limiter
                assert isinstance(limiter, PerIPLimiter)
                # Every peer here is on 127.0.0.1, which is exempt: count it like any one public address.
                monkeypatch.setattr(limiter, "_key", lambda ip: ip)
                assert [await admitted_by(server, stack) for _ in range(3)] == [True, True, False]
                assert limiter.refused == 1

    trio.run(main)


def test_the_swarm_admits_max_peers_connections() -> None:
    async def main() -> None:
        with trio.fail_after(30):
            config = TraversalConfig(max_peers=2, target_peers=2, use_relays=False, hole_punching=False)
            async with AsyncExitStack() as stack:
                server = await stack.enter_async_context(
                    GossipNode.open(GossipConfig(**FAST), create_new_key_pair(), config)
                )
                assert [await admitted_by(server, stack) for _ in range(3)] == [True, True, False]

    trio.run(main)
