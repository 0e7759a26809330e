"""A completion-exchange node holds the weights its peers hold: the weights sync of late joiners, nodes that
fell behind and nodes that diverged (``docs/protocol.md``, "Weights sync").

In a homogeneous run every node trains on the same completion strings from the same weights, so all hold the
same state round after round; same-model checks (``logit``, ``sampling-proof``) depend on it. A node that joins
at round 20, or comes back after missing rounds, cannot replay what it never saw: it takes its peers' state.
After every round a node makes its state servable and announces its root in its heartbeats (with the base
weights it descends from, so that only peers of one model count); before a round it trains on, it compares
its own root with what its peers announce:

* **align** (before a joiner's first round, or after catching up): wait, at most ``sync.wait_seconds``, until a
  strict majority of its peers under way announce one state of the round before the one it plays, fetch it,
  check it, take it;
* **agree** (before every update): where a strict majority of the voters (its peers under way and itself)
  hold another state of the round just completed, take theirs; it diverged (a rollout it trained on that they
  did not, the race of a joiner's first round).

A root no majority announces is never fetched (``state_no_majority``, counted once per round); a transfer that
does not hash to it is refused piece by piece (:mod:`dgrpo.net.train_sync`). A joiner trusts the majority of
the peers it hears: a Sybil majority of its peers could hand it their weights (docs/protocol.md says what this
does not cover); peers that did verified work (seniority) are counted first, as for the network's round.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import trio

from dgrpo.daemon.settings import NodeSettings
from dgrpo.learner.learner import Learner
from dgrpo.learner.train_state import StateLayoutError, export_state, import_state
from dgrpo.net.gossip import GossipNode
from dgrpo.net.p2p import Libp2pTransport
from dgrpo.net.streams import Stream
from dgrpo.net.train_sync import Served, StateClient, StateServer
from dgrpo.protocol.counting import PeerReasons
from dgrpo.protocol.train_sync import Announcement, Majority, majority_root, state_protocol

log = logging.getLogger("dgrpo.daemon")
POLL_SECONDS = 0.25


class WeightsSync:
    """One node's side of the weights sync: what it serves and announces, and taking its peers' state."""

    def __init__(
        self,
        settings: NodeSettings,
        learner: Learner,
        base: bytes,
        report: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self.cfg = settings.sync
        self.learner = learner
        self.base = base  # SHA-256 of this node's base weights: only peers announcing the same one vote
        self.report = report
        self.rejected = PeerReasons(settings.limits.max_tracked_peers)
        self.by_reason: Counter[str] = Counter()
        self.server = StateServer(self.reject, rate=self.cfg.serve_bytes_per_second)
        self.own: Announcement | None = None
        self.adopted: list[dict[str, Any]] = []  # the states taken from peers (last 16)
        self.too_large = False
        self.gossip: GossipNode | None = None
        self.transport: Libp2pTransport | None = None
        self._no_majority_at: set[int] = set()  # rounds already counted as state_no_majority

    # ----------------------------------------------------------------- serving and announcing
    def open(self, gossip: GossipNode, transport: Libp2pTransport) -> None:
        self.gossip, self.transport = gossip, transport
        gossip.serve_streams(state_protocol(self.settings.run_id), self.server.handle)

    def reject(self, reason: str, peer: str) -> None:
        self.rejected.add(peer, reason)
        self.by_reason[reason] += 1

    def in_step(self, target: int, peers: set[str], seniors: set[str]) -> set[str]:
        """Those of ``peers`` that announce, after round ``target``, the state this node or one of ``seniors``
        holds: they play the next round from the network's weights (a joiner that took them, among them). A
        young peer can copy an announcement; what it gains is a bounded wait (the caller's), nothing more."""
        if self.transport is None:
            return set()
        table = {p.peer_id: p for p in self.transport.peer_table()}
        held = {(a.round, a.root) for a in (self.own, *(self._announced(table, p) for p in seniors)) if a}
        return {
            p
            for p in peers
            if p in table
            and (table[p].state_round, table[p].state_root) in held - {(0, b"")}
            and (table[p].state_round == target)
        }

    def _announced(self, table: dict[str, Any], peer: str) -> Announcement | None:
        info = table.get(peer)
        if info is None or not info.state_round or info.state_base != self.base:
            return None
        return Announcement(info.state_round, info.state_root)

    async def completed(self, round_idx: int) -> None:
        """After round ``round_idx``: serve and announce this node's state (a worker thread hashes it)."""
        if not self.cfg.enabled or self.too_large:
            return
        state = await trio.to_thread.run_sync(export_state, self.learner)
        if len(state) > self.cfg.max_state_bytes:
            self.too_large = True
            self.report(
                f"weights sync off: the state is {len(state)} bytes, over sync.max_state_bytes "
                f"({self.cfg.max_state_bytes}); late joiners will start from the base weights"
            )
            return
        served = await trio.to_thread.run_sync(Served.of, self.settings.run_id, round_idx, state)
        self.server.served = served
        self.own = Announcement(round_idx, served.header.root)

    def announcement(self) -> tuple[int, bytes, bytes] | None:
        """(round, root, base) for this node's heartbeats, None while it serves nothing."""
        return None if self.own is None else (self.own.round, self.own.root, self.base)

    # ----------------------------------------------------------------- taking peers' state
    def votes(self, voters: list[str]) -> dict[str, Announcement | None]:
        """The announcements of ``voters`` of this node's model (a peer of another model has no vote; one of
        this model that announced nothing counts against every root)."""
        assert self.transport is not None
        table = {p.peer_id: p for p in self.transport.peer_table()}
        out: dict[str, Announcement | None] = {}
        for peer in voters:
            info = table.get(peer)
            if info is None or (info.state_base and info.state_base != self.base):
                continue
            out[peer] = Announcement(info.state_round, info.state_root) if info.state_round else None
        return out

    async def align(self, target: int, voters: Callable[[], list[str]]) -> int | None:
        """Before a round of a node whose state is not the network's (a joiner, a node that caught up): wait
        at most ``sync.wait_seconds`` for a majority of its peers to announce a state of round ``target`` or
        later, and take it. Returns the round of the state taken (None: none taken, the node goes on with its
        own weights, and the reason is counted)."""
        if not self.cfg.enabled:
            return None
        deadline = trio.current_time() + self.cfg.wait_seconds
        t0, said = time.monotonic(), 0.0
        while True:
            votes = self.votes(voters())
            # Wait only for a state newer than this node's: peers that announce none newer (a network that
            # restarted from checkpoints, as this node did) have nothing to hand over.
            newest = max((a.round for a in votes.values() if a is not None), default=0)
            if newest <= (self.own.round if self.own is not None else 0):
                return None
            majority = majority_root(votes, target)
            if majority is None and all(a is not None and a.round >= target for a in votes.values()):
                # Every voter announced a state of that round or later and no state has a majority: they hold
                # different weights, and waiting will not make them agree.
                self._no_majority(target, "(the peers hold different states)")
                return None
            if majority is not None:
                if self.own is not None and majority.root == self.own.root:
                    return None  # it holds that state already
                if await self._take(majority, "joined" if self.own is None else "caught up"):
                    return majority.round
            if trio.current_time() >= deadline:
                self._no_majority(target, "after waiting")
                return None
            if time.monotonic() - said > 10:
                said = time.monotonic()
                log.info("waiting for peers to agree on the state of round %d (%.0f s)", target, said - t0)
            await trio.sleep(POLL_SECONDS)

    async def agree(self, target: int, voters: list[str], young: AbstractSet[str] = frozenset()) -> bool:
        """Before this node trains on round ``target + 1``: take the state of round ``target`` that a strict
        majority of the voters (its peers and itself) hold where it is not this node's (it diverged). True
        when it took one."""
        if not self.cfg.enabled or self.own is None:
            return False
        # Only states of round ``target`` count: a peer already past it (it closed the next round without
        # waiting for us) announces a state this node's next update would be applied to twice.
        votes = {p: a if a is not None and a.round == target else None for p, a in self.votes(voters).items()}
        if not votes:
            return False
        own = self.own if self.own.round == target else None
        majority = majority_root(votes, target, own)
        if majority is None and young:
            # No majority of the seniors and this node (two seniors apart, where a young peer's completions
            # reached one before it closed the round and not the other): young peers in step break the tie,
            # for a state a senior or this node holds (they cannot bring in weights of their own).
            held = {a.root for a in (own, *votes.values()) if a is not None}
            extra = {p: a for p, a in self.votes(sorted(young)).items() if a is not None and a.round == target}
            extra = {p: a for p, a in extra.items() if a.root in held}
            majority = majority_root({**votes, **extra}, target, own)
        if majority is None or majority.root == self.own.root:
            return False
        return await self._take(majority, "diverged")

    async def _take(self, majority: Majority, why: str) -> bool:
        assert self.gossip is not None
        client = StateClient(self._open, self.settings.run_id, self.cfg.max_state_bytes, self.reject)
        t0 = time.perf_counter()
        got = await client.fetch(majority.root, majority.holders, majority.round)
        if got is None:
            return False
        state, source = got
        try:
            await trio.to_thread.run_sync(import_state, self.learner, state)
        except StateLayoutError as error:
            self.reject("state_bad_layout", source)
            log.warning("weights sync from %s rejected: state_bad_layout: %s", source[-8:], error)
            return False
        replaced = self.own.root.hex() if self.own is not None else None
        served = await trio.to_thread.run_sync(Served.of, self.settings.run_id, majority.round, state)
        self.server.served = served
        self.own = Announcement(majority.round, majority.root)
        event = {
            "why": why, "round": majority.round, "root": majority.root.hex(), "replaced": replaced, "from": source,
            "holders": len(majority.holders), "bytes": len(state), "seconds": round(time.perf_counter() - t0, 3),
            "resumed": client.resumed,
        }  # fmt: skip
        self.adopted = [*self.adopted[-15:], event]
        log.info(
            "weights sync (%s): took the state of round %d (%s…, %d bytes) from %s in %.1f s, held by %d peer(s)",
            why, majority.round, majority.root.hex()[:12], len(state), source[-8:], event["seconds"],
            len(majority.holders),
        )  # fmt: skip
        return True

    async def _open(self, peer: str) -> Stream:
        assert self.gossip is not None and self.transport is not None
        addrs = next((p.listen_addrs for p in self.transport.peer_table() if p.peer_id == peer), ())
        return await self.gossip.open_stream(peer, state_protocol(self.settings.run_id), addrs)

    def _no_majority(self, target: int, when: str) -> None:
        if target in self._no_majority_at:
            return
        self._no_majority_at.add(target)
        self.by_reason["state_no_majority"] += 1
        self.report(
            f"weights sync: no majority of peers announced one state of round {target} {when}; "
            "training on from this node's own weights"
        )

    def status(self) -> dict[str, Any]:
        """The ``weights_sync`` part of ``/status``."""
        return {
            "enabled": self.cfg.enabled and not self.too_large,
            "state_round": self.own.round if self.own else None,
            "state_root": self.own.root.hex() if self.own else None,
            "served_pieces": self.server.pieces_sent,
            "adopted": self.adopted[-5:],
            "adoptions": len(self.adopted),
            "rejected_by_reason": dict(self.by_reason),
            "rejected_by_peer_reason": self.rejected.snapshot(),
        }


def merged(first: Mapping[str, int], second: Mapping[str, int]) -> dict[str, int]:
    out = Counter(first)
    out.update(second)
    return dict(out)
