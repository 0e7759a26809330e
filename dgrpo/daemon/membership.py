"""The network's round as a node sees it, from its peers' heartbeats: robust statistics, so that one peer (or
any minority) naming a far-off round moves nobody there."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable

import trio

from dgrpo.daemon.settings import NodeSettings
from dgrpo.net.gossip import GossipNode
from dgrpo.net.p2p import Libp2pTransport
from dgrpo.round.node import Node
from dgrpo.round.receive import RoundInbox

log = logging.getLogger("dgrpo.daemon")
HORIZON_SLACK = 2  # rounds beyond the network's a rollout may be for before it counts against its author


def lower_median(rounds: Iterable[int]) -> int:
    """The lower median of peers' rounds (one peer naming a far-off round cannot move it); 0 for none."""
    ordered = sorted(rounds)
    return ordered[(len(ordered) - 1) // 2] if ordered else 0


def upper_median(rounds: Iterable[int]) -> int:
    """The upper median of peers' rounds (async mode: nodes that do not wait for each other spread out, and the
    front of the network is where the rollouts come from); 0 for none. A minority naming far-off rounds cannot
    move it; with two peers it is the more advanced one."""
    ordered = sorted(rounds)
    return ordered[len(ordered) // 2] if ordered else 0


JOIN_SPREAD = 2  # rounds a joiner believes peers may be ahead of the lower median of those under way


def joining_round(rounds: Iterable[int]) -> int:
    """The round a joiner takes the network to be in, from the rounds its peers under way announce: the most
    advanced one's, but never more than ``JOIN_SPREAD`` past their lower median. Taking the plain maximum let
    one peer (a Sybil a hostile bootstrap lists) send every joiner to a far-off round, alone there for good
    (catching up only moves forward); peers at a round boundary differ by one."""
    ordered = sorted(rounds)
    if not ordered:
        return 0
    median = lower_median(ordered)
    return max(r for r in ordered if r <= median + JOIN_SPREAD)


class Membership:
    """Where a daemon stands among its peers, from their heartbeats and rollouts: who is live, whom a round
    waits for, the network's round, how far ahead a rollout may be, and catching up with or keeping pace
    with the network. A part of :class:`dgrpo.daemon.daemon.Daemon` (which sets the attributes below)."""

    settings: NodeSettings
    node: Node
    transport: Libp2pTransport | None
    gossip: GossipNode | None
    inbox: RoundInbox
    asynchronous: bool
    round: int
    catch_ups: int
    paced_steps: int
    paced_seconds: float
    errors: deque[str]
    _connected_at_start: set[str]
    _announce: trio.Event

    def _error(self, message: str) -> None:
        log.warning(message)
        self.errors.append(f"{time.strftime('%H:%M:%S')} {message}")

    def progress(self, peer: str) -> int:
        """How far along ``peer`` is: the newer of the round its last heartbeat announced and the newest round
        it sent us rollouts for (a rollout can overtake the heartbeat that announces its round)."""
        assert self.transport is not None
        table = {p.peer_id: p for p in self.transport.peer_table()}
        heard = table[peer].round if peer in table else 0
        return max(heard, self.inbox.latest.get(peer, 0))

    def live_peers(self) -> set[str]:
        """Active peers (heard within ``peer_timeout``, not ``stopping``, not blacklisted) that have not
        disconnected since the round began."""
        assert self.transport is not None and self.gossip is not None
        gone = self._connected_at_start - self.gossip.connected_peers()
        return self.transport.peers() - gone

    def expected_peers(self, round_idx: int) -> set[str]:
        """Live peers whose rollouts for ``round_idx`` we wait for: those in step with it (at it, or up to two
        rounds behind and about to publish it), and those that already sent some of it unless two rounds past
        it. A peer that joined after this round began never publishes it; a straggler three or more rounds
        behind rejoins at the network's round (:meth:`_catch_up`) and never publishes this one either: neither
        is waited for.

        Where this node knows live senior peers, young ones are not waited for either (their rollouts count if
        they arrive before the round closes): waiting costs the round its time, and identities are free. With
        50 slow Sybils in step beside three honest nodes, the node that heard them first waited for them until
        the deadline (60 s) round after round, while the two others ran 280 rounds without it
        (``benchmarks/sybil.py``, docs/scale.md). The draw gives young authors at most ``young_share`` of its
        J anyway; a network whose peers are all young waits for all of them."""
        sent = self.inbox.authors(round_idx)
        done = {p.peer_id for p in self.transport.peer_table() if p.status == "done"} if self.transport else set()
        live = self.live_peers()
        seniority = self.node.seniority
        skip_young = any(not seniority.young(p) for p in live if p not in done)

        def expected(p: str) -> bool:
            if p in done:  # it ran all its rounds: it publishes no more rollouts
                return False
            if skip_young and seniority.young(p):
                return False
            progress = self.progress(p)
            # Behind by up to two rounds (still training, or its round-start heartbeat not here yet) it will
            # publish this round; further behind it is a straggler that rejoins later (_catch_up). One round
            # ahead, its last parts of this round may still be in flight; two rounds ahead they have arrived or
            # are lost (a peer publishes all its parts when its round starts).
            return round_idx - 2 <= progress <= round_idx or (p in sent and progress <= round_idx + 1)

        return {p for p in live if expected(p)}

    def under_way(self) -> list[str]:
        """The live peers whose progress says where the network is: running, with a round completed; where
        this node knows senior ones among them (:class:`dgrpo.defense.seniority.Seniority`: verified work over
        ``young_rounds`` rounds), those only. Identities are free: with 50 Sybils beside 3 honest nodes the
        network's round was a median over 53 peers, 50 of them Sybils far behind, so an honest node that fell
        behind its honest peers never rejoined them (it ran 263 rounds alone, docs/scale.md); a Sybil majority
        announcing far-off rounds would send every node there. Seniority costs verified work, so only peers
        that did it decide the network's round; a network whose peers are all young (its first K rounds)
        counts everyone."""
        assert self.transport is not None
        table = {p.peer_id: p for p in self.transport.peer_table()}
        running = [p for p in self.live_peers() if p in table and table[p].status == "running" and table[p].rounds_done]
        seniors = [p for p in running if not self.node.seniority.young(p)]
        return seniors or running

    def network_round(self) -> int:
        """The round the network is in: the lower median of the progress of the peers :meth:`under_way`
        (0: none ran one); in async mode the upper median (nodes that do not wait spread out: see
        :meth:`_catch_up`)."""
        median = upper_median if self.asynchronous else lower_median
        return median(self.progress(p) for p in self.under_way())

    def rollout_horizon(self) -> int | None:
        """The latest round a peer may publish rollouts for: the network's round (or ours, if later) plus the
        rounds a receiver keeps ahead, plus ``HORIZON_SLACK`` for heartbeats that lag the rollouts they announce.
        None while this node hears no running peer under way (just started, or woke from a suspension with a
        stale table): it cannot tell yet, and must not count honest rollouts of a network ahead of it against
        their authors."""
        if not self.under_way():
            return None
        return max(self.round, self.network_round()) + self.settings.limits.rounds_ahead + HORIZON_SLACK

    def _catch_up(self) -> None:
        """A node that fell behind (frozen, suspended, partitioned) rejoins at the round after the network's
        current one (whose rollouts went out while it was away), as a late joiner does.

        In async mode nodes do not wait for each other, so their rounds drift apart with their speeds, and a
        rollout's staleness (the receiver's round minus its own) would grow without bound between two nodes of
        slightly different speeds. Each step a node therefore moves up to the most advanced live peer's round,
        but never more than ``rounds_ahead`` past the network's (the upper median) or its own: a minority
        claiming far rounds cannot push the others ahead (which would make every honest rollout stale). A node
        that restarts far behind moves up in one step, and its horizon (:meth:`rollout_horizon`, from the same
        median) is at the network's front at once: the leader's rollouts are never taken for a spread flood."""
        network = self.network_round()
        if self.asynchronous:
            lead = max((self.progress(p) for p in self.under_way()), default=0)
            target = min(lead, max(network, self.round) + self.settings.limits.rounds_ahead)
            if target > self.round:
                if target - self.round > self.settings.rollout.max_staleness:
                    self._error(f"fell behind at round {self.round}; moved to round {target}")
                    self.catch_ups += 1
                log.debug("async: round %d -> %d (lead %d, network %d)", self.round, target, lead, network)
                self.round = target
                self._announce.set()
            return
        if network > self.round:
            log.warning(
                "behind the network (round %d, network in %d): rejoining at round %d", self.round, network, network + 1
            )
            self._error(f"fell behind at round {self.round}; rejoined at round {network + 1}")
            self.round = network + 1
            self.catch_ups += 1
            self._announce.set()

    async def _keep_pace(self) -> None:
        """Async mode: a node more than ``rounds_ahead`` rounds past the network's round (the upper median of its
        live peers' progress) waits until the network comes within reach, at most ``deadline_seconds``. AReaL
        (arXiv 2505.24298, sec. 5) bounds staleness the same way, holding generation back when it is more than
        a maximum version gap ahead of training. Without it a node that the machine happens to favour runs
        ahead without bound: what most peers publish reaches it older than S and is dropped, and its own
        rollouts pass others' horizons (``future_round``); seen with 30 light peers on 2 cores, where the
        leaders ran 7 rounds ahead and drew nothing for their last 9 steps. It waits for half of its peers,
        never for a straggler: with two peers the upper median is the more advanced one."""
        if not self.asynchronous or not self.settings.rounds.keep_pace:
            return
        ahead = self.settings.limits.rounds_ahead
        network = 0
        t0 = time.perf_counter()
        with trio.move_on_after(self.settings.rounds.deadline_seconds):
            while True:
                network = self.network_round()
                if network == 0 or self.round <= network + ahead:
                    break
                await trio.sleep(0.1)
        waited = time.perf_counter() - t0
        if waited > 0.05:
            self.paced_steps += 1
            self.paced_seconds += waited
            log.debug("async: waited %.1f s at round %d for the network (round %d)", waited, self.round, network)

    async def _await_peers(self) -> None:
        """Before a round of a node that needs peers (``min_peers``) but hears none, wait at most two heartbeat
        periods: a node that was suspended hears nobody until their next heartbeats, and would otherwise run
        rounds alone instead of catching up. One silent peer among live ones costs nothing here.

        A node that knows senior peers counts only those: cut off from all of them, with young identities
        around it, it waits the same way. With 50 Sybils connecting to an honest node at once, its connections
        to its two honest peers dropped; it expected nobody, ran rounds alone at five a second, and its honest
        peers blacklisted it for rollouts past their horizon (``future_round``) four seconds later
        (``benchmarks/sybil.py``, docs/scale.md)."""
        s = self.settings.rounds
        seniority = self.node.seniority
        with trio.move_on_after(2 * s.heartbeat_seconds):
            while s.min_peers:
                live = self.live_peers()
                if live and (not seniority.has_seniors() or any(not seniority.young(p) for p in live)):
                    break
                await trio.sleep(0.05)
