"""``dgrpo node run``: one node of a decentralised GRPO network over libp2p gossipsub.

Designed against the top complaints about the nearest existing system (papers notes, part C):
* the P2P daemon fails to start or to reach bootstrap peers -> bootstrap is retried with backoff and a log
  line per failure, never a crash; the node's listen addresses and status URL are written to
  ``<state_dir>/node.json`` as soon as it is up;
* nodes sit at an old round without errors -> rounds close at quorum or at a deadline, a late joiner starts
  at the network's current round (learned from heartbeats), and the status shows round, peers, rejections
  and the last errors;
* no visible progress -> one structured log line per round, ``/status`` JSON and Prometheus ``/metrics``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import trio

from dgrpo.atomic import remove_orphans, write_atomically
from dgrpo.daemon.checkpoint import CheckpointManager, CheckpointState
from dgrpo.daemon.exchange import Exchange
from dgrpo.daemon.fresh import FreshStart
from dgrpo.daemon.heldout import HeldOut
from dgrpo.daemon.history import RoundHistory
from dgrpo.daemon.identity import check_resume, load_identity
from dgrpo.daemon.local_state import load_peers, save_peers, save_settings
from dgrpo.daemon.manifest_exchange import ManifestService
from dgrpo.daemon.membership import Membership, joining_round
from dgrpo.daemon.monitor import PoisonMonitor
from dgrpo.daemon.observers import Blacklister, MetricsObserver, NodeCounters, RoundLog
from dgrpo.daemon.ports import listen_in_effect, refuse_taken_chosen_ports, status_port_in_effect
from dgrpo.daemon.run_manifest import base_weights, hold_manifest, refused_at_join
from dgrpo.daemon.settings import NodeSettings
from dgrpo.daemon.snapshot import node_snapshot
from dgrpo.daemon.status import NodeMetrics, StatusServer, WireCollector
from dgrpo.daemon.waiting import how_to_join, wait_for_peers
from dgrpo.errors import ConfigError
from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.p2p import Libp2pTransport
from dgrpo.net.transport import TransportStatistics
from dgrpo.protocol.envelope import HeartbeatBody, Signer
from dgrpo.protocol.nonce import NonceCounter
from dgrpo.protocol.replay import ReplayGuard
from dgrpo.protocol.validator import MessageValidator
from dgrpo.round.admit import AdmissionStatistics
from dgrpo.round.build import build_node
from dgrpo.round.fill import FillTracker
from dgrpo.round.observer import RoundObserver
from dgrpo.round.receive import RoundInbox
from dgrpo.tasks import get_task

if TYPE_CHECKING:
    from dgrpo.round.tensorboard import TensorBoardObserver

log = logging.getLogger("dgrpo.daemon")


class Daemon(Membership):
    """A node: one lifecycle (identity and state on disk, host, status, heartbeats, join, checkpoints, shutdown)
    around what it exchanges with its peers, ``exchange(self)`` (:mod:`dgrpo.daemon.exchange`; the mode's,
    :func:`dgrpo.daemon.launch.open_daemon` picks it)."""

    def __init__(
        self,
        settings: NodeSettings,
        exchange: Callable[[Daemon], Exchange],
        resume: bool = False,
        allow_fresh: bool = False,
    ) -> None:
        self.settings = settings
        self.resume = resume
        self.allow_fresh = allow_fresh
        check_resume(settings, resume, allow_fresh)
        status = (settings.status.host, settings.status.port) if settings.status.enabled else None
        refuse_taken_chosen_ports(settings.network.listen, status)  # now, not after the model has loaded
        try:
            settings.state_dir.mkdir(parents=True, exist_ok=True)
            save_settings(settings.state_dir, settings.model_dump(mode="json"))  # what --resume alone restores
        except OSError as exc:
            raise ConfigError(
                f"cannot write the state folder {settings.state_dir} ({exc.strerror or exc}); choose another "
                "--state-dir"
            ) from None
        self.remembered_peers = load_peers(settings.state_dir)  # dial candidates from before a restart
        # A SIGKILL during a write leaves its temp file; nothing else would ever remove it.
        for folder in (settings.state_dir, settings.checkpoint_folder):
            remove_orphans(folder)
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        self.identity = load_identity(settings)
        self.peer_id = self.identity.peer_id
        self.nonces = NonceCounter(settings.state_dir / "nonce.json")
        self.replay_path = settings.state_dir / "replay.json"
        limits = settings.limits
        self.replay = ReplayGuard.load_or_create(
            self.replay_path, window=limits.replay_window, max_authors=limits.max_tracked_peers
        )
        self.validator = MessageValidator(settings.run_id, limits, self.replay)
        self.signer = Signer(self.identity, settings.run_id, self.nonces, limits=limits)
        self.checkpoints = CheckpointManager(settings.checkpoint_folder, keep=settings.checkpoint.keep)
        task = get_task(settings.task.name, **settings.task.options)
        # The draw stage's private randomness: nobody without this node's key can predict whom it will draw.
        secret = hashlib.sha256(b"dgrpo/draw-secret\x00" + self.identity.seed).digest()
        self.node = build_node(
            settings, self.peer_id, settings.run_id, task, adversary=settings.adversary, secret=secret
        )
        self.learner = self.node.learner
        # Before any checkpoint is restored: the manifest names the weights every node of the run starts from.
        base = base_weights(self.learner)
        self.base_sha256 = bytes.fromhex(base.sha256)  # what this node's weights descend from (weights sync)
        self.manifest = ManifestService(*hold_manifest(settings, self.identity, base))
        for peer, verdict in refused_at_join().items():  # a bootstrap that served another run's manifest
            self.manifest.record(peer, verdict)
            self.manifest.checked.add(peer)
        self.reputation = self.node.reputation
        self.metrics = NodeMetrics()
        self.counters = NodeCounters()
        self.monitor = PoisonMonitor(
            settings.monitor.detectors, task, lambda name: self.metrics.flagged.labels(detector=name).inc()
        )
        self.metrics_observer = MetricsObserver(self.metrics, task)
        digest = self.learner.weights_digest if settings.status.weights_digest else None
        # Held-out accuracy (eval.every, off by default) first: the history and the round log read it.
        self.held_out = HeldOut(self.node, settings.eval.every, settings.eval.prompts)
        self.history = RoundHistory(accuracy=self.held_out.accuracy_at)  # the live page's curves
        self.observers: list[RoundObserver] = [
            self.held_out,
            self.counters,
            self.monitor,
            self.metrics_observer,
            self.history,
            RoundLog(settings.state_dir / "rounds.jsonl", digest, self.held_out.accuracy_at),
            Blacklister(self._blacklist, lambda peer: self.reputation.rate(peer)[0] if self.reputation else 0.0),
        ]
        self.metrics.registry.register(WireCollector(self._transport_statistics, self._admission_statistics))
        self.asynchronous = settings.rollout.mode == "async"
        self.inbox = RoundInbox(
            self.node.admitter, staleness=settings.rollout.max_staleness if self.asynchronous else 0
        )
        # Async mode's local batch fill (rollout.async_fill): how full a step's peers' share is, recently.
        self.fill = FillTracker() if self.asynchronous and settings.rollout.async_fill else None
        self.node.admitter.on_evidence = self._arrival_evidence
        self.arrival_evidence: Counter[str] = Counter()  # per peer: rollouts beyond its quota (a flood)
        self.round = 0  # the round in progress (or next to run)
        self.rounds_done = 0
        self.errors: deque[str] = deque(maxlen=20)
        self.state = "starting"
        self.transport: Libp2pTransport | None = None
        self.gossip: GossipNode | None = None
        self.status_url: str | None = None
        self.restored_blacklist: list[str] = []
        self.catch_ups = 0  # times this node fell behind and rejoined at the network's round
        self.paced_steps = 0  # async mode: steps that waited for the network to come within reach (_keep_pace)
        self.paced_seconds = 0.0
        self._connected_at_start: set[str] = set()
        self._announce = trio.Event()  # set to send a heartbeat now (after a jump to another round)
        # Light peers (:mod:`dgrpo.daemon.light`): many daemons in one process share one limiter on their torch
        # work and one signal handler, the host's; a daemon of its own process has neither.
        self.limiter: trio.CapacityLimiter | None = None
        self.handle_signals = True
        self.exchange = exchange(self)
        if resume:
            self._restore()
            self.history.load(settings.state_dir / "rounds.jsonl")
        self.tensorboard = self._tensorboard(resume)
        if self.tensorboard is not None:
            self.observers.append(self.tensorboard)

    def _tensorboard(self, resume: bool) -> TensorBoardObserver | None:
        """TensorBoard event files (``logging.tensorboard``, ``--tensorboard``): this node's numbers and its
        held-out accuracy under ``node/``, after the observer that evaluates it. A resumed node hides what the
        run it continues logged from its first round on (written after the checkpoint it resumes from)."""
        folder = self.settings.logging.tensorboard
        if folder is None:
            return None
        from dgrpo.round.tensorboard import TensorBoardObserver  # tensorboard's import, only where it is used

        purge = self.round if resume and self.round else None  # the round it resumes at (0: no checkpoint)
        try:
            return TensorBoardObserver(folder, prefix="node", accuracy=self.held_out.accuracy_at, purge_step=purge)
        except OSError as exc:
            raise ConfigError(
                f"logging.tensorboard: cannot write to {folder} ({exc.strerror or exc}); choose another folder"
            ) from None

    # ----------------------------------------------------------------- checkpoints
    def _restore(self) -> CheckpointState | None:
        state = self.checkpoints.load_latest()
        found = [p.name for p in self.checkpoints.checkpoints()]
        if state is None:
            if found and self.allow_fresh:
                raise FreshStart(f"none of the checkpoints in {self.checkpoints.folder} verifies ({', '.join(found)})")
            if found:
                raise ConfigError(
                    f"--resume: none of the checkpoints in {self.checkpoints.folder} verifies ({', '.join(found)}); "
                    "refusing to start fresh over them (--allow-fresh does, moving them aside)"
                )
            log.warning("--resume: no checkpoint in %s; starting at the first round", self.checkpoints.folder)
            return None
        configured = self.settings.model.name
        saved = state.meta.get("model")
        problem = None
        if saved is not None and saved != configured:
            problem = f"holds model {saved!r}, the configuration names {configured!r}"
        else:
            try:
                self.learner.model.load_state_dict(state.model)
            except RuntimeError as exc:  # another architecture or size under the same name
                problem = f"does not fit the configured model {configured!r} ({str(exc).splitlines()[0]})"
        if problem is not None:
            if self.allow_fresh:
                raise FreshStart(f"the newest valid checkpoint in {self.checkpoints.folder} {problem}")
            raise ConfigError(f"--resume: the newest valid checkpoint in {self.checkpoints.folder} {problem}")
        self.learner.optimizer.load_state_dict(state.optimizer)
        self.rounds_done = int(state.meta.get("rounds_done", state.round))
        self.round = state.round + 1
        # The replay file is written every round, so it is at least as new as the checkpoint's copy.
        if not self.replay_path.exists():
            self.replay.merge(ReplayGuard.from_dict(state.replay))
        self.restored_blacklist = [str(p) for p in state.meta.get("blacklisted", [])]
        self.exchange.restore(state)
        log.info(
            "resumed at round %d from checkpoint (nonce file at %d, %d peers blacklisted)",
            self.round,
            self.nonces.peek(),
            len(self.restored_blacklist),
        )
        return state

    def checkpoint_meta(self) -> dict[str, Any]:
        """What the checkpoint keeps besides the model, optimizer, nonce and replay state."""
        blacklisted = sorted(set(self.gossip.blacklisted()) if self.gossip else set(self.restored_blacklist))
        meta: dict[str, Any] = {
            "peer_id": self.peer_id,
            "model": self.settings.model.name,
            "rounds_done": self.rounds_done,
            "run_id": self.settings.run_id,
            "blacklisted": blacklisted,
        }
        return meta | self.exchange.checkpoint_meta()

    def save_peers(self) -> None:
        """The peers this node knows, for the next start (:mod:`dgrpo.daemon.local_state`)."""
        table = self.transport.peer_table() if self.transport is not None else []
        heard = {p.peer_id for p in table}
        peers = [(p.peer_id, p.last_seen, p.listen_addrs) for p in table if p.peer_id != self.peer_id]
        peers += [(peer, 0.0, addrs) for peer, addrs in self.remembered_peers.items() if peer not in heard]
        save_peers(self.settings.state_dir, peers)

    def save_checkpoint(self) -> None:
        if self.rounds_done == 0:
            return
        path = self.checkpoints.save(
            CheckpointState(
                round=self.round - 1,
                model=self.learner.model.state_dict(),
                optimizer=self.learner.optimizer.state_dict(),
                nonce=self.nonces.peek(),
                replay=self.replay.to_dict(),
                meta=self.checkpoint_meta(),
            )
        )
        log.info("checkpoint %s", path)

    # ----------------------------------------------------------------- status
    def _transport_statistics(self) -> TransportStatistics:
        return self.transport.statistics() if self.transport is not None else TransportStatistics()

    def _admission_statistics(self) -> AdmissionStatistics:
        """Round-level rejections (the admit stage; federated mode: chunk reassembly)."""
        return self.exchange.admission_statistics()

    def _blacklist(self, peer: str, reason: str) -> None:
        if self.transport is not None:
            self.transport.blacklist(peer, reason)

    def _arrival_evidence(self, peer: str, reason: str) -> None:
        """A rollout no honest peer sends (beyond its plan's parts in a round: a flood) counts towards
        blacklisting like a signed-but-invalid message, on any node, with or without a defense chain."""
        self.arrival_evidence[peer] += 1
        if self.arrival_evidence[peer] == self.settings.limits.blacklist_after:
            self._blacklist(peer, f"{self.arrival_evidence[peer]} rollouts rejected as {reason}")

    def snapshot(self) -> dict[str, Any]:
        """What ``/status`` serves (:func:`dgrpo.daemon.snapshot.node_snapshot`, and the exchange's part)."""
        out = node_snapshot(self)
        self.exchange.status(out)
        return out

    def write_node_file(self) -> None:
        info = {
            "peer_id": self.peer_id,
            "listen_addrs": self.gossip.listen_addrs() if self.gossip else [],
            "status_url": self.status_url,
        }
        write_atomically(self.settings.state_dir / "node.json", json.dumps(info, indent=2).encode())

    # ----------------------------------------------------------------- the loop
    async def run(self) -> None:
        s = self.settings
        listen = listen_in_effect(s.network.listen)  # the default port taken: the next free one (logged)
        gossip_cfg = GossipConfig(listen=listen, bootstrap=tuple(s.network.bootstrap), **s.network.gossip)
        keys = self.identity.to_libp2p_keypair()
        async with GossipNode.open(gossip_cfg, keys, s.network.traversal) as gossip:
            if not gossip.local_addrs():  # py-libp2p logs a failed listen and runs on, unreachable
                raise ConfigError(
                    f"network.listen: cannot listen on {listen} (another process took the port as this node "
                    "started?); start it again, or choose another address with --listen"
                )
            self.gossip = gossip
            self.manifest.serve(gossip)
            self.transport = Libp2pTransport(
                gossip, self.signer, self.validator, s.run_id, peer_timeout=s.rounds.peer_timeout_seconds
            )
            plan = self.node.admitter.plan
            self.transport.rollout_quota = plan.parts if plan is not None else None
            self.inbox.on_rejected = self.transport.release_quota  # a rejected rollout gives its slot back
            server = None
            if s.status.enabled:
                port = status_port_in_effect(s.status.host, s.status.port)
                server = StatusServer(s.status.host, port, self.snapshot, self.metrics.registry).start()
                self.status_url = server.url
            self.write_node_file()
            log.info(
                "node %s listening on %s; status %s", self.peer_id, ", ".join(gossip.listen_addrs()), self.status_url
            )
            try:
                async with trio.open_nursery() as nursery:
                    await self.transport.start(nursery)
                    await self._open_topics(nursery)
                    for peer in self.restored_blacklist:
                        self.transport.blacklist(peer, "blacklisted before the restart (checkpoint)")
                    nursery.start_soon(self.inbox.pump, self.transport.inbound())
                    nursery.start_soon(self._heartbeats)
                    nursery.start_soon(gossip.exchange_peers, self.known_peers)
                    nursery.start_soon(self.manifest.audit, gossip)
                    if self.handle_signals:
                        nursery.start_soon(self._signals, nursery.cancel_scope)
                    await self._rounds()
                    nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    await self._shutdown(server)

    def known_peers(self) -> dict[str, tuple[str, ...]]:
        """Peer exchange: the addresses live peers announce in their signed heartbeats, and those of the peers
        known before a restart that have not been heard from since."""
        assert self.transport is not None
        live = self.transport.peers()
        table = self.transport.peer_table()
        heard = {p.peer_id for p in table}
        known = {peer: addrs for peer, addrs in self.remembered_peers.items() if peer not in heard}
        known.update({p.peer_id: p.listen_addrs for p in table if p.peer_id in live})
        return known

    async def _open_topics(self, nursery: trio.Nursery) -> None:
        """Subscribe to what the exchange carries beyond rollouts and control (federated mode's updates)."""
        await self.exchange.open(nursery)

    async def _signals(self, scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("received %s: finishing up", signal.Signals(signum).name)
                self.state = "stopping"
                scope.cancel()
                return

    async def _heartbeats(self) -> None:
        assert self.transport is not None and self.gossip is not None
        while True:
            state_round, state_root, state_base = self.exchange.announcement() or (0, b"", b"")  # weights sync
            body = HeartbeatBody(
                round=self.round,
                rounds_done=self.rounds_done,
                status="stopping" if self.state == "stopping" else "done" if self.state == "done" else "running",
                listen_addrs=tuple(self.gossip.listen_addrs()[:8]),
                state_round=state_round,
                state_root=state_root,
                state_base=state_base,
            )
            try:
                await self.transport.publish_heartbeat(body)
            except Exception as exc:  # a failed heartbeat is logged; the next one may succeed
                self._error(f"heartbeat: {exc}")
            self.transport.round_horizon = self.inbox.horizon = self.rollout_horizon()
            self.gossip.publish_directly_to(self.node.seniority.seniors(self.gossip.config.publish_to_seniors))
            self.metrics.peers.set(len(self.gossip.connected_peers()))
            self.metrics.active_peers.set(len(self.transport.peers()))
            self.metrics.blacklisted.set(len(self.gossip.blacklisted()))
            with trio.move_on_after(self.settings.rounds.heartbeat_seconds):
                await self._announce.wait()
            self._announce = trio.Event()

    async def _join(self) -> None:
        """Wait for ``min_peers`` (bounded: :mod:`dgrpo.daemon.waiting`), then start at the network's current
        round (a late joiner)."""
        assert self.transport is not None and self.gossip is not None
        s = self.settings.rounds
        transport, gossip = self.transport, self.gossip
        if len(transport.peers()) < s.min_peers:
            self.state = "waiting"  # /status and the live page show it
            await wait_for_peers(
                lambda: len(transport.peers()),
                s.min_peers,
                s.start_timeout_seconds,
                lambda: how_to_join(gossip.listen_addrs(), self.manifest.signed.sha256),
                self.settings.network.bootstrap,
            )
            if self.state == "waiting":  # (not when a signal is stopping it)
                self.state = "starting"
        # Give peers one heartbeat period to announce their round, then join the most advanced one.
        await trio.sleep(min(s.heartbeat_seconds, 2.0) if s.min_peers else 0)
        # Peers under way (seniors only, where a resumed node knows some: a Sybil majority cannot place it).
        under_way = [self.progress(p) for p in self.under_way()]
        network_round = joining_round(under_way)
        # A network that has completed rounds is under way; one whose peers are all still in their first
        # round is starting together with us (they waited for us as min_peers, so we get their round 1).
        if under_way and network_round >= max(self.round, 1):
            # The network's current round is under way: its rollouts went out before we were listening, so
            # we join at the next one, which we will see whole.
            log.info("joining at round %d (the network is in round %d)", network_round + 1, network_round)
            self.round = network_round + 1
            self._announce.set()

    async def _rounds(self) -> None:
        await self.exchange.rounds()

    async def _shutdown(self, server: StatusServer | None) -> None:
        self.state = "stopping"
        if self.transport is not None and self.gossip is not None:
            with trio.move_on_after(2):
                await self.transport.publish_heartbeat(
                    HeartbeatBody(round=self.round, rounds_done=self.rounds_done, status="stopping", listen_addrs=())
                )
        self.save_peers()
        await trio.to_thread.run_sync(self.save_checkpoint)
        self.replay.save(self.replay_path)
        self.state = "stopped"
        write_atomically(self.settings.state_dir / "status.json", json.dumps(self.snapshot(), indent=2).encode())
        if self.tensorboard is not None:
            self.tensorboard.close()
        if server is not None:
            server.stop()
        log.info("stopped cleanly after %d rounds", self.rounds_done)
