"""Federated mode between real daemons: three processes over real libp2p gossipsub, each a Fed-GRPO client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dgrpo.daemon.checkpoint import CheckpointManager
from dgrpo.daemon.testnet import NetNode, start_testnet, stop_nodes, wait_rounds
from dgrpo.federated.params import digest

pytestmark = pytest.mark.slow  # real processes: not in the fast tier

ROUNDS = 3
SMALL = [
    "federated.local_steps=1",
    "federated.prompts_per_step=4",
    "federated.completions_per_prompt=4",
    "federated.partition='iid'",
    "federated.prompts_per_client=16",
    "rounds.deadline_seconds=30",
    "rounds.peer_timeout_seconds=6",
    "checkpoint.every=1",
]


def rounds_log(node: NetNode) -> list[dict[str, Any]]:
    path = node.state_dir / "rounds.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_federation(tmp_path: Path, topology: str, extra: list[str]) -> list[NetNode]:
    nodes = start_testnet(
        3, tmp_path, rounds=ROUNDS, mode="federated", extra=[f"federated.topology='{topology}'", *SMALL, *extra]
    )
    try:
        assert wait_rounds(nodes, ROUNDS, lambda statuses: None, timeout=150)
        statuses = [nd.status() for nd in nodes]
        for st in statuses:
            assert st is not None and st["mode"] == "federated"
            assert st["federated"]["topology"] == topology and st["federated"]["bytes_sent"] > 0
    finally:
        assert stop_nodes(nodes), "every daemon exits 0 and writes status.json on SIGTERM"
    return nodes


def check_identical_rounds(nodes: list[NetNode]) -> list[list[dict[str, Any]]]:
    peers = sorted(nd.peer_id for nd in nodes)
    logs = [rounds_log(nd)[:ROUNDS] for nd in nodes]
    for r in range(ROUNDS):
        rows = [log[r] for log in logs]
        assert {row["round"] for row in rows} == {r + 1}
        for row in rows:
            assert row["applied"], f"round {r + 1}: {row['peer']} applied no global update"
            assert row["clients"] == peers, f"round {r + 1}: {row['peer']} aggregated {row['clients']}"
            assert abs(sum(row["weights"].values()) - 1.0) < 1e-6
        assert len({row["global_sha256"] for row in rows}) == 1, f"global weights differ after round {r + 1}"
    # The weights moved: three rounds of training changed them, differently each round.
    assert len({row["global_sha256"] for row in logs[0]}) == ROUNDS
    return logs


def check_final_state(nodes: list[NetNode], logs: list[list[dict[str, Any]]]) -> None:
    final = logs[0][-1]["global_sha256"]
    for nd in nodes:
        status = json.loads((nd.state_dir / "status.json").read_text())
        assert status["rounds_done"] == ROUNDS and status["state"] == "stopped"
        assert status["weights_sha256"] == final
        assert status["messages_rejected"] == {} and status["round_rejections"] == {}
        # The checkpoint holds the global weights (and the residual and history) at the last round.
        state = CheckpointManager(nd.state_dir / "checkpoints").load_latest()
        assert state is not None and state.round == ROUNDS
        fed = state.meta["federated"]
        assert digest(fed["global"]) == final
        assert fed["residual"].shape == fed["global"].shape and torch.isfinite(fed["residual"]).all()


def test_three_daemons_federated_star(tmp_path: Path) -> None:
    # Sparse updates (10% of the entries, error feedback keeps the rest): several chunks per update.
    nodes = run_federation(tmp_path, "star", ["federated.sparsity.budget=0.1", "federation.chunk_bytes=65536"])
    logs = check_identical_rounds(nodes)
    roles = [log[0]["role"] for log in logs]
    assert roles == ["aggregator", "client", "client"]  # node 0 aggregates
    check_final_state(nodes, logs)
    # With a 10% budget the residual holds what was not sent yet.
    state = CheckpointManager(nodes[1].state_dir / "checkpoints").load_latest()
    assert state is not None and float(state.meta["federated"]["residual"].abs().sum()) > 0.0


def test_three_daemons_federated_decentralised(tmp_path: Path) -> None:
    # Dense updates of the whole model (about 4 MB each, in 32 chunks of 128 KiB).
    nodes = run_federation(tmp_path, "decentralised", ["federated.weighting='signal'"])
    logs = check_identical_rounds(nodes)
    assert all(log[0]["role"] == "aggregator" for log in logs)  # every node aggregates
    check_final_state(nodes, logs)
