"""Decentralised GRPO's exchange (``mode = "completions"``, the default; "Hail to the Thief"): completion strings.

Every round (or async step) the daemon's node generates and publishes its rollouts, receives its peers' until
every expected peer delivered or the deadline passed (sync), or takes what has arrived (async), then draws,
defends, scores and trains (:func:`dgrpo.round.run.run_round`, :func:`dgrpo.round.run.run_step`). The
receive path (validation, dedup, quotas) runs in the transport; who is expected, who departed and where a late
node rejoins is the daemon's membership (:mod:`dgrpo.daemon.membership`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import trio

from dgrpo.daemon.checkpoint import CheckpointState
from dgrpo.daemon.daemon import Daemon
from dgrpo.daemon.exchange import Exchange
from dgrpo.daemon.weights_sync import WeightsSync, merged
from dgrpo.round.admit import AdmissionStatistics
from dgrpo.round.observer import notify
from dgrpo.round.outcome import RoundOutcome
from dgrpo.round.run import collect_phase, consume_phase, produce_phase, run_step

log = logging.getLogger("dgrpo.daemon")


class CompletionExchange(Exchange):
    mode = "completions"

    def __init__(self, d: Daemon) -> None:
        self.d = d
        # The weights sync (late joiners, nodes behind or diverged) where every node trains on every completion
        # of a round, so that all hold one state: sync rounds, no bounded draw. Elsewhere weights differ by design.
        s = d.settings
        self.syncs = s.sync.enabled and s.rollout.mode == "sync" and s.rollout.external_per_round is None
        self.sync = WeightsSync(s, d.learner, d.base_sha256, d._error)

    def restore(self, state: CheckpointState) -> None:
        d = self.d
        # Whom this node stopped listening to stays so: a restart is no amnesty for a poisoner.
        if d.reputation is not None and isinstance(state.meta.get("reputation"), dict):
            d.reputation.load(state.meta["reputation"])
        if isinstance(state.meta.get("seniority"), dict):  # a restart does not make old identities young again
            d.node.seniority.load(state.meta["seniority"])

    def checkpoint_meta(self) -> dict[str, Any]:
        d = self.d
        meta: dict[str, Any] = {"seniority": d.node.seniority.to_dict()}
        if d.reputation is not None:
            meta["reputation"] = d.reputation.to_dict()
        return meta

    def admission_statistics(self) -> AdmissionStatistics:
        """The admit stage's rejections, and the weights sync's (as federated mode counts its state sync's)."""
        admitted = self.d.node.admitter.statistics()
        by_peer_reason = {peer: dict(reasons) for peer, reasons in admitted.rejected_by_author_reason.items()}
        for peer, reasons in self.sync.rejected.snapshot().items():
            by_peer_reason[peer] = merged(by_peer_reason.get(peer, {}), reasons)
        return AdmissionStatistics(
            merged(admitted.rejected_by_reason, self.sync.by_reason),
            merged(admitted.rejected_by_author, self.sync.rejected.by_peer()),
            by_peer_reason,
        )

    def status(self, out: dict[str, Any]) -> None:
        """The weights sync's part; the rest of the daemon's ``/status`` is this mode's (draw, defense, ...)."""
        out["weights_sync"] = self.sync.status() | {"applies": self.syncs}

    def announcement(self) -> tuple[int, bytes, bytes] | None:
        return self.sync.announcement() if self.syncs else None

    async def open(self, nursery: trio.Nursery) -> None:
        """Serve this node's state to joiners (rollouts and control are the transport's)."""
        assert self.d.gossip is not None and self.d.transport is not None
        if self.syncs:
            self.sync.open(self.d.gossip, self.d.transport)

    async def rounds(self) -> None:
        d = self.d
        assert d.transport is not None and d.gossip is not None
        s = d.settings.rounds
        if self.syncs and d.rounds_done:  # resumed: serve and announce the state the checkpoint restored
            await self.sync.completed(d.round - 1)
        await d._join()
        d.state = "running"
        d.round = max(d.round, 1)
        while s.max_rounds is None or d.rounds_done < s.max_rounds:
            d._connected_at_start = d.gossip.connected_peers()
            await d._await_peers()
            d._catch_up()
            await self._align()
            await d._keep_pace()
            d.transport.round_horizon = d.inbox.horizon = d.rollout_horizon()
            r = d.round
            if s.announce_rounds:  # a heartbeat at every round start: peers see our progress within the round
                d._announce.set()
            if d.asynchronous:  # never waits: a late peer's rollouts count in the step where they arrive
                outcome = await run_step(d.node, d.transport, d.inbox, r, d.limiter, s.slowdown, d.fill)
                await self._finish_round(outcome)
                continue
            expected = d.expected_peers(r)

            def still_expected(waiting: set[str], r: int = r) -> set[str]:
                return waiting & d.expected_peers(r)

            # run_round's phases (dgrpo.round.run), with the weights sync's steps between collecting and training.
            t0 = time.perf_counter()
            own = await produce_phase(d.node, d.transport, d.inbox, r, d.limiter, s.slowdown)
            if self.syncs:
                await self._young_in_step(r, expected, still_expected, t0)
            collected = await collect_phase(d.inbox, r, expected, s.deadline_seconds, still_expected)
            took = False
            if self.syncs:
                under_way = d.under_way()
                took = await self.sync.agree(r - 1, under_way, self.sync.in_step(r - 1, d.live_peers(), set(under_way)))
            # A node apart from the majority was most likely left out of their last round (they did not wait for
            # it); they will most likely leave its completions of this one out too, so it trains on theirs only,
            # as a joiner watches, and holds their state after it: its next announcement matches theirs, and
            # they wait for it from then on.
            outcome = await consume_phase(d.node, r, [] if took else own, collected, t0, d.limiter, s.slowdown)
            await self._finish_round(outcome)
            if outcome.departed:
                gone = ", ".join(peer[-8:] for peer in outcome.departed)
                log.info("round %d stopped waiting for %s (stopping, silent or disconnected)", r, gone)
            # With a bounded draw (rollout.external_per_round) most peers' completions are not drawn in a given
            # round, which is no error: there, a peer is missing when nothing of its rollouts was admitted.
            bounded = d.settings.rollout.external_per_round is not None
            used = {a.rollout.author for a in outcome.admission.admitted} if bounded else outcome.authors
            missing = expected - used - set(outcome.departed)
            if missing and outcome.at_deadline:
                d._error(f"round {outcome.round} closed at its deadline without {sorted(missing)}")
            elif missing:  # all delivered (quorum), but nothing of theirs was used: rejected on the way
                what = "admitted" if bounded else "trained"
                d._error(f"round {outcome.round} closed by quorum; nothing {what} from {sorted(missing)}")
        d.state = "done"
        d._announce.set()  # peers stop counting on our rollouts at once, not at the next periodic heartbeat
        log.info("completed %d rounds", d.rounds_done)
        if s.linger:
            await trio.sleep_forever()  # keep gossiping and serving status until told to stop

    async def _young_in_step(
        self, r: int, expected: set[str], still_expected: Callable[[set[str]], set[str]], t0: float
    ) -> None:
        """Before the round is taken: where live young peers (not waited for: identities are free) announce this
        node's own state, wait for the expected peers and then for them, at most ``sync.young_wait_seconds`` or as
        long as the round has taken so far, whichever is longer (a peer doing the same work on a slower machine).
        A joiner that took the network's state publishes within moments of its peers; without this wait one
        peer would close the round just before its completions arrived and another just after, and the two,
        training on different sets, would hold different weights from then on. A young peer that copies the
        announcement and never delivers costs a round at most twice its time (or the wait), not the deadline."""
        d = self.d
        wait = d.settings.sync.young_wait_seconds
        if not wait:
            return
        with trio.move_on_after(d.settings.rounds.deadline_seconds):
            await d.inbox.wait_complete(r, expected, still_expected)
        # Asked after the expected peers delivered: a joiner's announcement has had a round's generation to arrive.
        young = self.sync.in_step(r - 1, d.live_peers() - expected, set(d.under_way()))
        if not young:
            return

        def still(waiting: set[str]) -> set[str]:  # the young ones stay expected while live
            return still_expected(waiting) | (waiting & young & d.live_peers())

        with trio.move_on_after(max(wait, time.perf_counter() - t0)):
            await d.inbox.wait_complete(r, expected | young, still)

    async def _align(self) -> None:
        """Before a round of a node whose state is older than the network's (it joined late, or caught up after
        falling behind): take the state its peers hold after the round before (:mod:`dgrpo.daemon.weights_sync`),
        then watch the round after it (:meth:`_observe`) and play the one after that."""
        d = self.d
        own = self.sync.own
        if not self.syncs or d.round <= 1 or (own is not None and own.round >= d.round - 1):
            return
        if own is None and not d.rounds_done and not d.under_way():
            return  # nobody under way: the network starts with us, from the base weights
        d.state = "syncing"
        if d.inbox.opened and d.inbox.current < d.round:
            # A node that fell behind still listens at its old round, where its peers' rollouts of the round it
            # will watch are too far ahead to keep: listen at the network's from now on.
            d.inbox.open(d.round)
        taken = await self.sync.align(d.round - 1, d.under_way)
        if taken is not None:
            # Announced at once: the next round this node plays is the one after the round it watches, so its
            # peers do not wait for it in the round it watches.
            d.round = taken + 2
            d._announce.set()
            await self._observe(taken + 1)
            log.info("joined the network's rounds at round %d, with its peers' weights", d.round)
        d.state = "running"

    async def _observe(self, r: int) -> None:
        """Round ``r`` as its peers play it, without producing: take their rollouts and train on exactly what
        they train on, so that this node holds their state after it, with no transfer. A node that took its
        peers' state mid-round cannot have its own completions in that round: its peers, senior to it, do not
        wait for a young peer, and would close the round with or without them, each as timing fell, leaving
        them with different weights."""
        d = self.d
        assert d.transport is not None
        t0 = time.perf_counter()
        d.inbox.open(r)
        expected = d.expected_peers(r)

        def still_expected(waiting: set[str]) -> set[str]:
            return waiting & d.expected_peers(r)

        collected = await collect_phase(d.inbox, r, expected, d.settings.rounds.deadline_seconds, still_expected)
        outcome = await consume_phase(d.node, r, [], collected, t0, d.limiter, d.settings.rounds.slowdown)
        await self._finish_round(outcome)  # the next round played is r + 1, as announced

    async def _finish_round(self, outcome: RoundOutcome) -> None:
        """After a round (or an async step): count it, tell the observers, save the replay window and, every
        ``checkpoint.every`` rounds, the peers and a checkpoint."""
        self.d.rounds_done += 1
        self.d.round = outcome.round + 1
        if self.syncs:  # before the next round's heartbeat announces it
            await self.sync.completed(outcome.round)
        notify(self.d.observers, outcome.round, [outcome])
        self.d.replay.save(self.d.replay_path)
        if self.d.rounds_done % self.d.settings.checkpoint.every == 0:
            self.d.save_peers()  # here, not in the thread: it reads the transport's tables
            await trio.to_thread.run_sync(self.d.save_checkpoint)
