"""Federated mode between real daemons: three processes over real libp2p gossipsub, each a Fed-GRPO client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dgrpo.daemon.checkpoint import CheckpointManager
from dgrpo.daemon.testnet import (
    SMALL_FEDERATION,
    NetNode,
    launch_node,
    node_identity,
    start_testnet,
    stop_nodes,
    tcp_address,
    wait_rounds,
)
from dgrpo.federated.params import digest

pytestmark = pytest.mark.slow  # real processes: not in the fast tier

ROUNDS = 3


def rounds_log(node: NetNode) -> list[dict[str, Any]]:
    path = node.state_dir / "rounds.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_federation(tmp_path: Path, topology: str, extra: list[str]) -> list[NetNode]:
    extra = [f"federated.topology='{topology}'", *SMALL_FEDERATION, *extra]
    nodes = start_testnet(3, tmp_path, rounds=ROUNDS, mode="federated", extra=extra)
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
    board = tmp_path / "tb"
    extra = ["federated.sparsity.budget=0.1", "federation.chunk_bytes=65536", f"logging.tensorboard='{board}'"]
    nodes = run_federation(tmp_path, "star", extra)
    logs = check_identical_rounds(nodes)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(board))
    events.Reload()
    assert {e.step for e in events.Scalars("node/local_mean")} == set(range(1, ROUNDS + 1))  # every round logged
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


def run_late_join(tmp_path: Path, topology: str) -> tuple[list[NetNode], NetNode]:
    """Two daemons complete rounds; a third (client 2 of 3) joins, syncs the global state and trains one round."""
    extra = [
        f"federated.topology='{topology}'",
        *SMALL_FEDERATION,
        f"federation.aggregator='{node_identity(tmp_path / 'node-0').peer_id}'",
    ]
    first: list[NetNode] = []
    joiner: NetNode | None = None
    try:
        for i in range(2):  # they start without the third: one peer is enough to begin
            bootstrap = [tcp_address(nd) for nd in first]
            first.append(
                launch_node(i, 3, tmp_path, None, bootstrap, mode="federated", extra=[*extra, "rounds.min_peers=1"])
            )
        assert wait_rounds(first, 2, lambda statuses: None, timeout=150)
        joiner = launch_node(2, 3, tmp_path, None, [tcp_address(nd) for nd in first], mode="federated", extra=extra)
        assert wait_rounds([joiner], 3, lambda statuses: None, timeout=150)
        # ... and the others finish that round too, so that every log has it
        assert wait_rounds(first, rounds_log(joiner)[2]["round"], lambda statuses: None, timeout=90)
    finally:
        assert stop_nodes([*first, *([joiner] if joiner else [])]), "every daemon exits 0 on SIGTERM"
    assert joiner is not None
    return first, joiner


def explain(logs: list[dict[int, dict[str, Any]]], r: int) -> str:
    """Each node's rows around round ``r``: whom it aggregated, waited for in vain, found stale; whether it diverged."""

    def short(value: Any) -> Any:  # peer ids and hashes by their last 6 characters
        return [short(v) for v in value] if isinstance(value, list) else value[-6:] if isinstance(value, str) else value

    keys = ("global_sha256", "clients", "missing", "stale", "diverged", "seconds")
    return "\n".join(
        f"node {i} round {q}: " + ", ".join(f"{k}={short(log[q].get(k))}" for k in keys)
        for i, log in enumerate(logs)
        for q in (r - 1, r, r + 1)
        if q in log
    )


def check_late_joiner(first: list[NetNode], joiner: NetNode) -> None:
    status = json.loads((joiner.state_dir / "status.json").read_text())
    synced = status["federated"]["sync"]["joined_from"]
    assert synced is not None, "the joiner took the global state from a peer"
    # The daemons were stopped at any point: compare the rounds every log has.
    logs = [{row["round"]: row for row in rounds_log(nd)} for nd in [*first, joiner]]
    common = sorted(set(logs[0]) & set(logs[1]) & set(logs[2]))
    assert common and common[0] == synced["round"] + 1, "the joiner's first round follows the state it took"
    # It joined a federation under way: the weights it started from were not the federation's at that round,
    # so without the sync its hash could not match.
    assert synced["round"] >= 2 and synced["global_sha256"] == logs[0][synced["round"]]["global_sha256"]
    assert synced["replaced_sha256"] != synced["global_sha256"]
    for r in common:
        rows = [log[r] for log in logs]
        # A node that closed a round with another set of updates (the heartbeat announcing the joiner's start
        # round can reach a peer late), or with none (the global update reached it after its deadline on a
        # loaded machine), finds out at the next round, flags it and takes the federation's state over: its
        # rows of both rounds are not the federation's. Every other row must have applied one and agree.
        healed = [log[r].get("diverged") or log.get(r + 1, {}).get("diverged") for log in logs]
        assert not all(healed), f"round {r}: every node diverged"
        assert all(row["applied"] for row, h in zip(rows, healed, strict=True) if not h), (
            f"round {r}: a node applied no global update and did not find out"
        )
        agreed = {row["global_sha256"] for row, h in zip(rows, healed, strict=True) if not h}
        assert len(agreed) == 1, f"global weights differ after round {r}:\n{explain(logs, r)}"
    last = [log[common[-1]] for log in logs]
    assert len({row["global_sha256"] for row in last}) == 1 and not any(row["diverged"] for row in last)
    assert not any(reason.startswith("sync_") for reason in status["round_rejections"])
    served = [json.loads((nd.state_dir / "status.json").read_text())["federated"]["sync"]["served"] for nd in first]
    assert sum(served) >= 1


def test_late_joiner_syncs_the_global_weights_star(tmp_path: Path) -> None:
    first, joiner = run_late_join(tmp_path, "star")
    check_late_joiner(first, joiner)
    status = json.loads((joiner.state_dir / "status.json").read_text())
    assert status["federated"]["sync"]["joined_from"]["peer"] == first[0].peer_id  # the aggregator served it
    assert status["federated"]["aggregator"] == first[0].peer_id


def test_late_joiner_syncs_the_global_weights_decentralised(tmp_path: Path) -> None:
    first, joiner = run_late_join(tmp_path, "decentralised")
    check_late_joiner(first, joiner)


@pytest.mark.parametrize("topology", ["decentralised", "star"])
def test_a_node_that_diverged_takes_the_federations_weights_over(tmp_path: Path, topology: str) -> None:
    """Node 2 starts from other initial weights (its LoRA adapters drawn with another seed). Its round-1
    update names a base nobody else holds: the aggregating nodes leave it out (stale_base), and node 2 finds
    out (decentralised: most updates name another base; star: the global update does) and takes the state
    of round 1 over from its peers; from round 2 all agree."""
    extra = [
        f"federated.topology='{topology}'", *SMALL_FEDERATION, "model.lora={r=4}",
        f"federation.aggregator='{node_identity(tmp_path / 'node-0').peer_id}'",
    ]  # fmt: skip
    nodes: list[NetNode] = []
    try:
        for i in range(3):
            own = ["learner.seed=7"] if i == 2 else []
            bootstrap = [tcp_address(nd) for nd in nodes]
            nodes.append(launch_node(i, 3, tmp_path, ROUNDS, bootstrap, mode="federated", extra=[*extra, *own]))
        assert wait_rounds(nodes, ROUNDS, lambda statuses: None, timeout=150)
    finally:
        assert stop_nodes(nodes), "every daemon exits 0 on SIGTERM"
    logs = [rounds_log(nd)[:ROUNDS] for nd in nodes]
    odd = nodes[2].peer_id
    aggregating = [0, 1] if topology == "decentralised" else [0]
    first = [log[0] for log in logs]
    assert [row["diverged"] for row in first] == [False, False, True]
    for i in aggregating:  # its update was left out, not added to their weights
        assert first[i]["stale"] == [odd] and odd not in first[i]["clients"]
    assert first[0]["global_sha256"] == first[1]["global_sha256"]
    assert first[2]["global_sha256"] != first[0]["global_sha256"]  # before the re-sync it was elsewhere
    for r in range(1, ROUNDS):
        rows = [log[r] for log in logs]
        assert len({row["global_sha256"] for row in rows}) == 1, f"global weights differ after round {r + 1}"
        assert all(row["clients"] == sorted(nd.peer_id for nd in nodes) and not row.get("stale") for row in rows)
    statuses = [json.loads((nd.state_dir / "status.json").read_text()) for nd in nodes]
    resync = statuses[2]["federated"]["sync"]
    assert resync["resyncs"] == 1 and resync["last_resync"]["ok"] and resync["last_resync"]["round"] == 1
    assert resync["last_resync"]["global_sha256"] == first[0]["global_sha256"]
    assert resync["joined_from"] is None  # it started with the others; it re-synced, it did not join
    for i, st in enumerate(statuses[:2]):
        expected = ({"stale_base": 1}, {odd: 1}) if i in aggregating else ({}, {})
        assert (st["round_rejections"], st["round_rejections_by_peer"]) == expected
        assert st["federated"]["sync"]["resyncs"] == 0
    assert len({st["weights_sha256"] for st in statuses}) == 1
