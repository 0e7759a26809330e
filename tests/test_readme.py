"""The README's quickstarts, run as written (with this checkout's interpreter for `.venv/bin/dgrpo` and a
temporary folder for `runs/`), so that the first thing a newcomer types cannot drift from the code: every
command of the researcher's and the federated quickstart exits 0 and writes what the text says; the
operator's two nodes start on one machine with no port flags, train together, and `dgrpo status` reads them."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dgrpo.simulations.summary import load_summary

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
ENV = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}


def block(name: str) -> list[str]:
    match = re.search(rf"<!-- quickstart: {name} -->\n```bash\n(.*?)```", README, re.S)
    assert match, f"the README has a {name} quickstart"
    return [line.split("  #")[0].strip() for line in match.group(1).splitlines() if line.strip()]


def command(line: str, runs: Path, **values: str) -> list[str]:
    for key, value in values.items():
        line = line.replace(key, value)
    line = line.replace(".venv/bin/dgrpo", f"{sys.executable} -m dgrpo").replace("runs/", f"{runs}/")
    return shlex.split(line)


def run(line: str, runs: Path, timeout: float = 600) -> str:
    done = subprocess.run(command(line, runs), capture_output=True, text=True, timeout=timeout, env=ENV, cwd=ROOT)
    assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stdout + done.stderr, line
    return done.stdout


def test_the_quickstarts_fit_the_first_120_lines() -> None:
    head = "\n".join(README.splitlines()[:120])
    for name in ("researcher", "operator", "federated"):
        assert f"<!-- quickstart: {name} -->" in head, name
    # It opens with the two set-up commands: the main job on the embedded default, and the tests (CI's).
    opening = re.search(r"```bash\n(.*?)```", README, re.S)
    assert opening and opening.start() < README.index("## ")
    assert [line.split("#")[0].strip() for line in opening.group(1).splitlines()] == [
        "bash scripts/install.sh && .venv/bin/dgrpo simulate",
        "bash .ci/run",
    ]


def test_the_researcher_quickstart(tmp_path: Path) -> None:
    lines = block("researcher")
    printed = [run(line, tmp_path) for line in lines]
    assert "text-horizontal" in printed[0] and "TEXT attack" in printed[0], printed[0]
    assert "poison 16" in printed[1] and "eta" in printed[1] and "stop 1.00" in printed[2], printed[2]
    report = tmp_path / "qs-report"
    assert (report / "report.md").exists() and (report / "report.png").exists()
    assert "qs-logit" in (report / "report.html").read_text()  # both runs on the one page, each linked
    assert len(list((report / "runs").glob("*.html"))) == 2
    assert (load_summary(tmp_path / "qs-logit").stop_rate or 0.0) > 0.5


def test_the_federated_quickstart(tmp_path: Path) -> None:
    pytest.importorskip("flwr")
    simulated, flower = (run(line, tmp_path) for line in block("federated"))
    assert re.search(r"round +3 +mean reward", simulated), simulated
    assert re.search(r"round +2 +mean reward", flower), flower
    assert (tmp_path / "qs-fed" / "summary.json").exists() and (tmp_path / "qs-flower" / "summary.json").exists()


class Node:
    """A quickstart command left running, its output collected as it comes."""

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=ROOT
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        t0 = time.time()
        while time.time() - t0 < timeout:
            for line in list(self.lines):
                found = re.search(pattern, line)
                if found:
                    return found
            assert self.process.poll() is None, "".join(self.lines[-40:])
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} within {timeout}s:\n{''.join(self.lines[-40:])}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # Ctrl-C, as the quickstart says
        return self.process.wait(timeout=60)


def rounds(state: Path) -> list[dict[str, object]]:
    path = state / "rounds.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_operator_quickstart(tmp_path: Path) -> None:
    first, second, status = block("operator")
    nodes: list[Node] = []
    try:
        nodes.append(Node(command(first, tmp_path)))
        joins = nodes[0].wait_for(r"joins with: dgrpo node join (\S+)", 180)
        nodes.append(Node(command(second, tmp_path, ADDRESS=joins.group(1))))
        t0 = time.time()
        while time.time() - t0 < 240 and min(len(rounds(tmp_path / n)) for n in ("node-a", "node-b")) < 2:
            assert all(n.process.poll() is None for n in nodes), "".join(nodes[-1].lines[-40:])
            time.sleep(0.5)
        a, b = rounds(tmp_path / "node-a"), rounds(tmp_path / "node-b")
        assert len(a) >= 2 and len(b) >= 2, "the two nodes did not train together"
        assert a[0]["round"] == b[0]["round"] == 1, "both trained from round 1"
        shown = run(status, tmp_path, timeout=60)
        assert re.search(r"running", shown), shown
        taken = json.loads((tmp_path / "node-b" / "node.json").read_text())
        assert taken["status_url"] != json.loads((tmp_path / "node-a" / "node.json").read_text())["status_url"]
    finally:
        codes = [n.stop() for n in nodes]
    assert codes == [0, 0], [n.lines[-20:] for n in nodes]
    assert not any("Traceback" in line for n in nodes for line in n.lines)
