"""The federated daemon without the network: settings, testnet wiring, checkpoints and ``--resume``."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
import trio

from dgrpo.daemon.daemon import Daemon
from dgrpo.daemon.federated import FederatedExchange
from dgrpo.daemon.launch import open_daemon
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
    assert load_node_settings(None, [f"state_dir={str(tmp_path)!r}"]).mode == "completions"
    # the completion exchange's old name still reads (old state folders, saved settings), as the new one
    assert load_node_settings(None, [f"state_dir={str(tmp_path)!r}", "mode='httt'"]).mode == "completions"
    with pytest.raises(ConfigError):
        load_node_settings(None, settings(tmp_path, "mode='gossip'"))
    sets = node_overrides(1, 3, 3, "net", "federated", [], [])
    assert {"mode='federated'", "federated.clients=3", "federation.client_index=1"} <= set(sets)


def test_daemon_refuses_a_simulation_baseline_or_a_client_beyond_the_federation(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="centralized"):
        open_daemon(load_node_settings(None, settings(tmp_path, "federated.method='centralized'")))
    with pytest.raises(ConfigError, match="client_index"):
        open_daemon(load_node_settings(None, settings(tmp_path, "federated.clients=2", "federation.client_index=2")))


def test_checkpoint_holds_global_weights_residual_and_history(tmp_path: Path) -> None:
    sets = settings(
        tmp_path,
        "federated.clients=3",
        "federated.prompts_per_client=64",
        "federation.client_index=1",
        "federated.topology='decentralised'",
    )
    first = open_daemon(load_node_settings(None, sets))
    ff = fed(first)
    assert isinstance(first.exchange, FederatedExchange) and first.snapshot()["mode"] == "federated"
    size = ff.model_size
    ff.global_flat = ff.global_flat + 0.01  # as after a round's aggregation
    ff.global_stats = GlobalStats(0.4, 0.2)
    ff.aggregator.history = {"peerA": 0.3}
    ff.residual = torch.linspace(-1, 1, size)
    first.rounds_done, first.round = 2, 3
    first.save_checkpoint()

    again = open_daemon(load_node_settings(None, sets), resume=True)

    fa = fed(again)
    assert again.round == 3 and again.rounds_done == 2
    assert torch.equal(fa.global_flat, ff.global_flat) and fa.global_digest == digest(ff.global_flat)
    assert torch.equal(flat_parameters(again.learner.model), ff.global_flat)  # the learner starts from it
    assert fa.residual is not None and torch.equal(fa.residual, ff.residual)
    assert fa.aggregator.history == {"peerA": 0.3} and fa.global_stats == GlobalStats(0.4, 0.2)
    assert fa.client_index == 1
    status = again.snapshot()["federated"]
    assert status["global_sha256"] == fa.global_digest and status["topology"] == "decentralised"
    assert status["role"] == "aggregator" and status["global_stats"] == {"mean": 0.4, "std": 0.2}
    # the client built at the first round carries the restored residual and trains on its own partition
    again.transport = FakeTransport()  # type: ignore[assignment]
    client = fa._setup_client()
    assert torch.equal(client.feedback.residual, ff.residual) and client.name == again.peer_id
    assert len(client.sources) == 1 and len(client.sources[0][1]) == 64


def fed(d: Daemon) -> FederatedExchange:
    """The daemon's federated exchange."""
    assert isinstance(d.exchange, FederatedExchange)
    return d.exchange


class FakeTransport:
    def peers(self) -> set[str]:
        return set()


def test_cli_modes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dgrpo.cli import app

    runner = CliRunner()
    bad_mode = runner.invoke(app, ["node", "run", "--mode", "gossip", "--state-dir", str(tmp_path)])
    assert bad_mode.exit_code == 2 and "valid modes: completions, federated" in bad_mode.output
    assert "httt" not in bad_mode.output and "httt" not in runner.invoke(app, ["node", "run", "--help"]).output
    bad_topology = runner.invoke(app, ["testnet", "up", "--topology", "star", "--out", str(tmp_path)])
    assert bad_topology.exit_code != 0 and "--mode federated" in bad_topology.output
    assert "federated" in runner.invoke(app, ["testnet", "up", "--help"]).output


def test_state_sync_serves_and_takes_over_the_global_state(tmp_path: Path) -> None:
    from dgrpo.net.state_sync import GlobalState
    from dgrpo.protocol.sync import decode_header

    sets = settings(tmp_path, "federated.clients=3", "federation.client_index=1", "federated.topology='star'")
    d = open_daemon(load_node_settings(None, sets))
    fd = fed(d)
    fd.aggregator_id = "12D3KooWaggregator"
    fd.global_flat = fd.global_flat + 0.5
    fd.global_digest = digest(fd.global_flat)
    fd.aggregator.history = {"peerA": 0.25}
    trio.run(fd._serve_snapshot, 3)
    snap = fd.sync_server.snapshot
    assert snap is not None and snap.round == 3
    header = decode_header(snap.head[4:])
    assert header.sha256.hex() == fd.global_digest and header.size == 4 * fd.model_size
    assert header.aggregator == "12D3KooWaggregator" and header.history == {"peerA": 0.25} and header.mean is None

    fd.residual = torch.ones(fd.model_size)  # as restored from an older checkpoint
    old = fd.global_digest
    weights = torch.linspace(-1, 1, fd.model_size)
    state = GlobalState(7, weights, digest(weights), GlobalStats(0.4, 0.2), "12D3KooWother", {"peerB": 0.5}, "src")
    trio.run(fd._adopt, state, 7)
    assert torch.equal(fd.global_flat, weights) and fd.global_digest == digest(weights)
    assert torch.equal(flat_parameters(d.learner.model), weights)  # the learner starts from it
    assert d.round == 8 and fd.global_stats == GlobalStats(0.4, 0.2) and fd.aggregator_id == "12D3KooWother"
    assert fd.aggregator.history == {"peerB": 0.5} and fd.residual is None  # error feedback restarts at zero
    assert fd.synced == {"peer": "src", "round": 7, "global_sha256": digest(weights), "replaced_sha256": old}
    assert fd.sync_server.snapshot is not None and fd.sync_server.snapshot.round == 7  # it serves what it took
    assert d.snapshot()["federated"]["sync"] == {
        "served": 0, "joined_from": fd.synced, "resyncs": 0, "last_resync": None,
    }  # fmt: skip


def test_a_diverged_node_takes_the_state_over_and_says_so(tmp_path: Path) -> None:
    from dgrpo.federated.sparse import ErrorFeedback
    from dgrpo.net.state_sync import GlobalState

    sets = settings(tmp_path, "federated.clients=3", "federation.client_index=1", "federated.topology='decentralised'")
    d = open_daemon(load_node_settings(None, sets))
    fd = fed(d)
    fd.client = types.SimpleNamespace(feedback=ErrorFeedback(fd.model_size, torch.ones(fd.model_size)))  # type: ignore[assignment]
    fd.synced = {"peer": "first-join"}
    old = fd.global_digest
    weights = torch.linspace(-1, 1, fd.model_size)
    state = GlobalState(4, weights, digest(weights), None, None, {}, "src")

    async def fake_sync(target: int) -> GlobalState:
        assert target == 4
        await fd._adopt(state, target)
        return state

    fd._sync = fake_sync  # type: ignore[method-assign]
    d.round = 5  # the loop moved on to the next round before re-syncing
    trio.run(fd._resync, 4)
    assert d.round == 5 and torch.equal(fd.global_flat, weights)
    assert fd.client is not None and int(fd.client.feedback.residual.count_nonzero()) == 0  # residual reset
    assert fd.synced == {"peer": "first-join"}  # a re-sync is not a join
    sync = d.snapshot()["federated"]["sync"]
    assert sync["resyncs"] == 1
    assert sync["last_resync"] == {
        "round": 4, "peer": "src", "replaced_sha256": old, "global_sha256": digest(weights), "ok": True,
    }  # fmt: skip


def test_a_joining_peer_is_not_waited_for_after_the_first_round(tmp_path: Path) -> None:
    d = open_daemon(load_node_settings(None, settings(tmp_path, "federated.clients=3")))
    fd = fed(d)
    table = [PeerInfo("joining", 0, 0, "running", 0.0), PeerInfo("behind", 4, 3, "running", 0.0)]
    d.transport = TableTransport(table)  # type: ignore[assignment]
    assert fd.expected_peers(1) == {"joining"}  # a federation starting together: everyone is at round 0
    assert fd.expected_peers(5) == {"behind"}  # past round 1, round 0 means joining: it starts after this round


class TableTransport:
    def __init__(self, table: list[PeerInfo]) -> None:
        self.table = table

    def peers(self) -> set[str]:
        return {p.peer_id for p in self.table}

    def peer_table(self) -> list[PeerInfo]:
        return self.table
