"""Gossip between real, separate processes (``python -m benchmarks.gossip_probe``) over loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gossip_probe import run_chain_processes

pytestmark = pytest.mark.slow  # real processes / many rounds: not in the fast tier


def test_chain_of_three_processes_delivers_everything(tmp_path: Path) -> None:
    """A -> B -> C, C connected only to B. A publishes as fast as pacing allows and exits at once: its flush
    must hold the exit until B has read everything, or B would drop the tail when the connection closes."""
    result = run_chain_processes("bare", payload_bytes=4096, messages=150, workdir=tmp_path, timeout=60)
    assert result["exit_codes"] == [0, 0, 0]
    assert (result["published"], result["relayed"], result["received"]) == (150, 150, 150)
    assert result["duplicates"] == result["invalid"] == result["dropped"] == 0
    assert result["p50_ms"] is not None and result["p50_ms"] <= result["p99_ms"]


def test_probe_names_the_known_stacks_when_given_an_unknown_one() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gossip_probe", "receive", "--stack", "nope"],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "unknown stack 'nope'; valid stack names: <module>:<Codec subclass>, bare" in done.stderr
