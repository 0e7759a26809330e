"""``dgrpo node run --mode federated``: the exchange (:mod:`dgrpo.daemon.exchange`) that makes a daemon one client
of a Fed-GRPO federation (docs/federated.md).

Every round: load the global weights into the learner, take the client's local GRPO steps on its own
partition of the prompts (:class:`dgrpo.federated.client.FedClient`), publish the (sparse, error-fed) update
and its reward statistics as signed chunks (:mod:`dgrpo.net.updates`), then

- **star**: the aggregator (``federation.aggregator``, default the lowest peer id present at the first round)
  collects the round's submissions until every expected peer's has arrived or ``rounds.deadline_seconds``
  passed, aggregates them (:class:`dgrpo.federated.server.Aggregator`) and publishes the global update and
  statistics; the other nodes wait for it (up to twice the deadline);
- **decentralised**: every node collects the round's submissions (its own included) the same way and
  aggregates them itself; the aggregator sums in client-name order, so nodes holding the same set get the
  same bits.

Every node then sets ``global <- global + delta``. The global flat weights are the source of truth (the
learner's weights are reset to them at the start of each round); checkpoints keep them with the
optimizer, the error-feedback residual, the aggregator's history and the global statistics.

A node that joins a federation under way fetches the global state of the round in progress from its peers
before its first round (:mod:`dgrpo.net.state_sync`), and serves its own, as of its last completed round, to
later joiners.
"""

from __future__ import annotations

import json
import logging
import time
from functools import partial
from typing import Any

import torch
import trio

from dgrpo.config.federated import FederatedConfig
from dgrpo.daemon.checkpoint import CheckpointState
from dgrpo.daemon.daemon import Daemon
from dgrpo.daemon.exchange import Exchange
from dgrpo.daemon.log_lines import federated_round_text
from dgrpo.daemon.log_setup import record_extra
from dgrpo.daemon.membership import lower_median
from dgrpo.errors import ConfigError
from dgrpo.federated.agreement import agree
from dgrpo.federated.attacks import build_attack
from dgrpo.federated.client import FedClient, GlobalStats, Submission
from dgrpo.federated.encoding import decode, encode
from dgrpo.federated.params import assign_parameters, digest, flat_parameters
from dgrpo.federated.partition import client_prompts
from dgrpo.federated.server import Aggregator
from dgrpo.federated.sparse import ErrorFeedback
from dgrpo.net.state_sync import (
    MAX_SOURCES,
    GlobalState,
    SyncClient,
    SyncServer,
    fetch_global_state,
    make_snapshot,
    named_aggregator,
)
from dgrpo.net.streams import Stream
from dgrpo.net.updates import UpdateExchange, sparse_of, updates_complete
from dgrpo.protocol.chunks import Reassembler
from dgrpo.protocol.sync import sync_protocol
from dgrpo.round.admit import AdmissionStatistics

log = logging.getLogger("dgrpo.daemon")


class FederatedExchange(Exchange):
    """Fed-GRPO's exchange: the daemon ``d`` is one client of a federation (its model updates, never its
    completions, leave it)."""

    mode = "federated"

    def __init__(self, d: Daemon) -> None:
        self.d = d
        settings = d.settings
        self.cfg = settings.federated or FederatedConfig()
        if self.cfg.method != "federated":
            raise ConfigError(
                f"a daemon runs federated.method='federated', not {self.cfg.method!r} (a simulation baseline)"
            )
        self.topology = self.cfg.topology
        self.client_index = settings.federation.client_index
        if self.client_index is not None and self.client_index >= self.cfg.clients:
            raise ConfigError(f"federation.client_index {self.client_index} must be below federated.clients")
        self.aggregator_id = settings.federation.aggregator
        self.global_flat = flat_parameters(d.learner.model)
        self.model_size = self.global_flat.numel()
        self.global_stats: GlobalStats | None = None
        self.global_digest = digest(self.global_flat)
        self.aggregator = Aggregator(self.cfg)
        self.reassembler = Reassembler(settings.limits)
        self.client: FedClient | None = None
        self.residual: torch.Tensor | None = None  # restored before the client exists
        self.updates = UpdateExchange(
            d.peer_id, d.signer, self.reassembler, self.model_size, settings.run_id, settings.federation.chunk_bytes,
        )  # fmt: skip
        self.last_round: dict[str, Any] | None = None
        self.sync_server = SyncServer(self.reassembler.reject)
        self.synced: dict[str, Any] | None = None  # where a late join took the global state from
        self.resyncs: list[dict[str, Any]] = []  # rounds after which this node found itself diverged (last 16)

    # ----------------------------------------------------------------- checkpoints
    def restore(self, state: CheckpointState) -> None:
        fed = state.meta.get("federated")
        if not isinstance(fed, dict):
            return
        self.global_flat = fed["global"].clone().to(torch.float32)
        self.residual = fed["residual"].clone().to(torch.float32)
        self.aggregator.history = {str(k): float(v) for k, v in fed["history"].items()}
        stats = fed.get("global_stats")
        self.global_stats = GlobalStats(float(stats[0]), float(stats[1])) if stats else None
        self.client_index = fed.get("client_index", self.client_index)
        self.aggregator_id = fed.get("aggregator") or self.aggregator_id
        self.global_digest = digest(self.global_flat)
        assign_parameters(self.d.learner.model, self.global_flat)
        log.info("federated state restored: global %s…, round %d", self.global_digest[:12], self.d.round)

    def checkpoint_meta(self) -> dict[str, Any]:
        residual = self.client.feedback.residual if self.client is not None else self.residual
        return {
            "federated": {
                "global": self.global_flat.clone(),
                "residual": (residual if residual is not None else torch.zeros(self.model_size)).clone(),
                "history": dict(self.aggregator.history),
                "global_stats": None if self.global_stats is None else [self.global_stats.mean, self.global_stats.std],
                "client_index": self.client_index,
                "aggregator": self.aggregator_id,
                "topology": self.topology,
            }
        }

    # ----------------------------------------------------------------- status
    def admission_statistics(self) -> AdmissionStatistics:
        """Chunk reassembly's rejections: the admit stage of federated mode."""
        stats = self.reassembler.statistics()
        return AdmissionStatistics(stats.rejected_by_reason, stats.rejected_by_author, stats.rejected_by_author_reason)

    def is_aggregator(self) -> bool:
        return self.topology == "decentralised" or self.aggregator_id == self.d.peer_id

    def status(self, out: dict[str, Any]) -> None:
        stats = self.reassembler.statistics()
        out["weights_sha256"] = self.global_digest
        out["mean_reward"] = self.last_round["local_mean"] if self.last_round else None
        out["federated"] = {
            "topology": self.topology,
            "role": "aggregator" if self.is_aggregator() else "client",
            "aggregator": self.aggregator_id if self.topology == "star" else None,
            "client_index": self.client_index,
            "round": self.d.round,
            "rounds_done": self.d.rounds_done,
            "global_sha256": self.global_digest,
            "global_stats": None if self.global_stats is None else vars(self.global_stats),
            "bytes_sent": self.updates.bytes_sent,
            "messages_sent": self.updates.messages_sent,
            "updates_completed": stats.completed,
            "last_round": self.last_round,
            "sync": {
                "served": self.sync_server.served,
                "joined_from": self.synced,
                "resyncs": len(self.resyncs),
                "last_resync": self.resyncs[-1] if self.resyncs else None,
            },
        }

    # ----------------------------------------------------------------- the loop
    async def open(self, nursery: trio.Nursery) -> None:
        assert self.d.transport is not None and self.d.gossip is not None
        await self.updates.start(self.d.transport, nursery)
        # Until its first round ends a node serves the weights it starts from (round 0, or its checkpoint's).
        await self._serve_snapshot(max(self.d.round - 1, 0))
        self.d.gossip.serve_streams(sync_protocol(self.d.settings.run_id), self.sync_server.handle)

    # ----------------------------------------------------------------- state sync (late joiners)
    async def _serve_snapshot(self, round_idx: int) -> None:
        """Serve the global state after ``round_idx`` from now on. The copy is taken here, between rounds, so
        the round loop never changes what is being serialized."""
        flat, stats, history = self.global_flat.clone(), self.global_stats, dict(self.aggregator.history)
        aggregator = self.aggregator_id if self.topology == "star" else None
        self.sync_server.snapshot = await trio.to_thread.run_sync(
            make_snapshot, self.d.identity, self.d.settings.run_id, round_idx, flat, stats, aggregator, history
        )

    def _sync_sources(self, aggregator: str | None) -> list[str]:
        """The star's aggregator when it is another node; else up to MAX_SOURCES running peers, the most
        advanced first."""
        assert self.d.transport is not None
        if aggregator is not None and aggregator != self.d.peer_id:
            return [aggregator]
        active = self.d.transport.peers()
        running = [p for p in self.d.transport.peer_table() if p.status == "running" and p.peer_id in active]
        running.sort(key=lambda p: (-p.rounds_done, p.peer_id))
        return [p.peer_id for p in running[:MAX_SOURCES]]

    async def _open_sync_stream(self, peer: str) -> Stream:
        assert self.d.transport is not None and self.d.gossip is not None
        addrs = next((p.listen_addrs for p in self.d.transport.peer_table() if p.peer_id == peer), ())
        return await self.d.gossip.open_stream(peer, sync_protocol(self.d.settings.run_id), addrs)

    async def _sync(self, target: int) -> GlobalState | None:
        """Take over the global state of round ``target`` (or later) from peers; None if none gave a valid one.

        Star: from the aggregator (named by the settings, else by most peers), which must name itself.
        Decentralised (or a star whose aggregator is this node): from up to 3 peers, the weights most of them
        hold at the highest round.
        """
        client = SyncClient(self._open_sync_stream, self.d.settings.run_id, self.model_size, self.reassembler.reject)
        aggregator = self.aggregator_id if self.topology == "star" else None
        if self.topology == "star" and aggregator is None:
            aggregator = named_aggregator(await client.heads(self._sync_sources(None)))
        wait = 2 * self.d.settings.rounds.deadline_seconds  # the round in progress ends within that
        state = await fetch_global_state(client, partial(self._sync_sources, aggregator), target, wait, aggregator)
        if state is not None:
            await self._adopt(state, target)
        return state

    async def _adopt(self, state: GlobalState, target: int) -> None:
        if state.round < target:
            self.d._error(f"state sync: peers hold round {state.round}, not {target}; joining at {state.round + 1}")
        replaced = self.global_digest
        self.global_flat = state.weights
        self.global_digest = state.digest
        self.global_stats = state.stats
        self.aggregator.history = dict(state.history)
        if self.topology == "star":
            self.aggregator_id = state.aggregator
        # Error feedback restarts at zero: a residual is what this node had not sent of updates computed
        # against weights it has just replaced.
        self.residual = None
        if self.client is not None:
            self.client.feedback = ErrorFeedback(self.model_size)
        self.d.round = state.round + 1
        await trio.to_thread.run_sync(assign_parameters, self.d.learner.model, self.global_flat)
        await self._serve_snapshot(state.round)
        event = {
            "peer": state.source, "round": state.round, "global_sha256": state.digest, "replaced_sha256": replaced,
        }  # fmt: skip
        if self.client is None:  # joining; a node already running re-syncs (_resync)
            self.synced = event
        log.info("state sync: global %s… of round %d from %s", state.digest[:12], state.round, state.source)

    def expected_peers(self, round_idx: int) -> set[str]:
        """Active peers at or behind ``round_idx`` (they will send it), and those that already sent some.

        A peer still at round 0 once the federation is past its first round is joining: it starts after the
        round in progress (``_join``) and never sends this one, so waiting for it would only hold the round to
        its deadline."""
        assert self.d.transport is not None
        table = {p.peer_id: p for p in self.d.transport.peer_table()}
        sent = set(self.updates.submissions.get(round_idx, {}))

        def will_send(peer: str) -> bool:
            joining = table[peer].round == 0 and round_idx > 1
            done = table[peer].status == "done"  # it ran all its rounds: it sends no more updates
            return table[peer].round <= round_idx and not joining and not done

        return {p for p in self.d.transport.peers() if will_send(p) or p in sent}

    def heard_round(self) -> int:
        """The newest round the live peers sent updates for, by the lower median over them; 0 if none was heard."""
        live = self.d.live_peers()
        return lower_median(r for peer, r in self.updates.latest.items() if peer in live)

    def awaited(self, round_idx: int) -> set[str]:
        """Peers whose update for ``round_idx`` is still worth waiting for: the live ones, and those that announced
        ``stopping`` after sending it while still connected. A peer announces its next round once it finished
        one, so a stopping peer whose heartbeat names a later round sent its update before; so did one whose
        chunks of it have started arriving. Without them a node that happened to be slower than its peers to
        finish the round would close it without that update, unlike the others."""
        assert self.d.transport is not None and self.d.gossip is not None
        connected = self.d.gossip.connected_peers() - set(self.d.gossip.blacklisted())
        started = self.reassembler.started("update", round_idx)
        leaving = {
            p.peer_id
            for p in self.d.transport.peer_table()
            if p.status == "stopping" and p.peer_id in connected and (p.round > round_idx or p.peer_id in started)
        }
        return self.d.live_peers() | leaving

    def _setup_client(self) -> FedClient:
        """The client: its partition index and the aggregator are fixed at the first round (and checkpointed)."""
        assert self.d.transport is not None
        present = sorted(self.d.transport.peers() | {self.d.peer_id})
        if self.client_index is None:
            self.client_index = present.index(self.d.peer_id)
            if self.client_index >= self.cfg.clients:
                raise ConfigError(f"{len(present)} nodes present but federated.clients = {self.cfg.clients}")
        if self.topology == "star" and self.aggregator_id is None:
            self.aggregator_id = present[0]
        self.updates.aggregator = self.aggregator_id if self.topology == "star" else None
        cfg, s = self.cfg, self.d.settings
        task = self.d.node.task
        prompts = client_prompts(
            task, cfg.partition, cfg.clients, cfg.prompts_per_client, s.run_id, cfg.noisy_clients, cfg.label_noise
        )
        attack = None
        if cfg.attack is not None and self.client_index >= cfg.clients - cfg.attack.clients:
            attack = build_attack(cfg.attack.name, cfg.attack.options)
        client = FedClient(
            self.d.peer_id, s.run_id, task, self.d.learner, [(self.d.peer_id, prompts[self.client_index])], cfg,
            s.sampling, attack,
        )  # fmt: skip
        if self.residual is not None:
            client.feedback = ErrorFeedback(self.model_size, self.residual)
        log.info(
            "federated %s: client %d of %d%s", self.topology, self.client_index, cfg.clients,
            f", aggregator {self.aggregator_id}" if self.topology == "star" else "",
        )  # fmt: skip
        return client

    async def rounds(self) -> None:
        assert self.d.transport is not None
        s = self.d.settings.rounds
        resumed_at = self.d.round
        await self.d._join()
        heard = self.heard_round()
        if self.d.round > max(resumed_at, 1) and heard >= self.d.round:
            # Heartbeats go out at every round start, but one may still be on its way: updates already heard
            # for the round we meant to join show the federation is further along.
            log.info("joining at round %d (updates of round %d already heard)", heard + 1, heard)
            self.d.round = heard + 1
        if self.d.round > max(resumed_at, 1):
            if self.topology == "decentralised":
                # Every node must aggregate the same set of updates, and each decides whom to wait for from the
                # heartbeats it has: start one round later, so that by then all have heard at which round we
                # start (the next round may already be under way at some of them).
                self.d.round += 1
                log.info("decentralised: starting at round %d", self.d.round)
            # Keep the updates of the rounds from here on, rather than reject them as future.
            self.updates.advance(self.d.round - 1)
            self.d._announce.set()  # the round we start at, before the federation reaches it
            if await self._sync(self.d.round - 1) is None:
                self.d._error(
                    f"joining a federation at round {self.d.round}: no peer served its global weights; "
                    "these may be behind the others'"
                )
        self.d.state = "running"
        self.d.round = max(self.d.round, 1)
        self.client = self._setup_client()
        while s.max_rounds is None or self.d.rounds_done < s.max_rounds:
            self.d._connected_at_start = self.d.gossip.connected_peers() if self.d.gossip is not None else set()
            # A heartbeat at every round start: peers and joiners see where we are (after a join, the round after
            # the state taken, which may be later than the one announced before the sync).
            self.d._announce.set()
            diverged = await self._federated_round(self.client, self.d.round)
            # Counted before anything else can be interrupted: a stopping heartbeat names the next round, which
            # tells the others this one's update went out (``awaited``).
            self.d.rounds_done += 1
            self.d.round += 1
            if diverged:  # it does not hand its weights to joiners, it takes the federation's over
                await self._resync(self.d.round - 1)
            else:
                await self._serve_snapshot(self.d.round - 1)
            self.d.replay.save(self.d.replay_path)
            if self.d.rounds_done % self.d.settings.checkpoint.every == 0:
                self.d.save_peers()
                await trio.to_thread.run_sync(self.d.save_checkpoint)
        self.d.state = "done"
        log.info("completed %d federated rounds; global weights %s", self.d.rounds_done, self.global_digest)
        if s.linger:
            await trio.sleep_forever()

    async def _resync(self, r: int) -> None:
        """After round ``r`` this node's weights were not the ones most of its peers' updates (or the star's
        global update) were computed against: take the state of round ``r`` over from them."""
        before = self.global_digest
        state = await self._sync(r)
        event = {
            "round": r, "peer": state.source if state else None, "replaced_sha256": before,
            "global_sha256": self.global_digest, "ok": state is not None,
        }  # fmt: skip
        self.resyncs = [*self.resyncs[-15:], event]
        if state is not None:
            log.warning("diverged after round %d: took the federation's state %s… over", r, self.global_digest[:12])
        else:
            self.d._error(f"diverged after round {r}: no peer served the federation's state; training on apart")

    async def _federated_round(self, client: FedClient, r: int) -> bool:
        """Round ``r``; returns whether this node found its global weights differ from the federation's."""
        t0 = time.time()
        deadline = self.d.settings.rounds.deadline_seconds
        ex = self.updates
        ex.advance(r)
        await trio.to_thread.run_sync(client.load_global, self.global_flat)
        result = await trio.to_thread.run_sync(client.local_round, r, self.global_stats)
        sub = await trio.to_thread.run_sync(client.submission, r, result, self.global_stats)
        payload = await trio.to_thread.run_sync(encode, sub.update)
        # What the others decode, so every aggregating node sums the same bits.
        base = bytes.fromhex(self.global_digest)
        ex.add_own(Submission(self.d.peer_id, r, sub.stats, decode(payload, self.model_size)), base)
        await ex.publish_update(r, sub.stats, payload, base)
        row: dict[str, Any] = {"local_mean": result.stats.mean, "local_std": result.stats.std}
        diverged = False
        if self.is_aggregator():
            expected = self.expected_peers(r) | {self.d.peer_id}
            # A peer that announces ``stopping`` before sending this round's update, falls silent or disconnects
            # is no longer waited for (once what it sent before has been handled).
            await ex.wait(
                lambda: updates_complete(
                    expected, set(ex.submissions.get(r, {})), self.awaited(r) | {self.d.peer_id}, ex.settled()
                ),
                deadline,
            )
            received = ex.received(r)
            row["missing"] = sorted(expected - set(received))
            agreement = agree(base, ex.bases.get(r, {}))
            for author in sorted(agreement.stale):
                log.warning("round %d: %s's update was computed against other global weights", r, author)
                self.reassembler.reject("stale_base", author)
                del received[author]
            # The star's aggregator defines the global weights; in the decentralised topology the odd one out
            # is whoever most updates disagree with.
            diverged = self.topology == "decentralised" and agreement.diverged
            row["stale"] = sorted(agreement.stale)
            aggregated = await trio.to_thread.run_sync(self.aggregator.aggregate, r, list(received.values()))
            delta_payload = await trio.to_thread.run_sync(encode, sparse_of(aggregated.delta))
            if self.topology == "star":
                await ex.publish_global(r, aggregated.stats, dict(aggregated.weights), delta_payload, base)
            delta: torch.Tensor | None = decode(delta_payload, self.model_size).dense()
            stats: GlobalStats | None = aggregated.stats
            weights: dict[str, float] = dict(aggregated.weights)
            row["clipped"] = dict(aggregated.clipped)
        else:
            arrived = await ex.wait(lambda: r in ex.globals, 2 * deadline)
            glob = ex.globals.get(r) if arrived else None
            delta, stats, weights = (glob.delta, glob.stats, glob.weights) if glob else (None, None, {})
            if glob is None:
                self.d._error(f"round {r}: no global update from {self.aggregator_id} in {2 * deadline:.0f}s")
            elif glob.base != base:
                log.warning("round %d: the aggregator's global update applies to other global weights", r)
                diverged = True
        if delta is not None:
            self.global_flat = self.global_flat + delta
            self.global_stats = stats
        self.global_digest = digest(self.global_flat)
        await trio.to_thread.run_sync(client.load_global, self.global_flat)
        row |= {
            "round": r,
            "peer": self.d.peer_id,
            "mode": "federated",
            "topology": self.topology,
            "role": "aggregator" if self.is_aggregator() else "client",
            "clients": sorted(weights),
            "weights": weights,
            "applied": delta is not None,
            "global_stats": None if stats is None else vars(stats),
            "global_sha256": self.global_digest,
            "bytes_sent": ex.bytes_sent,
            "losses": list(result.losses),
            "seconds": round(time.time() - t0, 3),
        }
        self.last_round = row
        self.d.metrics.round.set(r)
        self.d.metrics.mean_reward.set(result.stats.mean)
        self.d.metrics.round_seconds.set(row["seconds"])
        row["diverged"] = diverged
        if row.get("missing"):
            self.d._error(f"round {r} closed at its deadline without {row['missing']}")
        with (self.d.settings.state_dir / "rounds.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        self.d.history.add_row(row)  # the live page's curve
        if self.d.tensorboard is not None:  # a federated round has no completion outcomes: its row
            self.d.tensorboard.log_row(row["round"], row, prefix="node")
            self.d.tensorboard.flush()
        log.info("%s", federated_round_text(row), extra=record_extra(row))
        return diverged
