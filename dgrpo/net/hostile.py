"""What a hostile peer puts on the wire, bypassing :meth:`GossipNode.publish`'s checks: for the tests and
benchmarks that check a node survives it (an oversize RPC, a signed message too big for the protocol)."""

from __future__ import annotations

from contextlib import suppress

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX

from dgrpo.net.gossip import GossipNode


def signed_message(node: GossipNode, topic: str, data: bytes) -> rpc_pb2.Message:
    """A pubsub message from ``node``, signed as py-libp2p's publish signs it (strict signing), of any size."""
    pubsub = node._pubsub
    msg = rpc_pb2.Message(data=data, topicIDs=[topic], from_id=pubsub.my_id.to_bytes(), seqno=pubsub._next_seqno())
    msg.signature = pubsub.sign_key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
    msg.key = node._host.get_public_key().serialize()
    return msg


async def send_raw_rpc(node: GossipNode, peer_id: str, rpc: rpc_pb2.RPC, timeout: float = 10.0) -> bool:
    """Write ``rpc`` on ``node``'s pubsub stream to ``peer_id``, whatever its size: py-libp2p's ``write_msg``
    (which takes our per-stream lock) checks no size; its outbound queue, which drops RPCs over 1 MiB, is
    bypassed. False when there is no stream or the write fails (the receiver resets the stream of an RPC over
    its limit)."""
    stream = node._pubsub.peers.get(ID.from_base58(peer_id))
    if stream is None:
        return False
    with trio.move_on_after(timeout), suppress(Exception):
        return bool(await node._pubsub.write_msg(stream, rpc))
    return False
