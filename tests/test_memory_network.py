"""The in-memory network of simulations carries the real wire format: signed envelopes, checked by each
receiver's own validator and replay window, as between daemons."""

from __future__ import annotations

import pytest
import trio

from dgrpo.errors import DgrpoError
from dgrpo.net.memory import InMemoryNetwork
from dgrpo.protocol.envelope import Signer
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import DEFAULT_SAMPLING, Rollout
from dgrpo.protocol.nonce import VolatileNonceCounter


def rollout(author: str, completions: tuple[str, ...] = ("1+1=2",)) -> Rollout:
    return Rollout(
        author=author,
        round=1,
        part=0,
        parts=1,
        prompt_id="arith/1/1",
        prompt="1+1=",
        completions=completions,
        indices=tuple(range(len(completions))),
        model_id="m",
        weights="",
        sampling=DEFAULT_SAMPLING,
        split="horizontal",
    )


def test_messages_are_signed_validated_and_named() -> None:
    network = InMemoryNetwork("run")
    a, b, c = (network.join(f"node-{i}") for i in range(3))

    async def main() -> None:
        await a.publish(rollout("node-0"))
        for receiver in (b, c):
            got = receiver.inbound().receive_nowait()
            assert got == rollout("node-0")  # the same rollout, rebuilt from the decoded envelope
        with pytest.raises(trio.WouldBlock):
            a.inbound().receive_nowait()  # never back to the sender

    trio.run(main)
    assert b.statistics().accepted == c.statistics().accepted == 1


def test_replays_forgeries_and_junk_are_rejected_with_a_reason() -> None:
    network = InMemoryNetwork("run")
    a, b = network.join("node-0"), network.join("node-1")
    data = a.signer.sign_rollout(rollout("node-0"))
    b.receive(data)
    b.receive(data)  # the same message again
    forged = bytearray(data)
    forged[-1] ^= 1  # the signature's last byte
    b.receive(bytes(forged))
    b.receive(b"junk")
    # An outsider signing with its own key cannot speak for node-0; it is named by its libp2p PeerId.
    outsider = Identity.generate()
    signer = Signer(outsider, "run", VolatileNonceCounter(), name=outsider.peer_id)
    b.receive(signer.sign_rollout(rollout(outsider.peer_id)))
    stats = b.statistics()
    assert stats.accepted == 2
    assert stats.rejected_by_reason == {"replay": 1, "bad_signature": 1, "malformed": 1}
    assert stats.rejected_by_peer["node-0"] == 2  # replay and forgery are attributed to the claimed author
    received = [b.inbound().receive_nowait().author for _ in range(2)]
    assert received == ["node-0", outsider.peer_id]


def test_the_limits_hold_on_the_in_memory_wire() -> None:
    network = InMemoryNetwork("run", Limits(max_completions=2))
    a = network.join("node-0")
    with pytest.raises(DgrpoError):
        a.signer.sign_rollout(rollout("node-1"))  # a node signs only as itself
    b = network.join("node-1")
    network.deliver("node-0", a.signer.sign_rollout(rollout("node-0", ("x",) * 3)))
    assert b.statistics().rejected_by_reason == {"too_many_completions": 1}
