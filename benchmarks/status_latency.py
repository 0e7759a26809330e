"""How long ``dgrpo status STATE_DIR`` takes, end to end, as an operator runs it (issue 43: "the operator's first
hour"; target: under one second). ``python benchmarks/status_latency.py [--runs 5]``.

Two state dirs, each timed ``--runs`` times as a fresh ``python -m dgrpo status DIR`` subprocess (interpreter start,
imports, the HTTP request or file read, the table):

- ``running``: its ``node.json`` names a stand-in node's status URL: a small HTTP server in this process serving a
  realistic ``/status`` JSON (the keys :func:`dgrpo.daemon.snapshot.node_snapshot` writes, a defense that rejected
  and blacklisted an attacker, 10 peers, 50 rounds of history). Not the real
  :class:`dgrpo.daemon.status.StatusServer`: importing it loads torch (through ``dgrpo.round``), and this process
  must stay light so as not to slow the command it times on a small machine.
- ``stopped``: its ``node.json`` names a port nothing listens on, and its ``status.json`` is what the daemon saves
  on shutdown: the command reads that instead.

Also timed, as the floor no command beats: ``python -c pass``. Prints each case's median and max wall seconds, the
median's ratio to the floor and to the target, and "met" only where the max over the runs is under the target.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TARGET_SECONDS = 1.0
PEER = "12D3KooWStandInNodeAAAAAAAAAAAAAAAAAAAAAAAAnode0"
ATTACKER = "12D3KooWStandInAttackerBBBBBBBBBBBBBBBBBBBBattack"


def realistic_status(state: str) -> dict[str, Any]:
    """A node's /status after 50 rounds with 10 peers, one of them an attacker its defense caught."""
    peers = [f"12D3KooWStandInPeer{i:02d}CCCCCCCCCCCCCCCCCCCCCCCCCC" for i in range(9)] + [ATTACKER]
    return {
        "peer_id": PEER,
        "run_id": "bench",
        "mode": "completions",
        "state": state,
        "round": 51,
        "rounds_done": 50,
        "peers": peers,
        "connected_peers": peers,
        "listen_addrs": ["/ip4/127.0.0.1/tcp/4001"],
        "network": None,
        "mean_reward": 0.41,
        "messages_accepted": 5400,
        "messages_rejected": {"replay": 3},
        "rejected_by_peer": {},
        "rejected_by_peer_reason": {},
        "round_rejections": {"closed_round": 12, "duplicate_part": 2},
        "round_rejections_by_peer": {peers[0]: 12},
        "round_rejections_by_peer_reason": {peers[0]: {"closed_round": 12}},
        "defense": {
            "chain": ["logit"],
            "checked_by_author": {p: 600 for p in peers},
            "rejected_by_author": {ATTACKER: 16},
            "rejected_by_reason": {"logit:outside_top_k": 16},
            "reputation": {p: {"rejection_rate": 0.0} for p in peers},
            "blacklisted": {ATTACKER: 2},
        },
        "blacklisted_peers": [ATTACKER],
        "completions_trained": 30000,
        "completions_trained_by_author": {p: 3000 for p in peers[:-1]},
        "peer_table": [{"peer_id": p, "state": "running", "trained": 3000, "rejected_by_reason": {}} for p in peers],
        "history": [{"round": r, "mean_reward": 0.2 + r / 250, "seconds": 4.2} for r in range(50)],
        "last_errors": [f"12:00:00 round 2 closed by quorum; nothing trained from ['{ATTACKER}']"],
        "manifest": None,
        "status_url": None,
    }


class _Handler(BaseHTTPRequestHandler):
    body = json.dumps(realistic_status("running")).encode()

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/status" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request would swamp the numbers
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def state_dir(root: Path, name: str, url: str, saved: bool) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "node.json").write_text(json.dumps({"peer_id": PEER, "listen_addrs": [], "status_url": url}))
    if saved:
        (folder / "status.json").write_text(json.dumps(realistic_status("stopped"), indent=2))
    return folder


def timed(argv: list[str], expect: str | None, runs: int) -> list[float]:
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        walls.append(time.perf_counter() - t0)
        if done.returncode != 0 or (expect is not None and expect not in done.stdout):
            raise SystemExit(f"{' '.join(argv)} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return walls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="subprocess runs per case")
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cases = {
            "python -c pass (floor)": ([sys.executable, "-c", "pass"], None),
            "running": (
                [sys.executable, "-m", "dgrpo", "status", str(state_dir(root, "running", url, False))],
                PEER[-8:],
            ),
            "stopped": (
                [sys.executable, "-m", "dgrpo", "status",
                 str(state_dir(root, "stopped", f"http://127.0.0.1:{free_port()}", True))],
                "not running",
            ),
        }  # fmt: skip
        results = {name: timed(argv, expect, args.runs) for name, (argv, expect) in cases.items()}
    server.shutdown()
    floor = statistics.median(results["python -c pass (floor)"])
    print(f"dgrpo status latency, {args.runs} runs per case (target: max < {TARGET_SECONDS:.1f} s)")
    print(f"{'case':<24} {'median s':>9} {'max s':>7} {'x floor':>8} {'x target':>9}  target")
    for name, walls in results.items():
        median, worst = statistics.median(walls), max(walls)
        verdict = "" if name.endswith("(floor)") else ("met" if worst < TARGET_SECONDS else "NOT met")
        ratios = f"{median / floor:>8.1f} {median / TARGET_SECONDS:>9.2f}"
        print(f"{name:<24} {median:>9.3f} {worst:>7.3f} {ratios}  {verdict}")


if __name__ == "__main__":
    main()
