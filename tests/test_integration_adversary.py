"""A malicious daemon joins a real testnet (processes, libp2p gossipsub) like any other node. With no
defense, the honest nodes accept its poisoned completions and train on them; their status counters show it."""

from __future__ import annotations

import json
from pathlib import Path

from dgrpo.node.testnet import start_testnet, stop_nodes, wait_rounds

FAST = ["rounds.deadline_seconds=20", "rounds.peer_timeout_seconds=6", "sampling.max_new_tokens=96"]


def test_text_attacker_poisons_honest_nodes_without_defense(tmp_path: Path) -> None:
    nodes = start_testnet(3, tmp_path, rounds=2, extra=FAST, adversary=("text", 1))
    try:
        assert wait_rounds(nodes, 2, lambda statuses: None, timeout=300)
    finally:
        assert stop_nodes(nodes)
    attacker = nodes[2]
    statuses = [json.loads((nd.state_dir / "status.json").read_text()) for nd in nodes]
    attack = statuses[2]["adversary"]
    assert attack["name"] == "text" and attack["poisoned"] > 0
    assert statuses[0]["adversary"] is None and statuses[1]["adversary"] is None
    for status in statuses[:2]:
        # Accepted (validated, signed, on time) and trained on: nothing in the protocol flags the poison...
        assert status["messages_rejected"] == {}
        assert status["completions_trained_by_author"][attacker.peer_id] > 0
        # ...but the node's poison monitor sees the payload in what it trained on, and from whom.
        monitor = status["poison_monitor"]
        assert monitor["flagged"]["text"] >= attack["poisoned"] // 2
        assert set(monitor["flagged_by_author"]) == {attacker.peer_id}
