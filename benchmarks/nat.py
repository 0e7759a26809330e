"""Joining from behind NAT, measured: ``python benchmarks/nat.py [--rounds 20] [--out docs/figures/nat]``.

Three runs of the same network, side by side: a public node (the run's creator, ``--relay-service``) and two
nodes that join it with ``dgrpo node join <its address>`` knowing nothing else:

- ``loopback``: all three on 127.0.0.1 (the floor: no NAT, no relay);
- ``cone``: the joiners each behind a home router doing endpoint-independent NAT (``scripts/natlab.py``,
  nftables ``masquerade``): they reach each other through the relay, then directly once DCUtR punched a hole;
- ``symmetric``: behind ``masquerade fully-random``: no hole punch works, they stay relayed.

Per run it reports, for the joiners: the median round time over ``--rounds`` rounds in which they trained on
every author, measured from ``--settle`` seconds after both joined; the time to join (from starting ``dgrpo node
join`` to its first round done, model loading included); how the two joiners are connected at the end; and the
bytes the relay forwarded for others per measured round (its ``/status`` ``network.relay_service_bytes``).
Writes ``nat.json``, ``nat.csv`` and ``nat.png`` in ``--out``. The NAT runs need root (network namespaces); the
lab is joined only to itself and removed at the end, and every daemon is stopped after the measured rounds.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("natlab", ROOT / "scripts" / "natlab.py")
assert _spec is not None and _spec.loader is not None
natlab = importlib.util.module_from_spec(_spec)
sys.modules["natlab"] = natlab
_spec.loader.exec_module(natlab)

PUBLIC_IP = "203.0.113.1"


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_args(rounds: int) -> list[str]:
    """The creator's run (the joiners learn it from its manifest) and its local settings."""
    sets = {
        "rounds.min_peers": "2",
        "rounds.heartbeat_seconds": "0.5",
        "rounds.peer_timeout_seconds": "6",
        "rounds.deadline_seconds": "30",
        "status.port": "0",
        "checkpoint.every": "100",
    }
    out = ["--run-id", "natbench", "--max-rounds", str(rounds)]
    for key, value in sets.items():
        out += ["--set", f"{key}={value}"]
    return out


LOCAL = ["--set", "rounds.min_peers=2", "--set", "rounds.peer_timeout_seconds=6", "--set", "status.port=0"]


def rounds_of(node: Any) -> list[dict[str, Any]]:
    path = node.state_dir / "rounds.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("event", "round") == "round":
            rows.append(row)
    return rows


def peer_of(node: Any) -> str:
    info = node.node_file()
    assert info is not None
    return str(info["peer_id"])


def done(node: Any) -> int:
    st = node.status()
    return int(st["rounds_done"]) if st else 0


def measure(scenario: str, rounds: int, settle: float, tmp: Path) -> dict[str, Any]:
    """One run of the network; returns its row."""
    if scenario == "loopback":
        lab = None
        where = {"relay": None, "A": None, "B": None}
        listen = {"relay": "/ip4/127.0.0.1/tcp/0", "A": "/ip4/127.0.0.1/tcp/0", "B": "/ip4/127.0.0.1/tcp/0"}
        prefix = "/ip4/127.0.0.1/"
    else:
        lab = natlab.Lab(prefix=f"b{os.getpid() % 10000}", nat=scenario)
        natlab.up(lab)
        where = {"relay": lab.inet, "A": lab.home(1), "B": lab.home(2)}
        listen = {"relay": f"/ip4/{PUBLIC_IP}/tcp/4001", "A": f"/ip4/{lab.home_ip(1)}/tcp/4001"}
        listen["B"] = f"/ip4/{lab.home_ip(2)}/tcp/4001"
        prefix = f"/ip4/{PUBLIC_IP}/"
    nodes: list[Any] = []
    try:
        relay_args = ["--listen", listen["relay"], "--relay-service", *run_args(1000)]  # stopped by us
        relay = launch(where["relay"], "relay", tmp / "R", relay_args)
        nodes.append(relay)
        natlab.wait_for(lambda: relay.node_file() is not None, 120, "the relay", nodes)
        boot = relay.public_addr(prefix)
        started = {}
        for name in ("A", "B"):
            started[name] = time.time()
            args = [boot, "--listen", listen[name], *LOCAL]
            nodes.append(launch(where[name], name, tmp / name, args, command="join"))
        a, b = nodes[1], nodes[2]
        joined: dict[str, float] = {}

        def first_rounds() -> bool:
            for n in (a, b):
                if n.name not in joined and done(n) >= 1:
                    joined[n.name] = time.time() - started[n.name]
            return len(joined) == 2

        natlab.wait_for(first_rounds, 240, "a first round on both joiners", nodes)
        # the joiners' connection settles: a hole punch, then the relayed leg's grace period
        time.sleep(settle)
        relay_status = relay.status() or {}
        bytes_before = relay_status.get("network", {}).get("relay_service_bytes", 0)
        rounds_before = min(done(n) for n in (a, b))
        natlab.wait_for(lambda: all(done(n) >= rounds_before + rounds for n in (a, b)), 600, f"{rounds} rounds", nodes)
        relay_status = relay.status() or {}
        bytes_after = relay_status.get("network", {}).get("relay_service_bytes", 0)
        rounds_after = min(done(n) for n in (a, b))
        kinds = {n.name: (n.status() or {}).get("network", {}).get("connections", {}) for n in (a, b)}
        between = kinds["A"].get(peer_of(b), "none")
        punched = bool((a.status() or {}).get("network", {}).get("hole_punched"))
    finally:
        for n in nodes:
            n.stop()
        if lab is not None:
            natlab.down(lab)
    everyone = {peer_of(n) for n in nodes}
    times = [  # the measured rounds (by count: a joiner's rounds are numbered from the network's)
        r["seconds"]
        for n in (a, b)
        for r in rounds_of(n)[rounds_before:rounds_after]
        if set(r.get("authors") or ()) >= everyone and not r.get("departed")
    ]
    measured = max(1, rounds_after - rounds_before)
    return {
        "scenario": scenario,
        "rounds_measured": len(times) // 2,
        "settle_seconds": settle,
        "round_seconds_median": round(statistics.median(times), 3) if times else None,
        "round_seconds_mean": round(statistics.fmean(times), 3) if times else None,
        "join_seconds_A": round(joined["A"], 1),
        "join_seconds_B": round(joined["B"], 1),
        "joiners_connected": between,
        "hole_punched": punched,
        "relayed_bytes_per_round": int((bytes_after - bytes_before) / measured),
    }


def launch(ns: str | None, name: str, state: Path, args: list[str], command: str = "run") -> Any:
    if ns is not None:
        return natlab.launch(name, ns, state, args, command=command)
    # loopback: the same daemon, without a namespace
    import subprocess

    state.mkdir(parents=True, exist_ok=True)
    (state / "node.json").unlink(missing_ok=True)
    log = (state / "node.log").open("ab")
    cmd = [sys.executable, "-m", "dgrpo", "node", command, *args, "--state-dir", str(state)]
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    node = natlab.NsNode(name, "", state, process)
    node.status = lambda: _status_here(node)  # type: ignore[method-assign]
    return node


def _status_here(node: Any) -> dict[str, Any] | None:
    import urllib.request

    info = node.node_file()
    if not info or not info.get("status_url"):
        return None
    try:
        with urllib.request.urlopen(info["status_url"] + "/status", timeout=5) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data
    except (OSError, ValueError):
        return None


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["scenario"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    axes[0].bar(names, [r["round_seconds_median"] or 0 for r in rows], color="#4c72b0")
    axes[0].set_title("median round time (s)")
    axes[1].bar(names, [(r["join_seconds_A"] + r["join_seconds_B"]) / 2 for r in rows], color="#55a868")
    axes[1].set_title("time to join: start to first round (s)")
    axes[2].bar(names, [r["relayed_bytes_per_round"] / 1024 for r in rows], color="#c44e52")
    axes[2].set_title("relayed for others per round (KiB)")
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("a public node and two joiners: loopback, behind cone NATs (hole punched), behind symmetric NATs")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="rounds measured, after --settle")
    parser.add_argument(
        "--settle", type=float, default=30.0, help="s after both joined before measuring (punch, then grace)"
    )
    parser.add_argument("--out", type=Path, default=Path("docs/figures/nat"))
    parser.add_argument("--scenarios", default="loopback,cone,symmetric")
    args = parser.parse_args(argv)
    scenarios = args.scenarios.split(",")
    why = natlab.unavailable()
    if why is not None and any(s != "loopback" for s in scenarios):
        print(f"nat.py: the NAT runs need the lab: {why}", file=sys.stderr)
        return 2
    rows = []
    for scenario in scenarios:
        progress(f"{scenario}: a public node and two joiners, {args.rounds} rounds")
        with tempfile.TemporaryDirectory(prefix=f"nat-{scenario}-") as tmp:
            rows.append(measure(scenario, args.rounds, args.settle, Path(tmp)))
        progress(f"{scenario}: {rows[-1]}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nat.json").write_text(json.dumps(rows, indent=2) + "\n")
    with (args.out / "nat.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.out / "nat.png")
    base = next((r for r in rows if r["scenario"] == "loopback"), None)
    print(f"{'scenario':<10} {'round s':>8} {'x loopback':>10} {'join s':>7} {'joiners':>9} {'relayed KiB/round':>18}")
    for r in rows:
        ratio = (
            f"{r['round_seconds_median'] / base['round_seconds_median']:.2f}"
            if base and base["round_seconds_median"] and r["round_seconds_median"]
            else "-"
        )
        join = (r["join_seconds_A"] + r["join_seconds_B"]) / 2
        print(
            f"{r['scenario']:<10} {r['round_seconds_median']:>8} {ratio:>10} {join:>7.1f} {r['joiners_connected']:>9} "
            f"{r['relayed_bytes_per_round'] / 1024:>18.1f}"
        )
    print(f"written: {args.out}/nat.json, nat.csv, nat.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
