"""The command line: keygen, status, and clear errors for bad input."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from typer.testing import CliRunner

from dgrpo.cli import app
from dgrpo.node.status import NodeMetrics, StatusServer
from dgrpo.protocol.identity import Identity

runner = CliRunner()


def test_keygen_writes_a_private_key_and_refuses_to_overwrite(tmp_path: Path) -> None:
    key = tmp_path / "k" / "id.key"
    result = runner.invoke(app, ["keygen", str(key)])
    assert result.exit_code == 0, result.output
    peer = Identity.load(key).peer_id
    assert peer in result.output.replace("\n", "")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    again = runner.invoke(app, ["keygen", str(key)])
    assert again.exit_code == 2 and Identity.load(key).peer_id == peer
    assert runner.invoke(app, ["keygen", str(key), "--force"]).exit_code == 0
    assert Identity.load(key).peer_id != peer


def test_status_reads_a_node_by_url_and_by_state_dir(tmp_path: Path) -> None:
    snap = {
        "peer_id": "12D3KooWabcdefgh",
        "state": "running",
        "round": 4,
        "rounds_done": 3,
        "peers": ["x", "y"],
        "messages_accepted": 10,
        "messages_rejected": {"bad_signature": 2},
        "mean_reward": 0.5,
        "last_errors": ["12:00:00 round 2 closed at its deadline without ['z']"],
        "blacklisted_peers": [],
    }
    server = StatusServer("127.0.0.1", 0, lambda: snap, NodeMetrics().registry).start()
    try:
        by_url = runner.invoke(app, ["status", server.url, "--json"])
        assert by_url.exit_code == 0 and json.loads(by_url.output)["round"] == 4
        (tmp_path / "node.json").write_text(json.dumps({"status_url": server.url}))
        table = runner.invoke(app, ["status", str(tmp_path)])
        assert table.exit_code == 0 and "bad_signature" in table.output and "deadline" in table.output
    finally:
        server.stop()
    assert runner.invoke(app, ["status", server.url]).exit_code == 2  # gone: a clear error, not a traceback


def test_bad_input_gets_clear_errors(tmp_path: Path) -> None:
    r = runner.invoke(app, ["simulate", "-s", "task.name='nope'", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "valid task names" in r.output
    r = runner.invoke(app, ["testnet", "up", "--mode", "sideways", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "valid modes" in r.output
    r = runner.invoke(app, ["node", "run", "--set", "rounds.deadline=1", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2 and "deadline_seconds" in r.output
    r = runner.invoke(app, ["testnet", "down", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "no testnet" in r.output
