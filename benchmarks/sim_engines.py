"""Simulation engines side by side (issue 27): 8 nodes against 1, batched against one by one, Ray against
in-process. ``python benchmarks/sim_engines.py --out docs/figures/engines``.

Every row is the default scenario (``dgrpo simulate``: arith, the tiny model, global batch B = 8 prompts x
G = 8 completions split over the nodes, ``--rounds`` rounds), run by ``dgrpo simulate`` in its own process
(no run warms another's caches), one after another on this machine. Printed per row: wall time of the run
(``summary.json`` ``wall_seconds``: building the nodes, every round and evaluation; not the interpreter's start),
its ratio to the 1-node run, the final accuracy, and whether its rounds equal those of the row it is compared
with (every round's loss, rewards, acceptances and evaluation).

Rows: ``1 node``; ``8 nodes, one by one`` (``engine.batched=false``: each node's generation and update on its
own, as before issue 27); ``8 nodes, batched`` (the default); ``8 nodes, Ray`` (``engine.name=ray``, 2
actors of 4 nodes on a local Ray started by the run, batched within each actor; its start-up is in its wall
time). And the same for an attacked run (TEXT, 1 of 8 nodes malicious, honest nodes defended by ``logit``)
where the attacker's weights part from the honest nodes' (``--attack``).

Writes ``engines.json``, ``engines.csv`` and ``engines.png`` in ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dgrpo.simulations.summary import RunSummary, load_summary

ATTACK = ["nodes.malicious=1", "adversary.name=text", "model.name=dgrpo:tiny-arith-text", 'defense.chain=["logit"]']


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def simulate(out: Path, overrides: list[str]) -> tuple[RunSummary, list[dict[str, Any]]]:
    cmd = [sys.executable, "-m", "dgrpo", "simulate", "--out", str(out), "--overwrite"]  # a new measurement
    for o in overrides:
        cmd += ["-s", o]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    summary = load_summary(out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return summary, rows


def same_rounds(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    keys = ("loss", "honest_mean_reward", "honest_own_reward", "completions_accepted", "rejected", "accuracy", "asr")
    return [{k: r.get(k) for k in keys} for r in a] == [{k: r.get(k) for k in keys} for r in b]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/engines"))
    parser.add_argument("--rounds", type=int, default=50, help="the default scenario's 50")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--ray-workers", type=int, default=2)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--attack", action="store_true", help="also the attacked rows")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    n = args.nodes
    base = [f"rounds={args.rounds}"]
    # (name, overrides, compared with)
    # (name, overrides, compared with: the run whose rounds it must equal)
    plan: list[tuple[str, list[str], str | None]] = [
        ("1 node", [*base, "nodes.count=1"], None),
        (f"{n} nodes, one by one", [*base, f"nodes.count={n}", "engine.batched=false"], None),
        (f"{n} nodes, batched", [*base, f"nodes.count={n}"], f"{n} nodes, one by one"),
    ]
    if not args.no_ray:
        ray = [f"nodes.count={n}", "engine.name=ray", f"engine.workers={args.ray_workers}"]
        plan.append((f"{n} nodes, Ray ({args.ray_workers} actors)", [*base, *ray], f"{n} nodes, batched"))
    if args.attack:
        plan += [
            (f"{n} nodes attacked, one by one", [*base, f"nodes.count={n}", *ATTACK, "engine.batched=false"], None),
            (f"{n} nodes attacked, batched", [*base, f"nodes.count={n}", *ATTACK], f"{n} nodes attacked, one by one"),
        ]
        if not args.no_ray:
            plan.append(
                (
                    f"{n} nodes attacked, Ray ({args.ray_workers} actors)",
                    [*base, f"nodes.count={n}", *ATTACK, "engine.name=ray", f"engine.workers={args.ray_workers}"],
                    f"{n} nodes attacked, batched",
                )
            )
    runs: dict[str, tuple[RunSummary, list[dict[str, Any]]]] = {}
    table = []
    for i, (name, overrides, against) in enumerate(plan):
        progress(f"{name}: dgrpo simulate {' '.join('-s ' + o for o in overrides)}")
        runs[name] = simulate(args.out / f"run{i}", overrides)
        summary, rows = runs[name]
        row = {
            "run": name,
            "overrides": " ".join(overrides),
            "wall_s": round(summary.wall_seconds, 2),
            "vs_1_node": round(summary.wall_seconds / runs["1 node"][0].wall_seconds, 2),
            "vs_one_by_one": _vs_one_by_one(name, summary, runs),
            "final_accuracy": summary.final_accuracy,
            "final_asr": summary.final_asr,
            "compared_with": against,
            "same_rounds": same_rounds(rows, runs[against][1]) if against else None,
            "same_final": (
                summary.final_accuracy == runs[against][0].final_accuracy
                and summary.final_asr == runs[against][0].final_asr
            )
            if against
            else None,
            "engine": summary.engine,
        }
        table.append(row)
        progress(f"  wall {row['wall_s']} s ({row['vs_1_node']}x 1 node), accuracy {row['final_accuracy']}")
    (args.out / "engines.json").write_text(json.dumps({"rounds": args.rounds, "rows": table}, indent=2) + "\n")
    with (args.out / "engines.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[k for k in table[0] if k != "engine"])
        writer.writeheader()
        for row in table:
            writer.writerow({k: v for k, v in row.items() if k != "engine"})
    plot(table, args.out / "engines.png", args.rounds)
    print(f"\n{args.rounds} rounds of the default scenario (wall time of each run, this machine)")
    print(f"{'run':40s} {'wall s':>8s} {'x 1 node':>9s} {'x 1 by 1':>9s} {'accuracy':>9s} {'ASR':>6s}  same rounds as")
    for row in table:
        asr = "" if row["final_asr"] is None else f"{row['final_asr']:.3f}"
        same = "" if row["compared_with"] is None else f"{row['compared_with']}: {row['same_rounds']}"
        print(
            f"{row['run']:40s} {row['wall_s']:8.2f} {row['vs_1_node']:9.2f} "
            f"{'' if row['vs_one_by_one'] is None else format(row['vs_one_by_one'], '.2f'):>9s} "
            f"{row['final_accuracy']:9.3f} "
            f"{asr:>6s}  {same}"
        )


def _vs_one_by_one(
    name: str, summary: RunSummary, runs: dict[str, tuple[RunSummary, list[dict[str, Any]]]]
) -> float | None:
    """Wall time against the same network run one by one (the attacked rows' fair comparison: one node
    cannot be attacked)."""
    base = name.split(",")[0] + ", one by one"
    if base == name or base not in runs:
        return None
    return round(summary.wall_seconds / runs[base][0].wall_seconds, 2)


def plot(table: list[dict[str, Any]], path: Path, rounds: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.5 * len(table) + 1.5))
    names = [r["run"] for r in table][::-1]
    walls = [r["wall_s"] for r in table][::-1]
    ax.barh(names, walls, color="#4c72b0")
    for y, (w, r) in enumerate(zip(walls, table[::-1], strict=True)):
        ax.text(w, y, f" {r['vs_1_node']:.2f}x", va="center", fontsize=8)
    ax.set_xlabel(f"wall seconds, {rounds} rounds of the default scenario")
    ax.set_title("simulation engines (ratio to 1 node)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
