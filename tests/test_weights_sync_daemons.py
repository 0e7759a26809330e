"""Weights sync between real daemons (separate processes, libp2p): two nodes that start together hold one state
round for round, and a third that joins at round 20 takes their state and holds their weights digest within two
rounds of joining (issue 43). The digests are the ones each node writes to its rounds.jsonl after every update
(status.weights_digest, which testnets turn on)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from dgrpo.daemon.testnet import NetNode, launch_node, stop_nodes, tcp_address, wait_rounds

pytestmark = pytest.mark.slow
JOIN_AT = 20
AFTER_JOIN = 4
ONE_PEER = ["rounds.min_peers=1"]


def rounds_log(node: NetNode) -> list[dict[str, Any]]:
    path = node.state_dir / "rounds.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def digests(node: NetNode) -> dict[int, str]:
    return {row["round"]: row["weights_sha256"] for row in rounds_log(node)}


def rounds_log_by_round(node: NetNode) -> dict[int, dict[str, Any]]:
    return {row["round"]: row for row in rounds_log(node)}


def wait_for(check: Any, timeout: float, what: str, nodes: list[NetNode]) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if check():
            return
        dead = [nd.index for nd in nodes if nd.process.poll() is not None]
        assert not dead, f"node(s) {dead} exited while waiting for {what}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_late_joiner_holds_its_peers_weights(tmp_path: Path) -> None:
    first: list[NetNode] = []
    joiner: NetNode | None = None
    try:
        for i in range(2):
            first.append(launch_node(i, 3, tmp_path, None, [tcp_address(nd) for nd in first], extra=ONE_PEER))
        assert wait_rounds(first, JOIN_AT, lambda statuses: None, timeout=300)
        joiner = launch_node(2, 3, tmp_path, None, [tcp_address(nd) for nd in first], extra=ONE_PEER)
        everyone = [*first, joiner]
        wait_for(lambda: len(rounds_log(joiner)) >= AFTER_JOIN, 240, f"{AFTER_JOIN} rounds of the joiner", everyone)
        joined = min(digests(joiner))
        last = max(digests(joiner))
        wait_for(lambda: all(last in digests(nd) for nd in first), 60, "the others to finish that round", everyone)
        status = joiner.status()
    finally:
        assert stop_nodes([*first, *([joiner] if joiner else [])]), "every daemon exits 0 on SIGTERM"
    a, b, c = (digests(nd) for nd in everyone)
    # The two that started together trained together from round 1 and held one state, round for round.
    assert min(a) == min(b) == 1
    assert all(a[r] == b[r] for r in range(1, joined)), "the first two nodes diverged before anyone joined"
    # The joiner joined under way and took their state of the round before the first it has in its log.
    assert joined > JOIN_AT
    assert status is not None
    adopted = status["weights_sync"]["adopted"]
    assert adopted and adopted[0]["why"] == "joined" and adopted[0]["round"] == joined - 1, adopted
    rounds = [r for r in sorted(c) if r in a and r in b]
    table = {r: (a[r][:8], b[r][:8], c[r][:8]) for r in rounds}
    # Its first round is one it watched (trained on its peers' completions, published none): it holds their
    # weights digest from then on ...
    assert c[joined] == a[joined] == b[joined], table
    # ... and every round, a majority of the three holds one state (a joiner whose completions reached one peer
    # before it closed a round and not the other, on a loaded machine, is the odd one out and takes theirs back).
    for r in rounds:
        assert len({a[r], b[r], c[r]}) <= 2, table
    # Its peers waited for it (a young peer in step): both trained on its completions, and all three ended the
    # run with one state.
    joiner = everyone[2].peer_id
    seniors = [rounds_log_by_round(nd) for nd in everyone[:2]]
    assert any(all(joiner in log[r]["authors"] for log in seniors) for r in rounds), table
    assert c[rounds[-1]] == a[rounds[-1]] == b[rounds[-1]], table
