"""py-libp2p 0.8.1 dials peers by itself (:mod:`dgrpo.net.own_dialers`); a dgrpo node does not. Real hosts on
127.0.0.1: a peer whose address sits in the peer store is dialled by a plain py-libp2p host's auto-connector,
not by a :class:`~dgrpo.net.gossip.GossipNode`'s."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import libp2p
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.reachability import strip_p2p
from dgrpo.net.traversal_config import TraversalConfig

QUIET = TraversalConfig(use_relays=False, hole_punching=False, reachability_interval=3600.0)


@asynccontextmanager
async def target() -> AsyncIterator[GossipNode]:
    """A listening node nobody has dialled."""
    async with GossipNode.open(GossipConfig(shutdown_flush_timeout=0.0), create_new_key_pair(), QUIET) as node:
        yield node


def remember(host: libp2p.abc.IHost, node: GossipNode) -> ID:
    """Put ``node``'s address in ``host``'s peer store, as identify, mDNS or a PRUNE would."""
    peer = ID.from_base58(node.peer_id)
    host.get_peerstore().add_addrs(peer, [strip_p2p(Multiaddr(node.local_addrs()[0]))], 600)
    return peer


def test_a_plain_libp2p_host_dials_its_peer_store_and_a_dgrpo_node_does_not() -> None:
    async def main() -> None:
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                other = await stack.enter_async_context(target())
                # py-libp2p as it comes: the auto-connector dials what the peer store holds
                plain = libp2p.new_host(key_pair=create_new_key_pair(), muxer_preference="YAMUX")
                await stack.enter_async_context(plain.run(listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")]))
                peer = remember(plain, other)
                await plain.get_network().auto_connector.maybe_connect()
                with trio.move_on_after(10):
                    while peer not in plain.get_connected_peers():
                        await trio.sleep(0.05)
                assert peer in plain.get_connected_peers(), "py-libp2p's auto-connector dialled it"

                # a dgrpo node: nothing but its peering loop dials (and it has no heartbeat naming that peer)
                ours = await stack.enter_async_context(
                    GossipNode.open(GossipConfig(shutdown_flush_timeout=0.0), create_new_key_pair(), QUIET)
                )
                fresh = await stack.enter_async_context(target())
                peer = remember(ours._host, fresh)
                await ours._host.get_network().auto_connector.maybe_connect()
                await trio.sleep(2.0)
                assert peer not in ours._host.get_connected_peers()
                assert ours._router.px_peers_count == 0  # a PRUNE's peer records are not dialled either

    trio.run(main)
