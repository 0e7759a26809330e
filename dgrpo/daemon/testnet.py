"""``dgrpo testnet up``: a local network of daemons, each a separate process on 127.0.0.1.

Modes (what the nodes exchange, ``mode``): ``completions`` (decentralised GRPO) or ``federated`` (Fed-GRPO: node i
is client i of ``n``, node 0 the aggregator of the star topology). Models (``models``): ``homogeneous`` (one
model) or ``heterogeneous`` (the embedded models in turn; completions only).

Node 0 starts first; every later node bootstraps to node 0 and the three started just before it (their
addresses come from each node's ``node.json``); peer exchange finds the others. With ``per_process`` K, K nodes
share a process (light peers, :mod:`dgrpo.daemon.light`).

A live table polls every node's status endpoint; each node's status server also serves a live page at ``/``
(:mod:`dgrpo.daemon.live_page`). With ``rounds``, the nodes run
that many rounds and linger; when all are done they get SIGTERM, write ``node-<i>/status.json`` and exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgrpo.config import needs_seeded_sampler
from dgrpo.daemon.launch import read_node_file
from dgrpo.daemon.log_setup import cli_options  # a testnet's nodes log as the command that started them
from dgrpo.daemon.run_manifest import share_manifest
from dgrpo.daemon.settings import LEGACY_MODES, MODES
from dgrpo.errors import ConfigError, DgrpoError
from dgrpo.protocol.identity import Identity

EMBEDDED_MODELS = ["dgrpo:tiny-arith", "dgrpo:tiny-arith-llama"]
# A federation small enough to run rounds of about a second on a 2-core CPU (the federated integration tests and
# benchmarks/reliability_federated.py): one local step on 4 prompts x 4 completions from 16 prompts per client.
SMALL_FEDERATION = [
    "federated.local_steps=1",
    "federated.prompts_per_step=4",
    "federated.completions_per_prompt=4",
    "federated.partition='iid'",
    "federated.prompts_per_client=16",
    "rounds.deadline_seconds=30",
    "rounds.peer_timeout_seconds=6",
    "checkpoint.every=1",
]


@dataclass
class NetNode:
    index: int
    state_dir: Path
    process: subprocess.Popen[bytes]
    peer_id: str
    status_url: str | None = None

    def _url(self) -> str | None:
        """The status server's address, from ``node.json`` once the node has written it."""
        if self.status_url is None:
            info = read_node_file(self.state_dir)
            self.status_url = info.get("status_url") if info else None
        return self.status_url

    def status(self) -> dict[str, Any] | None:
        url = self._url()
        if url is None:
            return None
        try:
            with urllib.request.urlopen(url + "/status", timeout=2) as resp:
                data: dict[str, Any] = json.loads(resp.read())
                return data
        except (OSError, ValueError):
            return None

    def page_url(self) -> str | None:
        """The node's live page (``/`` of its status server; :mod:`dgrpo.daemon.live_page`)."""
        url = self._url()
        return None if url is None else url + "/"


MODELS = ("homogeneous", "heterogeneous")


def check_testnet_kind(mode: str, models: str) -> None:
    """What the nodes exchange (``mode``: :data:`dgrpo.daemon.settings.MODES`) and which models they run
    (:data:`MODELS`); a :class:`ConfigError` listing the valid values."""
    if mode not in MODES and mode not in LEGACY_MODES:
        raise ConfigError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    if models not in MODELS:
        raise ConfigError(f"unknown model mix {models!r}; valid: {', '.join(MODELS)}")
    if mode == "federated" and models == "heterogeneous":
        raise ConfigError(
            "--models heterogeneous with --mode federated: federated nodes average one model's weights; use "
            "--mode completions for a mix of models"
        )


def node_overrides(
    index: int,
    n: int,
    rounds: int | None,
    run_id: str,
    mode: str,
    defense: list[str],
    extra: list[str],
    adversary: tuple[str, int] | None = None,
    models: str = "homogeneous",
) -> list[str]:
    """The ``--set`` items of node ``index``; with ``adversary=(name, count)`` the last ``count`` nodes attack."""
    sets = [
        f"run_id='{run_id}'",
        "network.listen='/ip4/127.0.0.1/tcp/0'",
        "status.port=0",
        "status.weights_digest=true",
        f"rounds.min_peers={n - 1}",
        "rounds.linger=true",
        "rounds.heartbeat_seconds=0.5",
        "rounds.peer_timeout_seconds=4",
        "rounds.deadline_seconds=60",
    ]
    if rounds is not None:
        sets.append(f"rounds.max_rounds={rounds}")
    if models == "heterogeneous":
        sets.append(f"model.name='{EMBEDDED_MODELS[index % len(EMBEDDED_MODELS)]}'")
    if mode == "federated":  # one client per node; node i trains on partition i
        sets += ["mode='federated'", f"federated.clients={n}", f"federation.client_index={index}"]
        # the shipped fed-* scenarios' local optimizer (their comment says why: top-k keeps SGD's updates)
        sets += ["learner.optimizer='sgd'", "learner.momentum=0.9", "learner.lr=0.01"]
    if defense:
        sets.append(f"defense.chain={json.dumps(defense)}")
        if needs_seeded_sampler(defense):
            sets.append("rollout.sampler='seeded'")
    if adversary is not None and index >= n - adversary[1]:
        sets.append(f"adversary.name={json.dumps(adversary[0])}")
    return [*sets, *extra]


def wait_for_node_file(node: NetNode, timeout: float = 120.0) -> dict[str, Any]:
    t0 = time.time()
    while time.time() - t0 < timeout:
        info = read_node_file(node.state_dir)
        if info and info.get("listen_addrs"):
            return info
        if node.process.poll() is not None:
            tail = log_tail(node.state_dir)
            raise DgrpoError(f"node {node.index} exited with {node.process.returncode}; its node.log ends:\n{tail}")
        time.sleep(0.2)
    raise DgrpoError(f"node {node.index} did not come up within {timeout}s; see {node.state_dir}/node.log")


def node_identity(state: Path) -> Identity:
    """The identity of the node in ``state`` (created there if it has none yet)."""
    state.mkdir(parents=True, exist_ok=True)
    key = state / "identity.key"
    if key.exists():
        return Identity.load(key)
    identity = Identity.generate()
    identity.save(key)
    return identity


def launch_node(
    index: int,
    n: int,
    out: Path,
    rounds: int | None,
    bootstrap: list[str],
    run_id: str = "testnet",
    mode: str = "completions",
    defense: list[str] | None = None,
    extra: list[str] | None = None,
    config: Path | None = None,
    adversary: tuple[str, int] | None = None,
    models: str = "homogeneous",
) -> NetNode:
    """Start daemon ``index`` of an ``n``-node testnet in ``out/node-<index>`` and wait until it listens."""
    state = out / f"node-{index}"
    state.mkdir(parents=True, exist_ok=True)
    for stale in ("node.json", "status.json"):
        (state / stale).unlink(missing_ok=True)
    identity = node_identity(state)
    cmd = [sys.executable, "-m", "dgrpo", *cli_options(), "node", "run", "--state-dir", str(state)]
    if config is not None:
        cmd += ["--config", str(config)]
    for item in node_overrides(index, n, rounds, run_id, mode, defense or [], extra or [], adversary, models):
        cmd += ["--set", item]
    if bootstrap:
        cmd += ["--set", f"network.bootstrap={json.dumps(bootstrap)}"]
    log = open(state / "node.log", "ab")  # noqa: SIM115 (kept open for the child's lifetime)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    node = NetNode(index, state, proc, identity.peer_id)
    wait_for_node_file(node)
    return node


def tcp_address(node: NetNode) -> str:
    info = read_node_file(node.state_dir) or {}
    return next(str(a) for a in info.get("listen_addrs", []) if "/tcp/" in str(a))


def join_command(node: NetNode) -> str:
    """What another machine runs to join the testnet of ``node`` (its run manifest pinned by SHA-256). The
    address is the first routable one it listens on (a testnet listens on 127.0.0.1 unless
    ``--set network.listen='/ip4/0.0.0.0/tcp/0'``)."""
    from dgrpo.daemon.run_manifest import MANIFEST_FILE, load_manifest

    info = read_node_file(node.state_dir) or {}
    addrs = [str(a) for a in info.get("listen_addrs", []) if "/tcp/" in str(a) and "/p2p-circuit" not in str(a)]
    public = [a for a in addrs if not a.startswith(("/ip4/127.", "/ip6/::1/"))]
    signed = load_manifest(node.state_dir / MANIFEST_FILE)
    pin = f" --manifest-sha256 {signed.sha256}" if signed is not None else ""
    return f"dgrpo node join {(public or addrs or ['<address>'])[0]}{pin}"


def scale_overrides(n: int, hosted: bool = False) -> list[str]:
    """Timing for a testnet of ``n`` nodes on one machine. Every message reaches every node about ``degree``
    times (gossipsub's mesh), and py-libp2p spends some 300 us of CPU on each copy (noise, yamux, protobuf,
    its own signature check) before dgrpo's validation; light peers (``hosted``) share one event loop per process,
    where a saturated loop times out handshakes and streams. So past 10 nodes, or with light peers, the heartbeat
    period grows with ``n`` (peers see a node's round from its rollouts, without a heartbeat at each round
    start), the mesh is narrower, and the timeouts grow (``docs/scale.md``)."""
    if n <= 10 and not hosted:
        return []
    beat = max(2.0, round(n / 3, 1))
    return [
        f"rounds.heartbeat_seconds={beat}",
        "rounds.announce_rounds=false",
        f"rounds.peer_timeout_seconds={4 * beat}",
        f"rounds.start_timeout_seconds={max(120.0, 4.0 * n)}",
        f"rounds.deadline_seconds={max(60.0, 2.0 * n)}",
        "network.gossip.degree=4",
        "network.gossip.degree_low=3",
        "network.gossip.degree_high=8",
    ]


def start_testnet(
    n: int,
    out: Path,
    rounds: int | None,
    run_id: str = "testnet",
    mode: str = "completions",
    defense: list[str] | None = None,
    extra: list[str] | None = None,
    config: Path | None = None,
    adversary: tuple[str, int] | None = None,
    per_process: int | None = None,
    torch_workers: int = 1,
    slow: Mapping[int, float] | None = None,
    models: str = "homogeneous",
) -> list[NetNode]:
    """Start ``n`` daemons, each in its own process, or ``per_process`` to a process (light peers,
    :mod:`dgrpo.daemon.light`). Each bootstraps to node 0 and the few started just before it
    (:func:`dgrpo.daemon.light.bootstrap_for`); peer exchange finds the rest. ``slow``: node index -> factor,
    stragglers (the ``--slow`` fault, ``rounds.slowdown``)."""
    from dgrpo.daemon.light import bootstrap_for

    check_testnet_kind(mode, models)
    if n < 1:
        raise ConfigError("a testnet needs at least one node")
    out.mkdir(parents=True, exist_ok=True)
    if mode == "federated":
        # node 0 aggregates (star topology; the decentralised one ignores it): its key is made now to name it
        extra = [f"federation.aggregator='{node_identity(out / 'node-0').peer_id}'", *(extra or [])]
    extra = [*scale_overrides(n, per_process is not None and per_process > 1), *(extra or [])]
    nodes: list[NetNode] = []
    for index in slow or {}:
        if not 0 <= index < n:
            raise ConfigError(f"--slow names node {index}; the testnet has nodes 0 to {n - 1}")
    # One more --set item for the slow nodes; rounds.slowdown is the node's own, not the run's.
    per_node = {i: [*extra, f"rounds.slowdown={factor}"] for i, factor in (slow or {}).items()}
    if per_process is not None and per_process > 1:
        nodes = _start_hosted(
            n, out, rounds, run_id, mode, defense, extra, config, adversary, per_process, torch_workers, per_node,
            models,
        )  # fmt: skip
    else:
        for i in range(n):
            bootstrap = bootstrap_for([tcp_address(nd) for nd in nodes])
            if nodes and models != "heterogeneous":
                share_manifest(nodes[0].state_dir, out / f"node-{i}")
            sets = per_node.get(i, extra)
            nodes.append(
                launch_node(i, n, out, rounds, bootstrap, run_id, mode, defense, sets, config, adversary, models)
            )
    pids = list(dict.fromkeys(nd.process.pid for nd in nodes))
    (out / "testnet.json").write_text(json.dumps({"pids": pids, "peers": [nd.peer_id for nd in nodes]}, indent=2))
    return nodes


def _start_hosted(
    n: int,
    out: Path,
    rounds: int | None,
    run_id: str,
    mode: str,
    defense: list[str] | None,
    extra: list[str],
    config: Path | None,
    adversary: tuple[str, int] | None,
    per_process: int,
    torch_workers: int,
    per_node: Mapping[int, list[str]] | None = None,
    models: str = "homogeneous",
) -> list[NetNode]:
    """Light peers: the first process starts node 0 (the run's creator); once it listens the other processes
    start together, every one bootstrapping to it."""
    from dgrpo.daemon.light import HostedNode, HostPlan

    groups = [list(range(start, min(n, start + per_process))) for start in range(0, n, per_process)]
    nodes: dict[int, NetNode] = {}

    def launch(k: int, bootstrap: list[str]) -> subprocess.Popen[bytes]:
        hosted = []
        for i in groups[k]:
            state = out / f"node-{i}"
            node_identity(state)
            own = (per_node or {}).get(i, extra)
            sets = node_overrides(i, n, rounds, run_id, mode, defense or [], own, adversary, models)
            creator = out / "node-0" if i > 0 and models != "heterogeneous" else None
            hosted.append(HostedNode(state, tuple(sets), config, creator))
            (state / "node.json").unlink(missing_ok=True)
        path = out / f"host-{k}.json"
        HostPlan(tuple(hosted), tuple(bootstrap), torch_workers).dump(path)
        log = open(out / f"host-{k}.log", "ab")  # noqa: SIM115 (kept open for the child's lifetime)
        cmd = [sys.executable, "-m", "dgrpo", *cli_options(), "node", "host", str(path)]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for i in groups[k]:
            nodes[i] = NetNode(i, out / f"node-{i}", proc, node_identity(out / f"node-{i}").peer_id)
        return proc

    launch(0, [])
    wait_for_node_file(nodes[0])
    for k in range(1, len(groups)):
        launch(k, [tcp_address(nodes[0])])
    for i in range(n):
        wait_for_node_file(nodes[i], timeout=120.0 + 5.0 * per_process)
    return [nodes[i] for i in range(n)]


def stop_nodes(nodes: list[NetNode], timeout: float = 60.0) -> bool:
    """SIGTERM every node's process (once: light peers share one) and wait; SIGKILL stragglers. True when all
    stopped cleanly (exit 0, and each node wrote its ``status.json``)."""
    processes = list({id(nd.process): nd.process for nd in nodes}.values())
    for proc in processes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    clean = True
    deadline = time.time() + timeout + 2.0 * len(nodes) / max(1, len(processes))
    for proc in processes:
        try:
            proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            clean = False
        clean = clean and proc.returncode == 0
    return clean and all((nd.state_dir / "status.json").exists() for nd in nodes)


def rounds_log(node: NetNode) -> list[dict[str, Any]]:
    """The rounds a node has logged so far (``rounds.jsonl``; a line being written is skipped)."""
    path = node.state_dir / "rounds.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; :class:`TimeoutError` naming ``what`` after ``timeout`` s."""
    t0 = time.time()
    while not predicate():
        if time.time() - t0 > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.3)


def log_tail(state_dir: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a node's log, so an early exit explains itself in the caller's error."""
    path = state_dir / "node.log"
    if not path.exists():
        return "(no node.log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def wait_rounds(
    nodes: list[NetNode], rounds: int, on_poll: Callable[[list[dict[str, Any] | None]], None], timeout: float
) -> bool:
    t0 = time.time()
    while time.time() - t0 < timeout:
        statuses = [nd.status() for nd in nodes]
        on_poll(statuses)
        if all(s is not None and s.get("rounds_done", 0) >= rounds for s in statuses):
            return True
        dead = [nd.index for nd in nodes if nd.process.poll() is not None]
        if dead:
            tails = "\n".join(
                f"--- node-{i} (exit {nodes[i].process.returncode}):\n{log_tail(nodes[i].state_dir)}" for i in dead
            )
            raise DgrpoError(f"node(s) {dead} exited early; the end of their node.log:\n{tails}")
        time.sleep(1.0)
    return False


def testnet_down(out: Path) -> int:
    """Stop a testnet started in the background (``testnet.json`` in ``out``). Returns how many were signalled."""
    path = out / "testnet.json"
    if not path.exists():
        raise ConfigError(f"no testnet in {out} (missing testnet.json)")
    count = 0
    for pid in json.loads(path.read_text())["pids"]:
        try:
            os.kill(pid, signal.SIGTERM)
            count += 1
        except ProcessLookupError:
            pass
    return count
