"""A malicious daemon joins a real testnet (processes, libp2p gossipsub) like any other node. With no
defense, the honest nodes accept its poisoned completions and train on them; their status counters show it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dgrpo.daemon.testnet import start_testnet, stop_nodes, wait_rounds

pytestmark = pytest.mark.slow  # real processes / many rounds: not in the fast tier

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


def test_code_attacker_among_daemons_scored_in_the_real_sandbox(tmp_path: Path) -> None:
    # The CODE attack over real gossipsub: every node runs every peer's program in the bubblewrap sandbox, one
    # batch per round, and reports how those runs ended in /status (and /metrics).
    code = ["task.name='arith-code'", "model.name='dgrpo:tiny-arith-code-text'"]
    nodes = start_testnet(3, tmp_path, rounds=2, extra=[*FAST, *code], adversary=("code", 1))
    try:
        assert wait_rounds(nodes, 2, lambda statuses: None, timeout=300)
    finally:
        assert stop_nodes(nodes)
    statuses = [json.loads((nd.state_dir / "status.json").read_text()) for nd in nodes]
    assert statuses[2]["adversary"]["poisoned"] > 0
    for status in statuses[:2]:
        reward = status["reward"]
        assert reward["isolation"] == "bwrap"
        # 3 authors' programs per round; the poisoned ones import calc and still print the answer
        assert reward["sandbox_batches"] >= 2
        assert reward["sandbox_ok"] > 0
        runs = sum(v for k, v in reward.items() if k.startswith("sandbox_") and k != "sandbox_batches")
        # every completion trained on that holds a program was run (one without a program scores 0 unrun)
        assert status["completions_trained"] / 2 < runs <= status["completions_trained"]
        assert status["poison_monitor"]["flagged"]["code"] > 0


def test_an_over_publishing_daemon_is_held_to_its_share_and_blacklisted_on_evidence(tmp_path: Path) -> None:
    # Over real gossipsub: the attacker sends 4x its share of genuine seeded draws per prompt. Every honest
    # daemon rejects each such rollout (over_share, counted against the attacker), trains on none of them, and
    # the evidence (3 rollouts no honest peer would send) blacklists it whatever its honest completions.
    nodes = start_testnet(3, tmp_path, rounds=2, defense=["sampling-proof"], extra=FAST, adversary=("over-publish", 1))
    try:
        assert wait_rounds(nodes, 2, lambda statuses: None, timeout=300)
    finally:
        assert stop_nodes(nodes)
    attacker = nodes[2].peer_id
    statuses = [json.loads((nd.state_dir / "status.json").read_text()) for nd in nodes]
    assert statuses[2]["adversary"]["poisoned"] > 0
    for status in statuses[:2]:
        assert status["round_rejections"]["over_share"] >= 3
        assert status["round_rejections_by_peer"][attacker] >= 3
        assert attacker not in status["completions_trained_by_author"]
        reputation = status["defense"]["reputation"][attacker]
        assert reputation["evidence"] >= 3 and reputation["blacklisted"]
        assert attacker in status["defense"]["blacklisted"]
