"""The libp2p transport with dgrpo's validator: hostile peers are rejected with reasons, then blacklisted."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.p2p import Libp2pTransport
from dgrpo.protocol.envelope import Signer
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import Rollout, SamplingParams
from dgrpo.protocol.nonce import NonceCounter
from dgrpo.protocol.replay import ReplayGuard
from dgrpo.protocol.topics import rollout_topic
from dgrpo.protocol.validator import MessageValidator

RUN = "t"
FAST = {"bootstrap_backoff_initial": 0.05, "bootstrap_backoff_max": 0.2}


def rollout(author: str) -> Rollout:
    return Rollout(
        author=author,
        round=1,
        part=0,
        parts=1,
        prompt_id="arith/10+15",
        prompt="10+15=",
        completions=("5+0+0=5,1+1+0=2>25",),
        model_id="m",
        indices=(0,),
        weights="",
        sampling=SamplingParams(),
        split="horizontal",
    )


@pytest.mark.slow
def test_valid_delivered_hostile_rejected_then_blacklisted(tmp_path: Path) -> None:
    honest_id, rogue_id = Identity.generate(), Identity.generate()

    async def main() -> None:
        async with GossipNode.open(GossipConfig(**FAST), honest_id.to_libp2p_keypair()) as a:
            cfg_b = GossipConfig(bootstrap=tuple(a.listen_addrs()), **FAST)
            async with GossipNode.open(cfg_b, rogue_id.to_libp2p_keypair()) as b, trio.open_nursery() as nursery:
                validator = MessageValidator(RUN, Limits(blacklist_after=3), ReplayGuard(64))
                transport = Libp2pTransport(a, Signer(honest_id, RUN, NonceCounter(tmp_path / "a")), validator, RUN)
                await transport.start(nursery)
                await b.subscribe(rollout_topic(RUN))
                await b.wait_for_mesh(rollout_topic(RUN), 1, timeout=30)
                rogue = Signer(rogue_id, RUN, NonceCounter(tmp_path / "b"))

                good = rogue.sign_rollout(rollout(rogue_id.peer_id))
                await b.publish(rollout_topic(RUN), good)
                with trio.fail_after(30):
                    got = await transport.inbound().receive()
                assert got.author == rogue_id.peer_id and got.completions == ("5+0+0=5,1+1+0=2>25",)

                await b.publish(rollout_topic(RUN), good)  # a replay: rejected, but honest peers cause these too
                forged = bytearray(rogue.sign_rollout(rollout(rogue_id.peer_id)))
                forged[-70] ^= 0x01  # inside the body: the signature no longer matches
                for bad in (b"\x00garbage", bytes(forged), b"\x93\x01\x02", b"\xc1"):
                    await b.publish(rollout_topic(RUN), bad)
                with trio.fail_after(30):
                    while rogue_id.peer_id not in a.blacklisted():
                        await trio.sleep(0.05)
                stats = validator.statistics()
                assert stats.rejected_by_reason["replay"] == 1
                assert stats.rejected_by_reason["malformed"] >= 2
                assert stats.rejected_by_peer[rogue_id.peer_id] >= 4
                assert transport.inbound().statistics().current_buffer_used == 0  # nothing hostile delivered
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_oversize_rpcs_are_counted_with_the_validators_reasons_and_lead_to_blacklisting(tmp_path: Path) -> None:
    # One signed-but-invalid message (a validator penalty) and two RPCs over the transport's cap
    # (oversize_rpc) reach blacklist_after=3 together: the transport's rejections count towards blacklisting.
    from libp2p.pubsub.pb import rpc_pb2

    from dgrpo.net.hostile import send_raw_rpc, signed_message

    honest_id, rogue_id = Identity.generate(), Identity.generate()
    topic = rollout_topic(RUN)

    async def main() -> None:
        async with GossipNode.open(GossipConfig(**FAST), honest_id.to_libp2p_keypair()) as a:
            cfg_b = GossipConfig(bootstrap=tuple(a.listen_addrs()), **FAST)
            async with GossipNode.open(cfg_b, rogue_id.to_libp2p_keypair()) as b, trio.open_nursery() as nursery:
                validator = MessageValidator(RUN, Limits(blacklist_after=3), ReplayGuard(64))
                transport = Libp2pTransport(a, Signer(honest_id, RUN, NonceCounter(tmp_path / "a")), validator, RUN)
                await transport.start(nursery)
                await b.subscribe(topic)
                await b.wait_for_mesh(topic, 1, timeout=30)
                await b.publish(topic, b"\xc1")  # malformed: one validator penalty
                huge = rpc_pb2.RPC(publish=[signed_message(b, topic, b"x" * (2 * 1024 * 1024))])
                with trio.fail_after(30):
                    while a.statistics().oversize_rpc < 2:
                        # b's stream to a was reset; b finds out at its next write, then opens a new one
                        await send_raw_rpc(b, a.peer_id, huge)
                        with trio.move_on_after(1.0):
                            while a.statistics().oversize_rpc < 2:
                                await trio.sleep(0.02)
                    while rogue_id.peer_id not in a.blacklisted():
                        await trio.sleep(0.05)
                stats = transport.statistics()
                n = a.statistics().oversize_rpc  # 2, or 3 if a send we retried had only been slow
                assert stats.rejected_by_reason == {"malformed": 1, "oversize_rpc": n} and n >= 2
                assert stats.rejected_by_peer == {rogue_id.peer_id: 1 + n}
                assert stats.rejected_by_peer_reason == {rogue_id.peer_id: {"malformed": 1, "oversize_rpc": n}}
                nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.slow
def test_rollouts_beyond_the_authors_plan_are_refused_inside_gossipsub_and_not_forwarded(tmp_path: Path) -> None:
    """A flooder's surplus must not be forwarded: every node used to forward it all (the quota was checked only
    at the round), its outbound queues filled and py-libp2p dropped honest rollouts there. Chain A - B - C: B
    passes on to C only the first ``rollout_quota`` rollouts of A's round, counts the rest, and blacklists A."""
    ids = [Identity.generate() for _ in range(3)]

    async def main() -> None:
        topic = rollout_topic(RUN)
        async with GossipNode.open(GossipConfig(**FAST), ids[1].to_libp2p_keypair()) as b:
            near = GossipConfig(bootstrap=tuple(b.listen_addrs()), **FAST)
            async with (
                GossipNode.open(near, ids[0].to_libp2p_keypair()) as a,
                GossipNode.open(near, ids[2].to_libp2p_keypair()) as c,
                trio.open_nursery() as nursery,
            ):
                validator = MessageValidator(RUN, Limits(blacklist_after=5), ReplayGuard(64))
                transport = Libp2pTransport(b, Signer(ids[1], RUN, NonceCounter(tmp_path / "b")), validator, RUN)
                transport.rollout_quota = 3
                await transport.start(nursery)
                at_c = await c.subscribe(topic)
                await a.subscribe(topic)
                await a.wait_for_mesh(topic, 1, timeout=30)
                await c.wait_for_mesh(topic, 1, timeout=30)
                flooder = Signer(ids[0], RUN, NonceCounter(tmp_path / "a"))
                for part in range(12):
                    r = rollout(ids[0].peer_id).model_copy(update={"part": part, "parts": 100})
                    await a.publish(topic, flooder.sign_rollout(r))
                with trio.fail_after(30):
                    while ids[0].peer_id not in b.blacklisted():
                        await trio.sleep(0.05)
                await trio.sleep(0.5)
                delivered = []
                while True:
                    try:
                        delivered.append(transport.inbound().receive_nowait())
                    except trio.WouldBlock:
                        break
                forwarded = []
                while True:
                    try:
                        forwarded.append(at_c.receive_nowait())
                    except trio.WouldBlock:
                        break
                assert len(delivered) == 3 and len(forwarded) == 3, (len(delivered), len(forwarded))
                stats = transport.statistics()
                assert stats.rejected_by_reason["over_quota"] == 5  # then blacklisted: the rest never validated
                assert stats.rejected_by_peer_reason[ids[0].peer_id]["over_quota"] == 5
                assert stats.accepted == 3
                nursery.cancel_scope.cancel()

    trio.run(main)
