"""The gossip node's defences against one bad peer: publishing never paced by a frozen peer's queue, and no
connection without noise."""

from __future__ import annotations

import types
from collections import Counter

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.queue_watch import QueueWatch

FAST_DIAL = {"bootstrap_backoff_initial": 0.05, "bootstrap_backoff_max": 0.2, "shutdown_flush_timeout": 1.0}


def config() -> GossipConfig:
    return GossipConfig(**FAST_DIAL)


def run(test: object) -> None:
    async def main() -> None:
        with trio.fail_after(30):
            await test()  # type: ignore[operator]

    trio.run(main)


class _Queue:
    """An outbound queue of a given length (py-libp2p's RpcQueue only matters by its length here)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


def test_publish_stops_waiting_for_a_peer_whose_queue_does_not_move() -> None:
    """Before: a SIGSTOPped peer's full queue made every publish wait ``pacing_timeout`` (10 s), and honest rounds
    took 17.8 s instead of ~1 s. Now a long queue that does not shrink for ``stuck_after`` is not waited for
    (py-libp2p drops what does not fit, counted), while a long queue that drains still paces publishing."""
    frozen, slow = ID(b"frozen-peer-id"), ID(b"slow-peer-id")
    queues = {frozen: _Queue(32), slow: _Queue(0)}
    node = GossipNode.__new__(GossipNode)
    node.config = GossipConfig(stuck_after=0.3, pacing_timeout=5.0)
    node._pubsub = types.SimpleNamespace(peer_queues=queues, peers={frozen: None, slow: None})
    node._queue_watch = QueueWatch(node.config.max_outbound_queue, node.config.stuck_after)
    node._counts = Counter()

    async def main() -> tuple[float, float]:
        t0 = trio.current_time()
        await node._pace()  # the frozen queue never moves: waited for stuck_after only
        first = trio.current_time() - t0
        queues[slow].length = 20  # a working peer with a backlog: it drains, and publish waits for it

        async def drain() -> None:
            while queues[slow].length > 0:
                await trio.sleep(0.05)
                queues[slow].length -= 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            t1 = trio.current_time()
            await node._pace()
            second = trio.current_time() - t1
        return first, second

    first, second = trio.run(main)
    assert 0.3 <= first < 1.0, first  # not pacing_timeout (5 s)
    assert node.stuck_peers() == {frozen.to_base58()}
    assert node._queue_watch.stuck_count == 1 and node._counts["pacing_timeouts"] == 0
    assert second >= 0.5, second  # waited until the slow peer's queue was short (12 x 0.05 s)
    assert queues[slow].length <= node.config.max_outbound_queue


def test_a_peer_offering_only_plaintext_cannot_connect() -> None:
    """py-libp2p offers noise, TLS, secio and plaintext unless told otherwise; a node offers noise only, so a
    peer cannot get an unauthenticated connection by choosing plaintext."""
    import libp2p
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport
    from multiaddr import Multiaddr

    async def main() -> None:
        async with GossipNode.open(config(), create_new_key_pair()) as node:
            target = info_from_p2p_addr(Multiaddr(node.listen_addrs()[0]))
            for secure in ("plaintext", "noise"):
                pair = create_new_key_pair()
                sec_opt = {TProtocol(PLAINTEXT_PROTOCOL_ID): InsecureTransport(pair)} if secure == "plaintext" else None
                listen = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
                host = libp2p.new_host(key_pair=pair, listen_addrs=listen, muxer_preference="YAMUX", sec_opt=sec_opt)
                async with host.run(listen_addrs=listen):
                    connected = True
                    try:
                        with trio.fail_after(10):
                            await host.connect(target)
                    except Exception:
                        connected = False
                    assert connected == (secure == "noise"), secure
                    await host.close()

    run(main)
