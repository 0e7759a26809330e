"""Read receipts (``ReceiptGossipSub``): what a node waits for before it closes its connections."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V12
from libp2p.pubsub.pb import rpc_pb2

from dgrpo.net.pubsub import RECEIPT_TOPIC, ReceiptGossipSub

PEER = ID(b"\x00\x24" + bytes(range(36)))
JOINED = "/dgrpo/r/rollouts/1"


def answered_by(answers: Callable[[Any], bool]) -> list[rpc_pb2.ControlMessage]:
    """Run one read receipt against a peer that answers IHAVEs with ``answers(ihave) -> bool``; the control
    messages sent. Fails (trio.TooSlowError) when the receipt never comes."""
    router = ReceiptGossipSub(protocols=[PROTOCOL_ID_V12], degree=6, degree_low=4, degree_high=12)
    router.pubsub = types.SimpleNamespace(peer_topics={JOINED: {PEER}, "/dgrpo/r/zzz/1": {PEER}, "/other": set()})
    sent: list[rpc_pb2.ControlMessage] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def emit_control_message(control: rpc_pb2.ControlMessage, to_peer: ID) -> None:
                sent.append(control)
                wanted = [m for ihave in control.ihave if answers(ihave) for m in ihave.messageIDs]
                if wanted:  # the peer reads the IHAVE and asks for the unknown id
                    iwant = rpc_pb2.ControlIWant(messageIDs=wanted[:1])
                    nursery.start_soon(router.handle_iwant, iwant, to_peer)

            router.emit_control_message = emit_control_message  # type: ignore[method-assign]
            with trio.fail_after(5):
                await router.read_receipt(PEER)

    trio.run(main)
    return sent


def test_a_peer_that_answers_ihave_only_for_topics_it_joined_gives_a_receipt() -> None:
    """go-libp2p-pubsub and js-libp2p's gossipsub ignore an IHAVE for a topic outside their mesh: asked only on
    the receipt topic, such a peer never answered, and every shutdown waited the whole flush timeout."""
    sent = answered_by(lambda ihave: ihave.topicID == JOINED)
    (control,) = sent
    assert [ihave.topicID for ihave in control.ihave] == [RECEIPT_TOPIC, JOINED]  # the first topic it joined
    assert control.ihave[0].messageIDs == control.ihave[1].messageIDs  # one token


def test_py_libp2p_answers_on_the_receipt_topic() -> None:
    sent = answered_by(lambda ihave: ihave.topicID == RECEIPT_TOPIC)
    assert len(sent) == 1 and sent[0].ihave[0].messageIDs[0][:1] == b"\xff"
