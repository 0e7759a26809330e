"""The federated daemon without the network: settings, testnet wiring, checkpoints and ``--resume``."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
import trio

from dgrpo.daemon.daemon import Daemon
from dgrpo.daemon.federated import FederatedDaemon
from dgrpo.daemon.settings import load_node_settings
from dgrpo.daemon.testnet import node_overrides
from dgrpo.errors import ConfigError
from dgrpo.federated.client import GlobalStats
from dgrpo.federated.params import digest, flat_parameters
from dgrpo.net.p2p import PeerInfo


def settings(tmp_path: Path, *extra: str) -> list[str]:
    return [f"state_dir={str(tmp_path)!r}", "status.enabled=false", "mode='federated'", *extra]


def test_mode_settings_and_testnet_overrides(tmp_path: Path) -> None:
    s = load_node_settings(None, settings(tmp_path, "federated.clients=3", "federation.client_index=2"))
    assert s.mode == "federated" and s.federated is not None and s.federated.clients == 3
    assert s.federation.client_index == 2 and s.federation.chunk_bytes == 128 * 1024
    assert load_node_settings(None, [f"state_dir={str(tmp_path)!r}"]).mode == "httt"
    with pytest.raises(ConfigError):
        load_node_settings(None, settings(tmp_path, "mode='gossip'"))
    sets = node_overrides(1, 3, 3, "net", "federated", [], [])
    assert {"mode='federated'", "federated.clients=3", "federation.client_index=1"} <= set(sets)


def test_daemon_refuses_a_simulation_baseline_or_a_client_beyond_the_federation(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="centralized"):
        FederatedDaemon(load_node_settings(None, settings(tmp_path, "federated.method='centralized'")))
    with pytest.raises(ConfigError, match="client_index"):
        FederatedDaemon(
            load_node_settings(None, settings(tmp_path, "federated.clients=2", "federation.client_index=2"))
        )


def test_checkpoint_holds_global_weights_residual_and_history(tmp_path: Path) -> None:
    sets = settings(
        tmp_path,
        "federated.clients=3",
        "federated.prompts_per_client=64",
        "federation.client_index=1",
        "federated.topology='decentralised'",
    )
    first = FederatedDaemon(load_node_settings(None, sets))
    assert isinstance(first, Daemon) and first.snapshot()["mode"] == "federated"
    size = first.model_size
    first.global_flat = first.global_flat + 0.01  # as after a round's aggregation
    first.global_stats = GlobalStats(0.4, 0.2)
    first.aggregator.history = {"peerA": 0.3}
    first.residual = torch.linspace(-1, 1, size)
    first.rounds_done, first.round = 2, 3
    first.save_checkpoint()

    again = FederatedDaemon(load_node_settings(None, sets), resume=True)
    assert again.round == 3 and again.rounds_done == 2
    assert torch.equal(again.global_flat, first.global_flat) and again.global_digest == digest(first.global_flat)
    assert torch.equal(flat_parameters(again.learner.model), first.global_flat)  # the learner starts from it
    assert again.residual is not None and torch.equal(again.residual, first.residual)
    assert again.aggregator.history == {"peerA": 0.3} and again.global_stats == GlobalStats(0.4, 0.2)
    assert again.client_index == 1
    status = again.snapshot()["federated"]
    assert status["global_sha256"] == again.global_digest and status["topology"] == "decentralised"
    assert status["role"] == "aggregator" and status["global_stats"] == {"mean": 0.4, "std": 0.2}
    # the client built at the first round carries the restored residual and trains on its own partition
    again.transport = FakeTransport()  # type: ignore[assignment]
    client = again._setup_client()
    assert torch.equal(client.feedback.residual, first.residual) and client.name == again.peer_id
    assert len(client.sources) == 1 and len(client.sources[0][1]) == 64


class FakeTransport:
    def peers(self) -> set[str]:
        return set()


def test_cli_modes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dgrpo.cli import app

    runner = CliRunner()
    bad_mode = runner.invoke(app, ["node", "run", "--mode", "gossip", "--state-dir", str(tmp_path)])
    assert bad_mode.exit_code != 0 and "federated, httt" in bad_mode.output
    bad_topology = runner.invoke(app, ["testnet", "up", "--topology", "star", "--out", str(tmp_path)])
    assert bad_topology.exit_code != 0 and "--mode federated" in bad_topology.output
    assert "federated" in runner.invoke(app, ["testnet", "up", "--help"]).output


def test_state_sync_serves_and_takes_over_the_global_state(tmp_path: Path) -> None:
    from dgrpo.net.state_sync import GlobalState
    from dgrpo.protocol.sync import decode_header

    sets = settings(tmp_path, "federated.clients=3", "federation.client_index=1", "federated.topology='star'")
    d = FederatedDaemon(load_node_settings(None, sets))
    d.aggregator_id = "12D3KooWaggregator"
    d.global_flat = d.global_flat + 0.5
    d.global_digest = digest(d.global_flat)
    d.aggregator.history = {"peerA": 0.25}
    trio.run(d._serve_snapshot, 3)
    snap = d.sync_server.snapshot
    assert snap is not None and snap.round == 3
    header = decode_header(snap.head[4:])
    assert header.sha256.hex() == d.global_digest and header.size == 4 * d.model_size
    assert header.aggregator == "12D3KooWaggregator" and header.history == {"peerA": 0.25} and header.mean is None

    d.residual = torch.ones(d.model_size)  # as restored from an older checkpoint
    old = d.global_digest
    weights = torch.linspace(-1, 1, d.model_size)
    state = GlobalState(7, weights, digest(weights), GlobalStats(0.4, 0.2), "12D3KooWother", {"peerB": 0.5}, "src")
    trio.run(d._adopt, state, 7)
    assert torch.equal(d.global_flat, weights) and d.global_digest == digest(weights)
    assert torch.equal(flat_parameters(d.learner.model), weights)  # the learner starts from it
    assert d.round == 8 and d.global_stats == GlobalStats(0.4, 0.2) and d.aggregator_id == "12D3KooWother"
    assert d.aggregator.history == {"peerB": 0.5} and d.residual is None  # error feedback restarts at zero
    assert d.synced == {"peer": "src", "round": 7, "global_sha256": digest(weights), "replaced_sha256": old}
    assert d.sync_server.snapshot is not None and d.sync_server.snapshot.round == 7  # it serves what it took
    assert d.snapshot()["federated"]["sync"] == {
        "served": 0, "joined_from": d.synced, "resyncs": 0, "last_resync": None,
    }  # fmt: skip


def test_a_diverged_node_takes_the_state_over_and_says_so(tmp_path: Path) -> None:
    from dgrpo.federated.sparse import ErrorFeedback
    from dgrpo.net.state_sync import GlobalState

    sets = settings(tmp_path, "federated.clients=3", "federation.client_index=1", "federated.topology='decentralised'")
    d = FederatedDaemon(load_node_settings(None, sets))
    d.client = types.SimpleNamespace(feedback=ErrorFeedback(d.model_size, torch.ones(d.model_size)))  # type: ignore[assignment]
    d.synced = {"peer": "first-join"}
    old = d.global_digest
    weights = torch.linspace(-1, 1, d.model_size)
    state = GlobalState(4, weights, digest(weights), None, None, {}, "src")

    async def fake_sync(target: int) -> GlobalState:
        assert target == 4
        await d._adopt(state, target)
        return state

    d._sync = fake_sync  # type: ignore[method-assign]
    d.round = 5  # the loop moved on to the next round before re-syncing
    trio.run(d._resync, 4)
    assert d.round == 5 and torch.equal(d.global_flat, weights)
    assert d.client is not None and int(d.client.feedback.residual.count_nonzero()) == 0  # residual reset
    assert d.synced == {"peer": "first-join"}  # a re-sync is not a join
    sync = d.snapshot()["federated"]["sync"]
    assert sync["resyncs"] == 1
    assert sync["last_resync"] == {
        "round": 4, "peer": "src", "replaced_sha256": old, "global_sha256": digest(weights), "ok": True,
    }  # fmt: skip


def test_a_joining_peer_is_not_waited_for_after_the_first_round(tmp_path: Path) -> None:
    d = FederatedDaemon(load_node_settings(None, settings(tmp_path, "federated.clients=3")))
    table = [PeerInfo("joining", 0, 0, "running", 0.0), PeerInfo("behind", 4, 3, "running", 0.0)]
    d.transport = TableTransport(table)  # type: ignore[assignment]
    assert d.expected_peers(1) == {"joining"}  # a federation starting together: everyone is at round 0
    assert d.expected_peers(5) == {"behind"}  # past round 1, round 0 means joining: it starts after this round


class TableTransport:
    def __init__(self, table: list[PeerInfo]) -> None:
        self.table = table

    def peers(self) -> set[str]:
        return {p.peer_id for p in self.table}

    def peer_table(self) -> list[PeerInfo]:
        return self.table
