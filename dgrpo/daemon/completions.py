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

            # run_round's phases (dgrpo.round.run), with the weights sync's check between collecting and training.
            t0 = time.perf_counter()
            own = await produce_phase(d.node, d.transport, d.inbox, r, d.limiter, s.slowdown)
            collected = await collect_phase(d.inbox, r, expected, s.deadline_seconds, still_expected)
            if self.syncs:
                await self.sync.agree(r - 1, d.under_way())
            trained = own if not self.syncs or self.sync.trains_own(r) else []  # a node that joined: follows
            outcome = await consume_phase(d.node, r, trained, collected, t0, d.limiter, s.slowdown)
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

    async def _align(self) -> None:
        """Before a round of a node whose state is older than the network's (it joined late, or caught up after
        falling behind): take the state its peers hold after the round before (:mod:`dgrpo.daemon.weights_sync`),
        and play the round after that state's."""
        d = self.d
        own = self.sync.own
        if not self.syncs or d.round <= 1 or (own is not None and own.round >= d.round - 1):
            return
        if own is None and not d.rounds_done and not d.under_way():
            return  # nobody under way: the network starts with us, from the base weights
        d.state = "syncing"
        taken = await self.sync.align(d.round - 1, d.under_way)
        d.state = "running"
        if taken is not None and taken + 1 != d.round:
            log.info("joining at round %d, after the state taken", taken + 1)
            d.round = taken + 1
            d._announce.set()

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
