"""py-libp2p checks the signed peer record in every gossipsub RPC; dgrpo checks each (peer, record) once
(dgrpo/net/sender_records.py). What was accepted before is accepted without a second check; a forged, altered or
borrowed record is still refused, every time."""

from __future__ import annotations

from typing import Any

import libp2p.pubsub.gossipsub as libp2p_gossipsub
import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerstore import PeerStore, create_signed_peer_record
from libp2p.pubsub.pb import rpc_pb2
from multiaddr import Multiaddr

import dgrpo.net.pubsub as dgrpo_pubsub
from dgrpo.net import sender_records
from dgrpo.net.sender_records import consume_once


class Host:
    def __init__(self) -> None:
        self.store = PeerStore()

    def get_peerstore(self) -> PeerStore:
        return self.store


def record(addr: str = "/ip4/127.0.0.1/tcp/4001") -> tuple[ID, bytes]:
    keys = create_new_key_pair()
    peer = ID.from_pubkey(keys.public_key)
    env = create_signed_peer_record(peer, [Multiaddr(addr)], keys.private_key)
    return peer, env.marshal_envelope()


def rpc(data: bytes) -> Any:
    msg = rpc_pb2.RPC()
    msg.senderRecord = data
    return msg


def test_a_record_is_checked_once_per_host_and_forgeries_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    checks: list[bytes] = []
    real = sender_records.maybe_consume_signed_record

    def counting(msg: Any, host: Any, peer_id: Any) -> bool:
        checks.append(msg.senderRecord)
        return bool(real(msg, host, peer_id))

    monkeypatch.setattr(sender_records, "maybe_consume_signed_record", counting)
    host, other_host = Host(), Host()
    peer, data = record()
    assert all(consume_once(rpc(data), host, peer) for _ in range(5))
    assert len(checks) == 1  # four of five accepted from memory
    assert consume_once(rpc(data), other_host, peer) and len(checks) == 2  # each host its own memory
    forged = bytearray(data)
    forged[-1] ^= 1  # the signature's last byte
    assert not any(consume_once(rpc(bytes(forged)), host, peer) for _ in range(3)) and len(checks) == 5
    stranger, _ = record()
    assert not consume_once(rpc(data), host, stranger)  # peer's record, sent by another peer
    assert not consume_once(rpc(data), host, stranger) and len(checks) == 7
    assert consume_once(rpc_pb2.RPC(), host, peer)  # no record: nothing to check (py-libp2p's rule)


def test_the_cache_is_what_py_libp2p_calls() -> None:
    # Both places that check sender records call ours: gossipsub's handle_rpc and the pubsub read loop.
    assert libp2p_gossipsub.maybe_consume_signed_record is consume_once
    assert dgrpo_pubsub._READ_LOOP.__globals__["maybe_consume_signed_record"] is consume_once
    assert "maybe_consume_signed_record" in dgrpo_pubsub.Pubsub.continuously_read_stream.__code__.co_names
    assert "maybe_consume_signed_record" in libp2p_gossipsub.GossipSub.handle_rpc.__code__.co_names
