"""Every error a user can cause in `dgrpo node run` is one line naming the cause and the fix, and exit status 2,
never a traceback (issue 43, "the operator's first hour"). Each runs the real command line."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from dgrpo.adversary import ADVERSARIES
from dgrpo.cli import app
from dgrpo.daemon.ports import DEFAULT_LISTEN_PORT, DEFAULT_STATUS_PORT

runner = CliRunner()
QUIET = ["--listen", "/ip4/127.0.0.1/tcp/0", "--set", "status.port=0"]  # ports nobody else holds


def one_line_error(result: Result | subprocess.CompletedProcess[str], *expected: str) -> str:
    """The run's ``error:`` line, after checking exit status 2, one such line, no traceback, and ``expected``."""
    output = result.output if isinstance(result, Result) else result.stdout + result.stderr
    code = result.exit_code if isinstance(result, Result) else result.returncode
    assert code == 2, output
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, output
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def node_run(*args: str) -> Result:
    return runner.invoke(app, ["node", "run", *args])


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_a_taken_listen_port_the_user_chose(tmp_path: Path, taken_port: int) -> None:
    result = node_run("--state-dir", str(tmp_path), "--listen", f"/ip4/127.0.0.1/tcp/{taken_port}")
    one_line_error(result, f"network.listen: port {taken_port} on 127.0.0.1 is taken", "choose another with --listen")
    assert not (tmp_path / "identity.key").exists()  # refused before anything was made


def test_a_taken_status_port_the_user_chose(tmp_path: Path, taken_port: int) -> None:
    result = node_run(
        "--state-dir", str(tmp_path), "--listen", "/ip4/127.0.0.1/tcp/0", "-s", f"status.port={taken_port}"
    )
    one_line_error(result, f"status.port: port {taken_port} on 127.0.0.1 is taken", "--set status.port=PORT")


def test_a_listen_address_that_is_no_multiaddr(tmp_path: Path) -> None:
    result = node_run("--state-dir", str(tmp_path), "--listen", "foo")
    one_line_error(result, "network.listen", "'foo'", "give a multiaddr such as /ip4/0.0.0.0/tcp/4001")


def test_a_bootstrap_address_without_a_peer_id(tmp_path: Path) -> None:
    result = node_run("--state-dir", str(tmp_path), "--bootstrap", "/ip4/1.2.3.4/tcp/1")
    one_line_error(result, "network.bootstrap", "names no peer", "ends in /p2p/<peer id>")


@pytest.mark.parametrize("kind", ["garbage", "directory", "unreadable"])
def test_an_identity_key_that_cannot_be_read(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    key = tmp_path / "identity.key"
    if kind == "garbage":
        key.write_text("not a key at all")
    elif kind == "directory":
        key.mkdir()
    else:  # (as root, mode 000 reads anyway: the read itself is made to fail as it would for another user)
        key.write_text("whatever")
        key.chmod(0)
        real = Path.read_bytes

        def read_bytes(self: Path) -> bytes:
            if self == key:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self)

        monkeypatch.setattr(Path, "read_bytes", read_bytes)
    result = node_run("--state-dir", str(tmp_path), *QUIET)
    why = {"garbage": "is not an unencrypted PEM private key", "directory": "Is a directory"}.get(kind, "Permission")
    one_line_error(result, f"identity file {key}", why, "put the node's key back there", "another --state-dir")


def test_resume_of_a_folder_with_nothing_to_resume(tmp_path: Path) -> None:
    for folder in (tmp_path / "empty", tmp_path / "typo"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        result = node_run("--state-dir", str(folder), "--resume", *QUIET)
        one_line_error(result, f"no node state in {folder}; drop --resume to start a new node there")
        assert not (folder / "identity.key").exists(), "no new identity made"


def test_a_missing_config_file(tmp_path: Path) -> None:
    result = node_run("--config", str(tmp_path / "node.toml"), "--state-dir", str(tmp_path))
    one_line_error(result, "config file", "node.toml", "not found")


def test_keygen_over_an_existing_key(tmp_path: Path) -> None:
    key = tmp_path / "id.key"
    assert runner.invoke(app, ["keygen", str(key)]).exit_code == 0
    line = one_line_error(runner.invoke(app, ["keygen", str(key)]))
    assert line == f"error: {key} exists; --force overwrites it"


def test_an_unknown_adversary_or_mode_lists_what_there_is(tmp_path: Path) -> None:
    line = one_line_error(node_run("--state-dir", str(tmp_path), "--adversary", "nope"), "unknown adversary 'nope'")
    assert all(name in line for name in ADVERSARIES.names()) and len(ADVERSARIES.names()) > 4
    help_text = " ".join(node_run("--help").output.split())
    assert "junk" in ADVERSARIES.names() and "junk" in help_text  # the help's list is the registry's too
    one_line_error(node_run("--state-dir", str(tmp_path), "--mode", "httx"), "valid modes: completions, federated")


@pytest.mark.slow
def test_no_peer_in_time(tmp_path: Path) -> None:
    """A node alone (rounds.min_peers 1, the default) says it waits, and how to join it, and /status says
    ``waiting``; at the timeout it stops with one line and exit status 2 instead of training alone."""
    cmd = [sys.executable, "-m", "dgrpo", "node", "run", "--state-dir", str(tmp_path), *QUIET]
    cmd += ["-s", "rounds.start_timeout_seconds=8"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        info = wait_for(tmp_path / "node.json", proc, 180)
        with urllib.request.urlopen(info["status_url"] + "/status", timeout=10) as answer:
            assert json.loads(answer.read())["state"] == "waiting"
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    result = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    line = one_line_error(result, "no peer joined within 8 s (rounds.start_timeout_seconds)", "--solo")
    assert "`dgrpo node join /ip4/127.0.0.1/tcp/" in line and f"/p2p/{info['peer_id']} --manifest-sha256 " in line
    assert "waiting for peers (0/1), 0 s; another node joins with: dgrpo node join /ip4/127.0.0.1/" in stderr
    assert not (tmp_path / "rounds.jsonl").exists() or not (tmp_path / "rounds.jsonl").read_text().strip()


def test_a_user_error_inside_the_daemons_nurseries_is_unwrapped(tmp_path: Path) -> None:
    # trio wraps what a task raises in exception groups (nested, one per nursery it passes): run_daemon takes
    # the dgrpo error out, so the command line prints its one line, and names a port taken at the bind.
    from dgrpo.daemon.launch import user_error
    from dgrpo.daemon.settings import load_node_settings
    from dgrpo.errors import ConfigError

    settings = load_node_settings(None, [f"state_dir='{tmp_path}'"])
    inner = ConfigError("no peer joined")
    group = BaseExceptionGroup("outer", [ExceptionGroup("inner", [ValueError("other"), inner])])
    assert user_error(group, settings) is inner
    taken = ExceptionGroup("g", [OSError(errno.EADDRINUSE, "Address already in use")])
    error = user_error(taken, settings)
    assert isinstance(error, ConfigError) and "taken by another process" in str(error) and "--listen" in str(error)
    assert user_error(ExceptionGroup("g", [ValueError("a bug")]), settings) is None  # a bug keeps its traceback


def hold(port: int) -> socket.socket | None:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
        s.listen()
    except OSError:  # held by another process already: taken all the same
        s.close()
        return None
    return s


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and proc.poll() is None:
        try:
            info: dict[str, Any] = json.loads(path.read_text())
            if info.get("listen_addrs"):
                return info
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"no node.json (exit {proc.poll()})")


@pytest.mark.slow
def test_two_nodes_on_one_machine_need_no_port_flags(tmp_path: Path) -> None:
    """The default ports taken (as by a first node on this machine), a second node takes the next free ones,
    logs which, and node.json and /status name the real ones."""
    held = [hold(DEFAULT_LISTEN_PORT), hold(DEFAULT_STATUS_PORT)]
    log = tmp_path / "node.log"
    try:
        with log.open("w") as out:
            cmd = [sys.executable, "-m", "dgrpo", "node", "run", "--state-dir", str(tmp_path / "s"), "--solo"]
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
            try:
                info = wait_for(tmp_path / "s" / "node.json", proc, 180)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    finally:
        for s in held:
            if s is not None:
                s.close()
    text = log.read_text()
    assert "Traceback" not in text and proc.returncode == 0, text
    status_port = int(info["status_url"].rpartition(":")[2])
    listen_ports = {int(a.split("/tcp/")[1].split("/")[0]) for a in info["listen_addrs"]}
    assert status_port != DEFAULT_STATUS_PORT and DEFAULT_LISTEN_PORT not in listen_ports, info
    assert f"status port {DEFAULT_STATUS_PORT} is taken; serving on {status_port} (set status.port to choose)" in text
    assert f"listen port {DEFAULT_LISTEN_PORT} is taken; listening on /ip4/0.0.0.0/tcp/" in text
    assert len(listen_ports) == 1, info
