"""Sender records checked once: py-libp2p 0.8.1 puts the sender's signed peer record in every gossipsub RPC, and
checks its Ed25519 signature on every RPC it receives, twice (the pubsub read loop, then gossipsub's
``handle_rpc``). The record changes only when the sender's addresses do, so a node checked the same bytes from
the same peer hundreds of times a second: at 30 nodes on 2 cores it was a tenth of the process's CPU.

:func:`consume_once` is py-libp2p's ``maybe_consume_signed_record`` with a per-host memory of the (peer, record)
pairs it accepted: the same bytes from the same peer are accepted without a second check (they verified, and the
peer store already holds them); anything else, a new record or another peer's, is checked as before. A record
that failed is not remembered, so it fails again. Bounded (``MAX_REMEMBERED`` per host, least recent first)."""

from __future__ import annotations

import hashlib
import weakref
from collections import OrderedDict
from typing import Any

import libp2p.pubsub.gossipsub as libp2p_gossipsub
from libp2p.pubsub.utils import maybe_consume_signed_record

MAX_REMEMBERED = 1024
_ACCEPTED: weakref.WeakKeyDictionary[Any, OrderedDict[tuple[bytes, bytes], None]] = weakref.WeakKeyDictionary()


def consume_once(msg: Any, host: Any, peer_id: Any) -> bool:
    if not msg.HasField("senderRecord"):
        return bool(maybe_consume_signed_record(msg, host, peer_id))
    seen = _ACCEPTED.setdefault(host, OrderedDict())
    key = (peer_id.to_bytes(), hashlib.sha256(msg.senderRecord).digest())
    if key in seen:
        seen.move_to_end(key)
        return True
    if not maybe_consume_signed_record(msg, host, peer_id):
        return False
    seen[key] = None
    while len(seen) > MAX_REMEMBERED:
        seen.popitem(last=False)
    return True


def install() -> None:
    """Rebind the name in gossipsub's module (its ``handle_rpc``); the pubsub read loop gets it through
    :data:`dgrpo.net.pubsub._READ_LOOP`'s globals."""
    libp2p_gossipsub.maybe_consume_signed_record = consume_once  # type: ignore[attr-defined]
