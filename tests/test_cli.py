"""The command line: keygen, status, and clear errors for bad input."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dgrpo.cli import app
from dgrpo.daemon.status import NodeMetrics, StatusServer
from dgrpo.protocol.identity import Identity
from dgrpo.simulations.summary import RunSummary, load_summary

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
    assert f"{key} exists; --force overwrites it" in again.output.replace("\n", "")
    assert "overwrite=True" not in again.output  # a Python argument means nothing on the command line
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
        # not a terminal: the table keeps every column whole, one line per row (no wrap, no ellipsis at 80 columns)
        header = next(line for line in table.output.splitlines() if "node" in line and "peer" in line)
        for column in ("state", "round", "done", "peers", "reach", "links", "accepted", "wire", "defense", "reward"):
            assert f" {column} " in header, header
        assert "…" not in table.output
        row = next(line for line in table.output.splitlines() if "abcdefgh" in line)
        assert "running" in row and "0.500" in row, row
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


def test_testnet_adversary_spec_errors_are_clear(tmp_path: Path) -> None:
    out = str(tmp_path / "net")
    bad_name = runner.invoke(app, ["testnet", "up", "-n", "3", "--out", out, "--adversary", "nope:1"])
    assert bad_name.exit_code == 2
    assert "unknown adversary 'nope'" in bad_name.output and "text" in bad_name.output
    too_many = runner.invoke(app, ["testnet", "up", "-n", "2", "--out", out, "--adversary", "text:2"])
    assert too_many.exit_code == 2 and "no honest node" in too_many.output
    bad_count = runner.invoke(app, ["testnet", "up", "-n", "3", "--out", out, "--adversary", "text:x"])
    assert bad_count.exit_code == 2 and "COUNT" in bad_count.output
    hetero = runner.invoke(app, ["testnet", "up", "-n", "3", "--out", out, "--models", "heterogeneous",
                                 "--defense", "length,sampling-proof"])  # fmt: skip
    assert hetero.exit_code == 2 and "sampling-proof" in hetero.output and "own model" in hetero.output
    assert not (tmp_path / "net").exists()  # nothing was started


def test_report_command_prints_and_writes_the_table(tmp_path: Path) -> None:
    run = tmp_path / "run"
    RunSummary(
        scenario="s", task="arith", model="dgrpo:tiny-arith", mode="homogeneous", rounds=5, initial_accuracy=0.5,
        final_accuracy=0.5, accuracy=[(0, 0.5), (5, 0.5)], attack="text", asr_metric="asr",
        asr=[(0, 0.0), (5, 0.5)], final_asr=0.5,
    ).write(run)  # fmt: skip
    result = runner.invoke(app, ["report", str(run), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    assert "| run | text |" in result.output
    assert (tmp_path / "rep" / "report.csv").exists() and (tmp_path / "rep" / "report.png").exists()
    (tmp_path / "empty").mkdir()
    empty = runner.invoke(app, ["report", str(tmp_path / "empty"), "--out", str(tmp_path / "rep2")])
    assert empty.exit_code == 2 and "summary.json" in empty.output, empty.output
    missing = runner.invoke(app, ["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "rep2")])
    assert missing.exit_code == 2 and "does not exist" in missing.output, missing.output


@pytest.mark.slow
def test_code_tasks_refuse_to_start_without_isolation_and_the_loud_flag_accepts_less(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dgrpo.sandbox import sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "find_bwrap", lambda: None)  # a machine without bubblewrap
    sandbox_module._bwrap_launcher.cache_clear()
    try:
        args = ["simulate", "code-horizontal", "--out", str(tmp_path / "run")]
        args += ["-s", "rounds=1", "-s", "nodes.count=2", "-s", "nodes.malicious=0", "-s", "eval.prompts=4"]
        refused = runner.invoke(app, args)
        assert refused.exit_code == 2
        assert "bubblewrap" in refused.output and "--unsafe-weak-sandbox" in refused.output
        assert not (tmp_path / "run" / "summary.json").exists()
        accepted = runner.invoke(app, [*args, "--unsafe-weak-sandbox"])
        assert accepted.exit_code == 0, accepted.output
        summary = load_summary(tmp_path / "run")
        assert summary.scenario_config["task"]["options"]["unsafe_weak_sandbox"] is True
    finally:
        sandbox_module._bwrap_launcher.cache_clear()


def test_bad_defense_specs_get_one_clear_line(tmp_path: Path) -> None:
    for spec, expected in ((",", "expected NAME"), ("length,nope", "unknown defense 'nope'")):
        for args in (["node", "run", "--state-dir", str(tmp_path)], ["testnet", "up", "--out", str(tmp_path / "t")]):
            result = runner.invoke(app, [*args, "--defense", spec])
            assert result.exit_code == 2, result.output
            assert expected in result.output and "Traceback" not in result.output
            if "unknown" in expected:
                assert "sampling-proof" in result.output  # the valid names are listed
    assert not (tmp_path / "t").exists()


def test_simulate_federated(tmp_path: Path) -> None:
    """`dgrpo simulate fed-grpo` with small work: one line per round (traffic per client), the summary line."""
    small = [
        "rounds=2",
        "eval.prompts=8",
        "federated.clients=2",
        "federated.local_steps=1",
        "federated.prompts_per_step=2",
        "federated.completions_per_prompt=2",
        "federated.prompts_per_client=10",
        "sampling.max_new_tokens=16",
    ]
    args = ["simulate", "fed-grpo", "--out", str(tmp_path)]
    result = runner.invoke(app, [*args, *[x for s in small for x in ("-s", s)]])
    assert result.exit_code == 0, result.output
    assert "2 clients (federated, signal / mean, budget 0.03125)" in result.output
    assert "round   1  mean reward" in result.output and "KiB/client" in result.output
    summary = load_summary(tmp_path)
    assert summary.federated is not None
    assert summary.federated.weighting == "signal" and summary.rounds == 2
