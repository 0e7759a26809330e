"""A 4-daemon testnet (real processes, libp2p gossipsub) with one `text` attacker and the `logit` defense:
the honest nodes reject the poison, blacklist the attacker, and keep training; their status shows all three."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dgrpo.daemon.testnet import start_testnet, stop_nodes, wait_rounds

pytestmark = pytest.mark.slow  # real processes / many rounds: not in the fast tier

FAST = ["rounds.deadline_seconds=20", "rounds.peer_timeout_seconds=6", "sampling.max_new_tokens=96"]


def test_logit_defense_rejects_poison_and_blacklists_the_attacker(tmp_path: Path) -> None:
    nodes = start_testnet(4, tmp_path, rounds=3, defense=["logit"], extra=FAST, adversary=("text", 1))
    honest, attacker = nodes[:3], nodes[3]
    try:
        assert wait_rounds(honest, 3, lambda statuses: None, timeout=420)
    finally:
        assert stop_nodes(nodes)
    statuses = [json.loads((nd.state_dir / "status.json").read_text()) for nd in honest]
    for status in statuses:
        d = status["defense"]
        assert d["chain"] == ["logit"]
        # 1. The poison is rejected: every completion the attacker got through to the learner was rejected.
        assert d["rejected_by_author"][attacker.peer_id] == d["checked_by_author"][attacker.peer_id] > 0
        assert set(d["rejected_by_reason"]) <= {"logit:outside_top_k"}
        assert status["completions_trained_by_author"].get(attacker.peer_id, 0) == 0
        # 2. The attacker is blacklisted (reputation) at the gossipsub layer.
        assert attacker.peer_id in d["blacklisted"]
        assert attacker.peer_id in status["blacklisted_peers"]
        # 3. Honest training goes on: all rounds done, every honest peer's completions accepted and trained on.
        assert status["rounds_done"] >= 3
        for peer in honest:
            assert status["completions_trained_by_author"][peer.peer_id] >= 3 * 8 * 2
            assert d["rejected_by_author"].get(peer.peer_id, 0) == 0 or peer.peer_id == status["peer_id"]
