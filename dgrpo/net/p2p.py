"""The libp2p gossipsub transport: dgrpo's signed envelopes over the rollout and control topics.

Every received message is checked by :class:`dgrpo.protocol.validator.MessageValidator` inside gossipsub's
topic validator, so an invalid message is neither delivered nor forwarded (libp2p notes). The envelope the
validator decoded is kept by message hash and handed to the subscriber, so a message is decoded and checked
exactly once. Heartbeats on the control topic tell which peers are active and which round they are in.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

import trio

from dgrpo.net.gossip import OVERSIZE_RPC, GossipMessage, GossipNode, drained
from dgrpo.net.transport import DROP_REASONS, Transport, TransportStatistics
from dgrpo.protocol.counting import PeerReasons, merge
from dgrpo.protocol.envelope import Envelope, HeartbeatBody, RolloutBody, Signer, to_rollout
from dgrpo.protocol.identity import peer_id_from_public_bytes
from dgrpo.protocol.messages import Rollout
from dgrpo.protocol.topics import control_topic, rollout_topic
from dgrpo.protocol.validator import UNKNOWN_PEER, MessageValidator

log = logging.getLogger(__name__)
OVER_QUOTA = "over_quota"  # a rollout beyond its author's plan for the round, refused inside gossipsub
FUTURE_ROUND = "future_round"  # a rollout for a round nobody may publish yet, refused inside gossipsub
REFUSED = (OVER_QUOTA, FUTURE_ROUND)  # what the transport refuses of valid messages, each a penalty
MAX_QUOTA_KEYS = 65_536  # (author, round) pairs remembered for the quota, oldest forgotten first


@dataclass(frozen=True)
class PeerInfo:
    peer_id: str
    round: int
    rounds_done: int
    status: str
    last_seen: float
    listen_addrs: tuple[str, ...] = ()  # as announced: where to dial it for a stream (federated state sync)
    # The state it announced (weights sync): the round it last completed, the root of its state after it, and
    # the base weights that state descends from; 0 and empty when it announced none.
    state_round: int = 0
    state_root: bytes = b""
    state_base: bytes = b""


class Libp2pTransport(Transport):
    def __init__(
        self,
        gossip: GossipNode,
        signer: Signer,
        validator: MessageValidator,
        run_id: str,
        peer_timeout: float = 20.0,
        inbound_size: int = 4096,
    ) -> None:
        self.gossip = gossip
        self.signer = signer
        self.validator = validator
        self.peer_id = gossip.peer_id
        self.peer_timeout = peer_timeout
        self.topic = rollout_topic(run_id)
        self.control = control_topic(run_id)
        self._send, self._receive = trio.open_memory_channel[Rollout](inbound_size)
        self._validated: OrderedDict[bytes, Envelope] = OrderedDict()
        self._peers: dict[str, PeerInfo] = {}
        self._topic_out: dict[str, trio.MemorySendChannel[Envelope]] = {}  # open_topic's hand-over channels
        self.dropped_inbound = 0
        # gossipsub validators are synchronous; blacklisting (which disconnects) is async, so it is queued.
        self._to_blacklist, self._blacklist_queue = trio.open_memory_channel[str](1024)
        self._blacklisting: set[str] = set()
        # The parts of each (author, round) let through so far (``_within_quota``); None: no quota (no plan).
        self.rollout_quota: int | None = None
        self._per_round: OrderedDict[tuple[str, int], set[int]] = OrderedDict()
        self._over_quota = PeerReasons(validator.limits.max_tracked_peers)  # by peer: REFUSED reasons
        self._refused: Counter[str] = Counter()  # by reason, never forgotten
        # The latest round a rollout may be for (the daemon sets it from the network's round); None: unknown yet
        # (a node that has not heard the network since it started or woke up), so no bound.
        self.round_horizon: int | None = None
        self.received: Counter[str] = Counter()  # messages the validator hook checked, by kind
        self.receive_cpu_seconds = 0.0  # CPU time (this thread's) those checks took

    # ----------------------------------------------------------------- validation (runs inside gossipsub)
    def _validator(self, kind: str) -> Any:
        def check(data: bytes, source: str, forwarder: str | None) -> bool:
            c0 = time.thread_time()
            try:
                return verify(data, source)
            finally:
                self.receive_cpu_seconds += time.thread_time() - c0
                self.received[kind] += 1

        def verify(data: bytes, source: str) -> bool:
            verdict = self.validator.validate(data, source_peer=source, expected_kind=kind)
            if not verdict.ok or verdict.envelope is None:
                if verdict.peer and verdict.peer != UNKNOWN_PEER:
                    self._blacklist_if_penalised(verdict.peer, verdict.reason or "")
                return False
            if kind == "rollout" and not self._within_quota(verdict.envelope, verdict.peer or source):
                return False
            self._validated[hashlib.sha256(data).digest()] = verdict.envelope
            while len(self._validated) > 8192:  # delivered messages are popped; this bounds undelivered ones
                self._validated.popitem(last=False)
            return True

        return check

    def _refuse(self, author: str, reason: str) -> bool:
        self._over_quota.add(author, reason)
        self._refused[reason] += 1
        self._blacklist_if_penalised(author, reason)
        return False

    def _within_quota(self, env: Envelope, author: str) -> bool:
        """At most ``rollout_quota`` (the plan's parts) rollouts per author and round pass gossipsub's validation,
        one per part number: each takes its part's slot. Checked here, not only on arrival at the round: a refused
        message is not forwarded, so one flooder's surplus never fills the honest peers' outbound queues (a flood
        forwarded by every node made py-libp2p drop honest rollouts there, and rounds closed at their deadline).
        A second message for a part whose slot is taken, or a new part once ``rollout_quota`` are taken, is
        ``over_quota``: a penalty. Slots are per part, not a count, so that a refused copy takes none.

        Before the quota, the horizon: a rollout for a round past ``round_horizon`` is one nobody may publish yet
        (the network's round plus the rounds a receiver keeps ahead, plus slack for heartbeats that lag rollouts),
        refused as ``future_round``, a penalty too. Without it a flooder spreading its messages over rounds to
        come (8 a round, within each round's quota) was never cut off: each message passed, was forwarded by
        every node and dropped on arrival (``future_round``, no evidence), and honest rounds ran 2.5-3.5x slower."""
        if not isinstance(env.body, RolloutBody):
            return True
        if self.round_horizon is not None and env.round > self.round_horizon:
            return self._refuse(author, FUTURE_ROUND)
        if self.rollout_quota is None:
            return True
        key = (author, env.round)
        held = self._per_round.setdefault(key, set())
        self._per_round.move_to_end(key)
        if env.body.part in held or len(held) >= self.rollout_quota:
            return self._refuse(author, OVER_QUOTA)
        held.add(env.body.part)
        while len(self._per_round) > MAX_QUOTA_KEYS:
            self._per_round.popitem(last=False)
        return True

    def release_quota(self, rollout: Rollout, reason: str) -> None:
        """The receive stage did not keep ``rollout`` (``reason``): it gives its slot back. A message that is
        rejected must not use up its author's quota: a rollout that arrived for a round the receiver could not
        hold yet (``future_round``) took the slot of that part, and the author's honest message for it was later
        refused as ``over_quota``, its round ``incomplete`` and every node waited for the deadline. A
        ``duplicate_part`` holds no slot of its own (the slot is the kept first copy's) and gives nothing back."""
        if reason == "duplicate_part":
            return
        held = self._per_round.get((rollout.author, rollout.round))
        if held is not None:
            held.discard(rollout.part)

    def _blacklist_if_penalised(self, peer: str, reason: str) -> None:
        """Blacklist ``peer`` once its penalised rejections, the validator's and the gossip layer's (an RPC over
        the size cap, which publish never sends: no honest peer earns one), reach ``limits.blacklist_after``."""
        if peer == self.peer_id or peer in self._blacklisting:
            return
        penalties = self.validator.penalties(peer) + self.gossip.rejections_of(peer) + self._over_quota.total(peer)
        # should_blacklist: also a single equivocation, which proves misbehaviour on its own.
        if penalties < self.validator.limits.blacklist_after and not self.validator.should_blacklist(peer):
            return
        log.warning("blacklisting %s after repeated invalid messages (%s)", peer, reason)
        self._blacklisting.add(peer)
        self._to_blacklist.send_nowait(peer)

    async def start(self, nursery: trio.Nursery) -> None:
        self.gossip.on_rejection(self._blacklist_if_penalised)
        self.gossip.set_validator(self.topic, self._validator("rollout"))
        self.gossip.set_validator(self.control, self._validator("heartbeat"))
        rollouts = await self.gossip.subscribe(self.topic)
        control = await self.gossip.subscribe(self.control)
        nursery.start_soon(self._drain_rollouts, rollouts)
        nursery.start_soon(self._drain_control, control)
        nursery.start_soon(self._apply_blacklist)

    def blacklist(self, peer: str, reason: str) -> None:
        """Blacklist ``peer`` at the gossipsub layer (its messages are dropped before validation and it is
        disconnected); used by the reputation policy when the defenses keep rejecting its completions."""
        if peer == self.peer_id or peer in self._blacklisting:
            return
        log.warning("blacklisting %s (%s)", peer, reason)
        self._blacklisting.add(peer)
        self._to_blacklist.send_nowait(peer)

    async def _apply_blacklist(self) -> None:
        async for peer in self._blacklist_queue:
            try:
                await self.gossip.blacklist(peer)
            except Exception as exc:  # a failed disconnect leaves the blacklist entry in place
                log.warning("disconnecting blacklisted %s failed: %s", peer, exc)

    def _envelope(self, msg: GossipMessage) -> Envelope | None:
        if msg.source == self.peer_id:
            return None  # our own publish, echoed back by gossipsub
        return self._validated.pop(hashlib.sha256(msg.data).digest(), None)

    async def _drain_rollouts(self, channel: trio.MemoryReceiveChannel[GossipMessage]) -> None:
        async for msg in channel:
            env = self._envelope(msg)
            if env is None:
                continue
            try:
                self._send.send_nowait(to_rollout(env))
            except trio.WouldBlock:
                self.dropped_inbound += 1

    async def open_topic(
        self, nursery: trio.Nursery, topic: str, kind: str, size: int = 4096
    ) -> trio.MemoryReceiveChannel[Envelope]:
        """Subscribe to one more topic carrying ``kind`` (federated mode's updates): its messages are validated
        like the others (same validator, counters and blacklisting) and handed over as envelopes."""
        self.gossip.set_validator(topic, self._validator(kind))
        channel = await self.gossip.subscribe(topic)
        send, receive = trio.open_memory_channel[Envelope](size)
        self._topic_out[topic] = send
        nursery.start_soon(self._drain_envelopes, channel, send)
        return receive

    def settled(self, topic: str) -> bool:
        """Whether every message of an :meth:`open_topic` topic delivered so far has been taken by its reader
        (both hand-overs drained): what a peer sent before it left has been handled."""
        out = self._topic_out.get(topic)
        return self.gossip.idle(topic) and (out is None or drained(out))

    async def _drain_envelopes(
        self, channel: trio.MemoryReceiveChannel[GossipMessage], send: trio.MemorySendChannel[Envelope]
    ) -> None:
        async for msg in channel:
            env = self._envelope(msg)
            if env is None:
                continue
            try:
                send.send_nowait(env)
            except trio.WouldBlock:
                self.dropped_inbound += 1

    async def publish_signed(self, topic: str, data: bytes) -> None:
        """Publish already signed wire bytes (federated mode's chunks) on ``topic``."""
        await self.gossip.publish(topic, data)

    async def _drain_control(self, channel: trio.MemoryReceiveChannel[GossipMessage]) -> None:
        async for msg in channel:
            env = self._envelope(msg)
            if env is None or not isinstance(env.body, HeartbeatBody):
                continue
            author = to_peer_id(env)
            body = env.body
            self._peers[author] = PeerInfo(
                author, body.round, body.rounds_done, body.status, time.time(), body.listen_addrs,
                body.state_round, body.state_root, body.state_base,
            )  # fmt: skip

    # ----------------------------------------------------------------- Transport
    async def publish(self, rollout: Rollout) -> None:
        await self.gossip.publish(self.topic, self.signer.sign_rollout(rollout))

    async def publish_heartbeat(self, body: HeartbeatBody) -> None:
        await self.gossip.publish(self.control, self.signer.sign_heartbeat(body, body.round))

    def inbound(self) -> trio.MemoryReceiveChannel[Rollout]:
        return self._receive

    def peers(self) -> set[str]:
        """Peers heard from within ``peer_timeout`` that have not announced they are stopping."""
        now = time.time()
        blacklisted = set(self.gossip.blacklisted())
        return {
            p.peer_id
            for p in self._peers.values()
            if now - p.last_seen <= self.peer_timeout and p.status != "stopping" and p.peer_id not in blacklisted
        }

    def statistics(self) -> TransportStatistics:
        """The validator's counters with the gossip layer's own rejections (``oversize_rpc``) added in."""
        stats = self.validator.statistics()
        gossip = self.gossip.statistics()
        by_reason = dict(stats.rejected_by_reason)
        if gossip.oversize_rpc:
            by_reason[OVERSIZE_RPC] = gossip.oversize_rpc
        quota = self._over_quota.snapshot()
        refused = {reason: n for reason, n in self._refused.items() if n}
        by_reason.update(refused)  # passed the validator (counted there as accepted), then refused here
        ours = merge(self.gossip.rejections_by_peer(), quota)
        by_peer_reason = merge({p: dict(r) for p, r in stats.rejected_by_peer_reason.items()}, ours)
        by_peer = dict(stats.rejected_by_peer)
        for peer, reasons in ours.items():
            by_peer[peer] = by_peer.get(peer, 0) + sum(reasons.values())
        # inbound_full, subscription_full, peer_queue_full (outbound, to a frozen or slow peer; by peer in /status)
        counts = (self.dropped_inbound, gossip.dropped, gossip.dropped_to_peers)
        dropped = dict(zip(DROP_REASONS, counts, strict=True))
        return TransportStatistics(
            accepted=stats.accepted - sum(refused.values()),
            rejected_by_reason=by_reason,
            rejected_by_peer=by_peer,
            rejected_by_peer_reason=by_peer_reason,
            dropped={k: v for k, v in dropped.items() if v},
            equivocating_peers=stats.equivocators,
            received=dict(self.received),
            receive_cpu_seconds=self.receive_cpu_seconds,
        )

    def peer_table(self) -> list[PeerInfo]:
        return sorted(self._peers.values(), key=lambda p: p.peer_id)


def to_peer_id(env: Envelope) -> str:
    return peer_id_from_public_bytes(env.author)
