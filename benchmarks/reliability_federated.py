"""Membership in a decentralised federation, run repeatedly: ``python benchmarks/reliability_federated.py SCENARIO
--runs N --out DIR`` (default ``runs/reliability``).

In the decentralised topology every node aggregates the round's updates itself, so every node must close each
round with the same set of updates; nodes that do not hold different global weights. A node that finds most
updates computed against other weights than its own takes the federation's state over (it "diverged" and
healed); a three-way split has no majority and never heals. Scenarios (each run bounded in time; each writes
``DIR/<scenario>.json``, ``.csv`` and ``.png``, ``<scenario>-busyN.*`` with ``--busy N``; the daemons run in a
temporary folder):

- ``stop-together``: 3 daemons run 3 to 5 rounds and are stopped together (SIGTERM to all). Reports, per run,
  whether the last round every node logged has one global hash, and rounds closed at a deadline.
- ``late-join``: 2 daemons run; a third joins, takes the global state over from them and trains 3 rounds; then
  all stop. Reports, per run, the joiner's first round, whether every round all three logged has one hash among
  the nodes that did not diverge, how many nodes diverged (and healed), the seconds of the joiner's first round at
  each node and rounds closed at a deadline (``missing`` non-empty: a node waited for an update that never came).

Target (docs/reliability.md): every run agrees; no three-way split.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dgrpo.daemon.testnet import (
    SMALL_FEDERATION,
    NetNode,
    launch_node,
    node_identity,
    rounds_log,
    start_testnet,
    stop_nodes,
    tcp_address,
    wait_rounds,
)

FED = ["federated.topology='decentralised'", *SMALL_FEDERATION]  # as tests/test_integration_federated.py


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def by_round(nodes: list[NetNode]) -> list[dict[int, dict[str, Any]]]:
    return [{row["round"]: row for row in rounds_log(nd)} for nd in nodes]


def agreement(logs: list[dict[int, dict[str, Any]]], r: int) -> tuple[int, int]:
    """(distinct global hashes among the nodes that did not diverge at ``r`` or ``r + 1``, nodes that did)."""
    healed = [bool(log[r].get("diverged") or log.get(r + 1, {}).get("diverged")) for log in logs]
    hashes = {log[r]["global_sha256"] for log, h in zip(logs, healed, strict=True) if not h}
    return len(hashes), sum(healed)


def deadline_waits(logs: list[dict[int, dict[str, Any]]], rounds: list[int]) -> int:
    return sum(bool(log[r].get("missing")) for log in logs for r in rounds)


def stop_together(out: Path, run: int) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    nodes = start_testnet(3, out, rounds=None, mode="federated", extra=FED)
    try:
        wait_rounds(nodes, 3 + run % 3, lambda statuses: None, timeout=300)
        time.sleep((run % 7) * 0.13)  # stop at another point of the round each run
    finally:
        stop_nodes(nodes)
    logs = by_round(nodes)
    common = sorted(set(logs[0]) & set(logs[1]) & set(logs[2]))
    last = common[-1]
    hashes = len({log[last]["global_sha256"] for log in logs})
    return {
        "run": run,
        "last_common_round": last,
        "hashes_at_last_round": hashes,
        "clients_at_last_round": [len(log[last]["clients"]) for log in logs],
        "deadline_waits": deadline_waits(logs, common),
        "agree": hashes == 1,
    }


def late_join(out: Path, run: int) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    extra = [*FED, f"federation.aggregator='{node_identity(out / 'node-0').peer_id}'"]
    nodes: list[NetNode] = []
    try:
        for i in range(2):  # the first two start without the third
            boot = [tcp_address(nd) for nd in nodes]
            nodes.append(launch_node(i, 3, out, None, boot, mode="federated", extra=[*extra, "rounds.min_peers=1"]))
        wait_rounds(nodes, 2, lambda statuses: None, timeout=300)
        nodes.append(launch_node(2, 3, out, None, [tcp_address(nd) for nd in nodes], mode="federated", extra=extra))
        wait_rounds(nodes[2:], 3, lambda statuses: None, timeout=300)
        wait_rounds(nodes[:2], rounds_log(nodes[2])[2]["round"], lambda statuses: None, timeout=300)
    finally:
        stop_nodes(nodes)
    logs = by_round(nodes)
    common = sorted(set(logs[0]) & set(logs[1]) & set(logs[2]))
    first = min(logs[2])
    splits = [agreement(logs, r) for r in common]
    return {
        "run": run,
        "joiner_first_round": first,
        "first_round_seconds": [log[first]["seconds"] for log in logs],
        "most_hashes_in_a_round": max(h for h, _ in splits),
        "nodes_healed": sum(healed for _, healed in splits),
        "deadline_waits": deadline_waits(logs, common),
        "agree": all(h == 1 for h, _ in splits),
    }


def plot(out: Path, scenario: str, name: str, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    runs = [row["run"] for row in rows]
    if scenario == "late-join":
        for node in range(3):
            ax.bar([r + (node - 1) * 0.27 for r in runs], [row["first_round_seconds"][node] for row in rows], 0.27,
                   label=["node 0", "node 1", "joiner"][node])  # fmt: skip
        ax.set_ylabel("joiner's first round (s)")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.bar(runs, [row["hashes_at_last_round"] for row in rows])
        ax.set_ylabel("global hashes, last round")
        ax.set_yticks([0, 1, 2, 3])
    ax.set_xlabel("run")
    agreed = sum(row["agree"] for row in rows)
    ax.set_title(f"{name}: {agreed}/{len(rows)} runs agree")
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=["stop-together", "late-join"])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("runs/reliability"))
    parser.add_argument("--busy", type=int, default=0, help="busy-loop processes alongside (a loaded machine)")
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    scenario = stop_together if args.scenario == "stop-together" else late_join
    rows = []
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        with tempfile.TemporaryDirectory(prefix="dgrpo-fed-") as net:  # the daemons' state: not results
            for run in range(args.runs):
                row = scenario(Path(net) / f"run-{run}", run)
                rows.append(row)
                progress(f"{args.scenario} run {run + 1}/{args.runs}: {json.dumps(row)}")
    finally:
        for proc in busy:
            proc.kill()
    agreed = sum(row["agree"] for row in rows)
    result = {
        "scenario": args.scenario,
        "busy_processes": args.busy,
        "runs": args.runs,
        "agree": agreed,
        "deadline_waits": sum(row["deadline_waits"] for row in rows),
        "rows": rows,
    }
    name = f"{args.scenario}-busy{args.busy}" if args.busy else args.scenario
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    with (out / f"{name}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(out, args.scenario, name, rows)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
