"""Real daemons, real processes, real libp2p gossipsub on loopback (the testnet harness)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from dgrpo.daemon.testnet import (
    NetNode,
    launch_node,
    rounds_log,
    start_testnet,
    stop_nodes,
    tcp_address,
    wait_rounds,
    wait_until,
)

pytestmark = pytest.mark.slow  # real processes / many rounds: not in the fast tier

FAST = ["rounds.deadline_seconds=20", "rounds.peer_timeout_seconds=6", "checkpoint.every=1"]


def metrics_of(node: NetNode) -> dict[str, float]:
    """A running daemon's /metrics, as {sample line name with labels: value}."""
    assert node.status() is not None and node.status_url is not None
    with urllib.request.urlopen(node.status_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_three_daemons_homogeneous(tmp_path: Path) -> None:
    nodes = start_testnet(3, tmp_path, rounds=3, extra=FAST)
    try:
        assert wait_rounds(nodes, 3, lambda statuses: None, timeout=240)
        # The message counters move: every peer's rollouts (2 x 8 messages per round) and heartbeats
        # passed the protocol's validation on every node.
        for nd in nodes:
            samples = metrics_of(nd)
            assert samples["dgrpo_messages_accepted_total"] >= 2 * 8 * 3
            assert samples["dgrpo_round"] == 3.0
            assert samples["dgrpo_completions_trained_total"] == 3 * 48
    finally:
        assert stop_nodes(nodes), "every daemon exits 0 and writes status.json on SIGTERM"
    peers = {nd.peer_id for nd in nodes}
    logs = [rounds_log(nd)[:3] for nd in nodes]
    for r in range(3):
        rows = [log[r] for log in logs]
        assert {row["round"] for row in rows} == {r + 1}
        for row in rows:
            # every node trained on every node's completions: 3 authors x 8 prompts x 2 completions
            assert set(row["authors"]) == peers, f"round {r + 1}: {row['peer']} missed an author"
            assert row["completions"] == 48
        assert len({row["weights_sha256"] for row in rows}) == 1, f"weights differ after round {r + 1}"
    for nd in nodes:
        status = json.loads((nd.state_dir / "status.json").read_text())
        assert status["rounds_done"] == 3 and status["state"] == "stopped"
        assert status["messages_rejected"] == {}
        assert status["messages_accepted"] > 0
        assert set(status["peers"]) | {nd.peer_id} == peers or status["peers"] == []  # others may have left
        # one run, one creator: node 0 signed the manifest, the others hold it; nobody refused anybody's
        assert status["manifest"]["creator"] == nodes[0].peer_id and status["manifest"]["rejected_by_peer"] == {}
        assert status["manifest"]["origin"] == ("created" if nd is nodes[0] else "kept")


def test_kill_and_resume(tmp_path: Path) -> None:
    nodes = start_testnet(3, tmp_path, rounds=None, extra=FAST)
    victim = nodes[2]
    try:
        wait_until(lambda: len(rounds_log(victim)) >= 2, 240, "two rounds on the victim")
        done_before = len(rounds_log(victim))
        killed_at_round = rounds_log(victim)[-1]["round"]
        nonce_before = json.loads((victim.state_dir / "nonce.json").read_text())
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(timeout=30)
        checkpoints = sorted((victim.state_dir / "checkpoints").glob("round-*.ckpt"))
        assert checkpoints, "checkpoints are written every round"
        last_ckpt_round = int(checkpoints[-1].stem.split("-")[1])
        assert last_ckpt_round >= done_before - 1  # at most the round in flight is lost

        # A peer that vanished mid-round does not stall the others: they close rounds at the deadline.
        wait_until(
            lambda: all(
                any(
                    row["round"] > killed_at_round + 1 and victim.peer_id not in row["authors"]
                    for row in rounds_log(nd)
                )
                for nd in nodes[:2]
            ),
            120,
            "the others to complete a round without the dead peer",
        )
        (victim.state_dir / "node.json").unlink()
        cmd = victim.process.args
        assert isinstance(cmd, list)
        log = open(victim.state_dir / "node.log", "ab")  # noqa: SIM115
        victim.process = subprocess.Popen([*cmd, "--resume"], stdout=log, stderr=subprocess.STDOUT)
        victim.status_url = None
        wait_until(lambda: len(rounds_log(victim)) > done_before, 240, "a round after the restart")
        # the others accept its fresh messages: they train on its completions again, with no replay rejections
        wait_until(
            lambda: all(_trained_on_after(nd, victim.peer_id, killed_at_round + 1) for nd in nodes[:2]),
            120,
            "the others to train on the resumed node's fresh messages",
        )
    finally:
        stop_nodes(nodes)
    nonce_after = json.loads((victim.state_dir / "nonce.json").read_text())
    assert nonce_after["reserved_upto"] > nonce_before["reserved_upto"]
    for nd in nodes[:2]:
        status = json.loads((nd.state_dir / "status.json").read_text())
        assert status["rejected_by_peer"].get(victim.peer_id, 0) == 0, status["messages_rejected"]
        # a peer that vanished is a round that stopped waiting for it: no stack trace, no py-libp2p dial errors
        text = (nd.state_dir / "node.log").read_text()
        assert "Traceback" not in text and "Failed to open TCP stream" not in text, text[-3000:]
    resumed = json.loads((victim.state_dir / "status.json").read_text())
    assert resumed["rounds_done"] > done_before - 1


def _trained_on_after(node: NetNode, author: str, after_round: int) -> bool:
    return any(row["round"] > after_round and author in row["authors"] for row in rounds_log(node))


def test_late_joiner_starts_at_the_current_round(tmp_path: Path) -> None:
    nodes = start_testnet(2, tmp_path, rounds=None, extra=FAST)
    try:
        wait_until(lambda: all(len(rounds_log(nd)) >= 3 for nd in nodes), 240, "three rounds")
        network_round = max(rounds_log(nd)[-1]["round"] for nd in nodes)
        late = launch_node(2, 3, tmp_path, None, [tcp_address(nodes[0])], extra=FAST)
        nodes.append(late)
        wait_until(lambda: len(rounds_log(late)) >= 2, 240, "the late joiner's first two rounds")
        watched, played = rounds_log(late)[:2]
        assert watched["round"] >= network_round, "a late joiner starts at the network's round, not at 1"
        # It took its peers' state, then watched the round in progress (their completions only: it published
        # none, docs/protocol.md "Weights sync"), and plays the next one whole: everyone's completions.
        assert len(watched["authors"]) == 2 and played["round"] == watched["round"] + 1
        assert len(played["authors"]) == 3
    finally:
        stop_nodes(nodes)


def test_python_dash_m_dgrpo_help() -> None:
    out = subprocess.run([sys.executable, "-m", "dgrpo", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "testnet" in out.stdout and "keygen" in out.stdout
