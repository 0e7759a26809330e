"""Light peers: many daemons in one OS process (``dgrpo node host PLAN``), for testnets at scale (issue 24).

A daemon of its own costs about 600 MB of RSS, nearly all of it torch and transformers; 24 GiB held about 35.
Here the libraries are loaded once per process and each hosted node keeps only what is its own: its identity key,
its libp2p host (its own TCP listener, noise handshakes and gossipsub router: real processes and real gossipsub,
not the in-memory network), its model and optimizer, its state directory, status server and ``node.log``. They
share the process's trio loop, one signal handler (SIGINT/SIGTERM stop every node cleanly, each writing its
checkpoint and ``status.json``) and one :class:`trio.CapacityLimiter` on their torch work, so twenty nodes'
generations and updates take turns on the cores instead of thrashing them.

A node that fails is logged in its own ``node.log`` and the others go on; the process exits non-zero if any did.

Plan (JSON)::

    {"bootstrap": ["/ip4/127.0.0.1/tcp/4001/p2p/..."],        # addresses of nodes in other processes
     "torch_workers": 2,                                       # torch work at once in this process
     "nodes": [{"state_dir": "net/node-20", "sets": ["run_id='testnet'", ...], "config": null,
                "manifest_from": "net/node-0"}, ...]}

Nodes start one after the other; each bootstraps to the first address known and the ``BOOTSTRAP_RECENT`` most
recently started (peer exchange finds the rest: a hundred nodes each dialling every earlier one would be ten
thousand handshakes), then waits for ``rounds.min_peers`` as any daemon does.
"""

from __future__ import annotations

import contextvars
import json
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

import trio

from dgrpo.daemon.daemon import Daemon
from dgrpo.daemon.log_setup import PeerHangupFilter, chosen, formatter

log = logging.getLogger("dgrpo.light")
BOOTSTRAP_RECENT = 3
_NODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("dgrpo_light_node", default=None)


@dataclass(frozen=True)
class HostedNode:
    state_dir: Path
    sets: tuple[str, ...] = ()
    config: Path | None = None
    manifest_from: Path | None = None  # share this node's run manifest (a testnet is one run, one creator)


@dataclass(frozen=True)
class HostPlan:
    nodes: tuple[HostedNode, ...]
    bootstrap: tuple[str, ...] = ()
    torch_workers: int = 2

    @classmethod
    def load(cls, path: Path) -> HostPlan:
        data = json.loads(path.read_text())
        nodes = tuple(
            HostedNode(
                Path(n["state_dir"]),
                tuple(n.get("sets", ())),
                Path(n["config"]) if n.get("config") else None,
                Path(n["manifest_from"]) if n.get("manifest_from") else None,
            )
            for n in data["nodes"]
        )
        return cls(nodes, tuple(data.get("bootstrap", ())), int(data.get("torch_workers", 2)))

    def dump(self, path: Path) -> None:
        nodes = [
            {
                "state_dir": str(n.state_dir),
                "sets": list(n.sets),
                "config": str(n.config) if n.config else None,
                "manifest_from": str(n.manifest_from) if n.manifest_from else None,
            }
            for n in self.nodes
        ]
        data = {"bootstrap": list(self.bootstrap), "torch_workers": self.torch_workers, "nodes": nodes}
        path.write_text(json.dumps(data, indent=2))


def bootstrap_for(known: list[str], recent: int = BOOTSTRAP_RECENT) -> list[str]:
    """The first address known (node 0, the run's creator) and the ``recent`` latest, without repeats."""
    picked = known[:1] + known[-recent:]
    return list(dict.fromkeys(picked))


class _PerNodeHandler(logging.Handler):
    """Routes a record to the ``node.log`` of the hosted node whose task (or worker thread: trio copies the
    context into it) logged it; records of no node go to the process's own handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, logging.Handler] = {}

    def add(self, name: str, path: Path) -> None:
        handler = logging.FileHandler(path)
        handler.setFormatter(formatter(chosen().format))  # as a daemon of its own would log (node run's)
        handler.addFilter(PeerHangupFilter())
        self.files[name] = handler

    def emit(self, record: logging.LogRecord) -> None:
        name = _NODE.get()
        target = self.files.get(name) if name is not None else None
        if target is not None:
            target.handle(record)

    def close(self) -> None:
        for handler in self.files.values():
            handler.close()
        super().close()


class _OnlyUnhosted(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _NODE.get() is None


@dataclass
class LightHost:
    plan: HostPlan
    daemons: list[Daemon] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    async def run(self) -> None:
        from dgrpo.daemon.launch import open_daemon, read_node_file
        from dgrpo.daemon.run_manifest import share_manifest
        from dgrpo.daemon.settings import load_node_settings

        per_node = _PerNodeHandler()
        root = logging.getLogger()
        for handler in root.handlers:
            handler.addFilter(_OnlyUnhosted())
        root.addHandler(per_node)
        limiter = trio.CapacityLimiter(max(1, self.plan.torch_workers))
        known = list(self.plan.bootstrap)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._signals, nursery.cancel_scope)
                async with trio.open_nursery() as nodes:
                    for hosted in self.plan.nodes:
                        name = str(hosted.state_dir)
                        hosted.state_dir.mkdir(parents=True, exist_ok=True)
                        for stale in ("node.json", "status.json"):
                            (hosted.state_dir / stale).unlink(missing_ok=True)
                        per_node.add(name, hosted.state_dir / "node.log")
                        if hosted.manifest_from is not None:
                            share_manifest(hosted.manifest_from, hosted.state_dir)
                        sets = [f"state_dir={json.dumps(str(hosted.state_dir))}", *hosted.sets]
                        if known:
                            sets.append(f"network.bootstrap={json.dumps(bootstrap_for(known))}")
                        token = _NODE.set(name)
                        try:
                            settings = load_node_settings(hosted.config, sets)
                            daemon = await trio.to_thread.run_sync(open_daemon, settings)
                        except Exception:
                            log.exception("node %s could not start", name)
                            self.failed.append(name)
                            continue
                        finally:
                            _NODE.reset(token)
                        daemon.limiter = limiter
                        daemon.handle_signals = False
                        self.daemons.append(daemon)
                        nodes.start_soon(self._run_one, daemon, name, name=name)
                        with trio.move_on_after(60):
                            while not (read_node_file(hosted.state_dir) or {}).get("listen_addrs"):
                                await trio.sleep(0.05)
                        info = read_node_file(hosted.state_dir) or {}
                        known += [a for a in info.get("listen_addrs", []) if "/tcp/" in a][:1]
                    log.info("hosting %d nodes (%d failed to start)", len(self.daemons), len(self.failed))
                nursery.cancel_scope.cancel()  # every node finished: stop listening for signals
        finally:
            root.removeHandler(per_node)
            per_node.close()

    async def _run_one(self, daemon: Daemon, name: str) -> None:
        _NODE.set(name)  # this task's context (a copy): its libp2p tasks and worker threads inherit it
        try:
            await daemon.run()
        except Exception:
            log.exception("node %s failed", name)
            self.failed.append(name)

    async def _signals(self, scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("received %s: stopping %d nodes", signal.Signals(signum).name, len(self.daemons))
                for daemon in self.daemons:
                    daemon.state = "stopping"
                scope.cancel()
                return


def run_host(plan: HostPlan) -> int:
    """Run every node of ``plan`` in this process until all are done or a signal stops them; 1 if any failed."""
    host = LightHost(plan)
    trio.run(host.run)
    return 1 if host.failed else 0
