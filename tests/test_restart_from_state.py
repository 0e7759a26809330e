"""A node restarted with ``--state-dir DIR --resume`` and no other flag is the node it was: identity, run,
listen address, settings and the peers it knew come from its state (real daemon processes on 127.0.0.1).

Three daemons; B and C know only A as bootstrap. All stop; B and C are restarted with ``--resume`` alone while A
stays down: they find each other from ``peers.json`` (A's address keeps failing, with backoff) and go on with
the rounds after their checkpoints, together."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dgrpo.daemon.testnet import NetNode, rounds_log, stop_nodes, wait_for_node_file, wait_until

pytestmark = pytest.mark.slow

RUN = [
    "--run-id",
    "restart-run",
    "--set",
    "rounds.min_peers=1",
    "--set",
    "rounds.heartbeat_seconds=0.5",
    "--set",
    "rounds.peer_timeout_seconds=4",
    "--set",
    "rounds.deadline_seconds=20",
    "--set",
    "status.port=0",
    "--set",
    "checkpoint.every=1",
    "--set",
    "rollout.prompts_per_round=4",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def launch(index: int, state: Path, args: list[str]) -> NetNode:
    state.mkdir(parents=True, exist_ok=True)
    (state / "node.json").unlink(missing_ok=True)
    log = open(state / "node.log", "ab")  # noqa: SIM115 (kept open for the child's lifetime)
    cmd = [sys.executable, "-m", "dgrpo", "node", "run", "--state-dir", str(state), *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    node = NetNode(index, state, proc, "")
    info = wait_for_node_file(node)
    node.peer_id = str(info["peer_id"])
    return node


def authors_in(node: NetNode, after: int) -> list[set[str]]:
    return [set(r.get("authors") or ()) for r in rounds_log(node) if r.get("round", 0) > after]


def test_resume_needs_no_other_flag_and_finds_known_peers_without_its_bootstrap(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    a = launch(0, tmp_path / "A", ["--listen", f"/ip4/127.0.0.1/tcp/{ports[0]}", *RUN])
    boot = f"/ip4/127.0.0.1/tcp/{ports[0]}/p2p/{a.peer_id}"
    b = launch(1, tmp_path / "B", ["--listen", f"/ip4/127.0.0.1/tcp/{ports[1]}", "--bootstrap", boot, *RUN])
    c = launch(2, tmp_path / "C", ["--listen", f"/ip4/127.0.0.1/tcp/{ports[2]}", "--bootstrap", boot, *RUN])
    nodes = [a, b, c]
    try:
        wait_until(lambda: all((n.status() or {}).get("rounds_done", 0) >= 3 for n in nodes), 240, "3 rounds each")
        wait_until(lambda: c.peer_id in (b.status() or {}).get("connected_peers", []), 60, "B and C connected")
        before = {n.peer_id: (n.status() or {})["rounds_done"] for n in (b, c)}
    finally:
        assert stop_nodes(nodes), "every daemon stops cleanly on SIGTERM"
    saved_b = json.loads((b.state_dir / "peers.json").read_text())
    assert c.peer_id in saved_b and a.peer_id in saved_b, saved_b
    last_round = {n.peer_id: max(r["round"] for r in rounds_log(n)) for n in (b, c)}

    # A stays down. B and C: --state-dir and --resume, nothing else.
    b2 = launch(1, b.state_dir, ["--resume"])
    c2 = launch(2, c.state_dir, ["--resume"])
    again = [b2, c2]
    try:
        assert (b2.peer_id, c2.peer_id) == (b.peer_id, c.peer_id), "the same identities"
        for new in again:
            info = json.loads((new.state_dir / "node.json").read_text())
            assert any(f"/tcp/{ports[new.index]}/" in addr for addr in info["listen_addrs"]), info
        wait_until(
            lambda: all(any({b.peer_id, c.peer_id} <= s for s in authors_in(n, last_round[n.peer_id])) for n in again),
            180,
            "a round after the restart in which B and C trained on each other, without A",
        )
        for n in again:
            st = n.status()
            assert st is not None and st["run_id"] == "restart-run"
            assert st["rounds_done"] > before[n.peer_id], "training state resumed from the checkpoint"
            assert st["manifest"]["origin"] == "kept"
            assert a.peer_id not in st["connected_peers"]
        assert b2.peer_id in (c2.status() or {})["connected_peers"]
    finally:
        assert stop_nodes(again)
