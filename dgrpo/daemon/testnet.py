"""``dgrpo testnet up``: a local network of daemons, each a separate process on 127.0.0.1.

Modes: ``homogeneous`` (one model), ``heterogeneous`` (the embedded models in turn), ``federated`` (Fed-GRPO:
node i is client i of ``n``, node 0 the aggregator of the star topology).

Node 0 starts first; every later node bootstraps to all nodes started before it (their addresses come from
each node's ``node.json``). A live table polls every node's status endpoint. With ``rounds``, the nodes run
that many rounds and linger; when all are done they get SIGTERM, write ``node-<i>/status.json`` and exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgrpo.config import needs_seeded_sampler
from dgrpo.daemon.launch import read_node_file
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

    def status(self) -> dict[str, Any] | None:
        if self.status_url is None:
            info = read_node_file(self.state_dir)
            self.status_url = info.get("status_url") if info else None
            if self.status_url is None:
                return None
        try:
            with urllib.request.urlopen(self.status_url + "/status", timeout=2) as resp:
                data: dict[str, Any] = json.loads(resp.read())
                return data
        except (OSError, ValueError):
            return None


def node_overrides(
    index: int,
    n: int,
    rounds: int | None,
    run_id: str,
    mode: str,
    defense: list[str],
    extra: list[str],
    adversary: tuple[str, int] | None = None,
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
    if mode == "heterogeneous":
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
    mode: str = "homogeneous",
    defense: list[str] | None = None,
    extra: list[str] | None = None,
    config: Path | None = None,
    adversary: tuple[str, int] | None = None,
) -> NetNode:
    """Start daemon ``index`` of an ``n``-node testnet in ``out/node-<index>`` and wait until it listens."""
    state = out / f"node-{index}"
    state.mkdir(parents=True, exist_ok=True)
    for stale in ("node.json", "status.json"):
        (state / stale).unlink(missing_ok=True)
    identity = node_identity(state)
    cmd = [sys.executable, "-m", "dgrpo", "node", "run", "--state-dir", str(state)]
    if config is not None:
        cmd += ["--config", str(config)]
    for item in node_overrides(index, n, rounds, run_id, mode, defense or [], extra or [], adversary):
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


def share_manifest(creator: Path, state: Path) -> None:
    """One run, one creator: node 0 signs the run's manifest, the others hold it (their settings are node 0's
    but for local keys), as joiners would, instead of each signing its own and seeing the others' as
    ``wrong_creator``. Not in a heterogeneous testnet: its nodes run different models, each its own run manifest."""
    from dgrpo.daemon.run_manifest import MANIFEST_FILE

    state.mkdir(parents=True, exist_ok=True)
    if not (state / MANIFEST_FILE).exists() and (creator / MANIFEST_FILE).exists():
        shutil.copyfile(creator / MANIFEST_FILE, state / MANIFEST_FILE)


def start_testnet(
    n: int,
    out: Path,
    rounds: int | None,
    run_id: str = "testnet",
    mode: str = "homogeneous",
    defense: list[str] | None = None,
    extra: list[str] | None = None,
    config: Path | None = None,
    adversary: tuple[str, int] | None = None,
) -> list[NetNode]:
    if n < 1:
        raise ConfigError("a testnet needs at least one node")
    out.mkdir(parents=True, exist_ok=True)
    if mode == "federated":
        # node 0 aggregates (star topology; the decentralised one ignores it): its key is made now to name it
        extra = [f"federation.aggregator='{node_identity(out / 'node-0').peer_id}'", *(extra or [])]
    nodes: list[NetNode] = []
    for i in range(n):
        bootstrap = [tcp_address(nd) for nd in nodes]
        if nodes and mode != "heterogeneous":
            share_manifest(nodes[0].state_dir, out / f"node-{i}")
        nodes.append(launch_node(i, n, out, rounds, bootstrap, run_id, mode, defense, extra, config, adversary))
    (out / "testnet.json").write_text(
        json.dumps({"pids": [nd.process.pid for nd in nodes], "peers": [nd.peer_id for nd in nodes]}, indent=2)
    )
    return nodes


def stop_nodes(nodes: list[NetNode], timeout: float = 60.0) -> bool:
    """SIGTERM every node and wait; SIGKILL stragglers. True when all stopped cleanly (exit 0)."""
    for nd in nodes:
        if nd.process.poll() is None:
            nd.process.send_signal(signal.SIGTERM)
    clean = True
    deadline = time.time() + timeout
    for nd in nodes:
        try:
            nd.process.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            nd.process.kill()
            nd.process.wait()
            clean = False
        clean = clean and nd.process.returncode == 0 and (nd.state_dir / "status.json").exists()
    return clean


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
