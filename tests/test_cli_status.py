"""``dgrpo status``: fast (no torch on its path), a stopped node read from its status.json, and a table that shows
what each stage rejected (the defense's rejections and blacklist included) rather than wire rejections alone."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from typer.testing import CliRunner

from dgrpo.cli import app
from dgrpo.cli.status_table import TABLE_ROWS, rejection_cell, status_table
from dgrpo.daemon.status import NodeMetrics, StatusServer

runner = CliRunner()
ATTACKER = "12D3KooWAttackerAAAAAAAAatk00001"
HONEST = "12D3KooWHonestBBBBBBBBBBBhonest01"


def honest_status(**changes: Any) -> dict[str, Any]:
    """A honest node's /status after its defense rejected an attacker's completions and blacklisted it: the wire
    saw nothing wrong (every message well signed), and the quorum note is no error of this node."""
    st: dict[str, Any] = {
        "peer_id": HONEST,
        "state": "running",
        "round": 6,
        "rounds_done": 5,
        "peers": [ATTACKER, "12D3KooWother"],
        "messages_accepted": 120,
        "messages_rejected": {},
        "round_rejections": {"closed_round": 2, "duplicate_part": 1},
        "defense": {
            "chain": ["logit"],
            "rejected_by_reason": {"logit:outside_top_k": 16},
            "rejected_by_author": {ATTACKER: 16},
            "blacklisted": {ATTACKER: 4},
        },
        "blacklisted_peers": [ATTACKER],
        "mean_reward": 0.375,
        "last_errors": [f"12:00:00 round 1 closed by quorum; nothing trained from ['{ATTACKER}']"],
    }
    st.update(changes)
    return st


def attacker_status() -> dict[str, Any]:
    return {**honest_status(peer_id=ATTACKER, round_rejections={}, blacklisted_peers=[], last_errors=[]),
            "defense": None, "messages_rejected": {"bad_signature": 3}}  # fmt: skip


def rendered(table: Any) -> str:
    console = Console(record=True, width=300)
    console.print(table)
    return console.export_text()


def test_the_table_shows_each_stage_s_rejections_with_its_top_reason_and_the_blacklist() -> None:
    text = rendered(status_table([honest_status(), attacker_status()], ["node-0", "node-1 (text)"]))
    header = next(line for line in text.splitlines() if " node " in line and " peer " in line)
    for column in ("wire", "admit", "defense", "blacklisted"):
        assert f" {column} " in header, header
    assert "errors" not in header  # a quorum note is not the node's error; the defense columns say what happened
    honest = next(line for line in text.splitlines() if "node-0" in line)
    assert "16 (logit:outside_top_k)" in honest, honest
    assert "3 (closed_round 2, +1 more)" in honest, honest
    assert f"1: {ATTACKER[-8:]}" in honest, honest
    attacker = next(line for line in text.splitlines() if "node-1" in line)
    assert "3 (bad_signature)" in attacker and " - " in attacker, attacker  # no defense chain: "-", not "0"


def test_the_reputation_s_blacklist_counts_before_the_gossip_layer_acts_on_it() -> None:
    text = rendered(status_table([honest_status(blacklisted_peers=[])], ["node-0"]))
    assert f"1: {ATTACKER[-8:]}" in text


def test_rejection_cells() -> None:
    assert rejection_cell(None) == "-"
    assert rejection_cell({}) == "0"
    assert rejection_cell({"a": 0}) == "0"
    assert rejection_cell({"logit:outside_top_k": 16}) == "16 (logit:outside_top_k)"
    assert rejection_cell({"x": 1, "y": 5, "z": 2}) == "8 (y 5, +2 more)"


def test_a_large_testnet_keeps_one_summary_row_with_the_others_rejections() -> None:
    n = TABLE_ROWS + 3
    statuses: list[dict[str, Any] | None] = [honest_status() for _ in range(n - 1)] + [None]
    text = rendered(status_table(statuses, [f"node-{i}" for i in range(n)]))
    rows = [line for line in text.splitlines() if "node-" in line]
    assert len(rows) == TABLE_ROWS, rows
    summary = next(line for line in text.splitlines() if "+3 more" in line)
    # two of the three hidden nodes answer: their defense rejections are summed, their blacklists merged
    assert "2 up" in summary and "32 (logit:outside_top_k)" in summary and f"1: {ATTACKER[-8:]}" in summary, summary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stopped_node(state_dir: Path, url: str | None) -> None:
    """What a daemon leaves behind when it stops: node.json (naming a URL no one serves now) and status.json."""
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "node.json").write_text(json.dumps({"peer_id": HONEST, "listen_addrs": [], "status_url": url}))
    (state_dir / "status.json").write_text(json.dumps(honest_status(state="stopped")))


def test_a_stopped_node_is_read_from_its_status_json(tmp_path: Path) -> None:
    stopped_node(tmp_path, f"http://127.0.0.1:{free_port()}")
    os.utime(tmp_path / "status.json", (1_700_000_000, 1_700_000_000))
    result = runner.invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert "not running" in first and "does not answer" in first and "status.json" in first, first
    assert datetime.fromtimestamp(1_700_000_000).astimezone().date().isoformat() in first, first  # when it stopped
    row = next(line for line in result.output.splitlines() if HONEST[-8:] in line)
    assert "stopped" in row and "16 (logit:outside_top_k)" in row, row
    as_json = runner.invoke(app, ["status", str(tmp_path), "--json"])
    assert as_json.exit_code == 0 and json.loads(as_json.output)["state"] == "stopped"


def test_a_node_without_a_status_server_is_read_from_its_status_json(tmp_path: Path) -> None:
    stopped_node(tmp_path, None)
    result = runner.invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 0 and "names no status URL" in result.output, result.output


def test_another_node_on_the_old_port_is_not_taken_for_this_one(tmp_path: Path) -> None:
    other = StatusServer("127.0.0.1", 0, lambda: honest_status(peer_id=ATTACKER), NodeMetrics().registry).start()
    try:
        stopped_node(tmp_path, other.url)
        result = runner.invoke(app, ["status", str(tmp_path)])
    finally:
        other.stop()
    assert result.exit_code == 0 and "another node" in result.output, result.output
    assert "stopped" in next(line for line in result.output.splitlines() if HONEST[-8:] in line)


def test_a_state_dir_with_nothing_to_read_is_one_line_with_the_cause_and_the_fix(tmp_path: Path) -> None:
    empty = runner.invoke(app, ["status", str(tmp_path)])
    assert empty.exit_code == 2 and len(empty.output.strip().splitlines()) == 1, empty.output
    assert "no node.json" in empty.output and "dgrpo node run --state-dir" in empty.output
    (tmp_path / "node.json").write_text(
        json.dumps({"peer_id": HONEST, "status_url": f"http://127.0.0.1:{free_port()}"})
    )
    crashed = runner.invoke(app, ["status", str(tmp_path)])  # not answering, and no status.json: it did not stop
    assert crashed.exit_code == 2 and "no status.json" in crashed.output and "--resume" in crashed.output
    assert runner.invoke(app, ["status", str(tmp_path / "missing")]).exit_code == 2
    unreachable = runner.invoke(app, ["status", f"http://127.0.0.1:{free_port()}"])
    assert unreachable.exit_code == 2 and "cannot reach" in unreachable.output  # a URL must answer


def test_the_status_path_imports_no_torch_nor_the_daemon(tmp_path: Path) -> None:
    """In a fresh interpreter (this one has torch from conftest): `dgrpo status` on a stopped node loads none of
    the modules that made it take seconds."""
    stopped_node(tmp_path, f"http://127.0.0.1:{free_port()}")
    script = textwrap.dedent(
        """
        import sys
        from typer.testing import CliRunner
        from dgrpo.cli import app
        result = CliRunner().invoke(app, ["status", sys.argv[1]])
        assert result.exit_code == 0 and "not running" in result.output, result.output
        heavy = ("torch", "transformers", "libp2p", "trio", "dgrpo.daemon.launch", "dgrpo.daemon.daemon")
        loaded = [name for name in heavy if name in sys.modules]
        assert not loaded, loaded
        """
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
