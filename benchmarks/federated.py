"""The Fed-GRPO results table (docs/results.md, "Federated mode"): every method on the same 5 non-IID clients.

    .venv/bin/python benchmarks/federated.py [--out runs/federated] [--jobs 2] [--rounds 20] [--only fed-avg,...]

Each row is a shipped scenario with overrides, run exactly as ``dgrpo simulate <scenario> -s ...`` would
(``dgrpo.simulations.runner.run_simulation``), ``--jobs`` rows at a time in separate processes. Writes
``table.json``, ``table.csv``, ``table.md`` (the markdown rows of docs/results.md), ``accuracy.png`` (held-out
accuracy per round of every method) and each row's own run folder, and prints the table with the issue's
targets checked: Fed-GRPO >= FedAvg; sparse Fed-GRPO at >= 32x entries at most 1 point below the dense run, at
>= 600x at most 5 points below; the attacker's weight share and accuracy with and without the defense.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

# (row name, scenario, overrides)
ROWS: list[tuple[str, str, list[str]]] = [
    ("centralized", "fed-centralized", []),
    ("local-only", "fed-avg", ["federated.method=local"]),
    ("FedAvg", "fed-avg", []),
    ("FGRPO relative gain", "fed-avg", ["federated.weighting=relative-gain"]),
    ("+ signal weighting", "fed-avg", ["federated.weighting=signal"]),
    ("+ calibration (dense Fed-GRPO)", "fed-avg", ["federated.weighting=signal", "federated.calibration.enabled=true"]),
    ("+ sparsity 1/32 (Fed-GRPO)", "fed-grpo", []),
    ("+ sparsity 1/640", "fed-grpo", ["federated.sparsity.budget=0.0015625"]),
    ("std attack, undefended", "fed-std-attack", []),
    ("std attack, stats bounded", "fed-std-attack", ["federated.defense.bound_stats=true"]),
    (
        "std attack, stats bounded + multi-krum",
        "fed-std-attack",
        ["federated.defense.bound_stats=true", "federated.aggregator=multi-krum"],
    ),
]


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")


def run_row(name: str, scenario: str, overrides: list[str], out: Path, rounds: int | None) -> dict[str, Any]:
    from dgrpo.simulations.runner import run_simulation
    from dgrpo.simulations.scenario import load_scenario

    extra = [f"rounds={rounds}"] if rounds else []
    sc = load_scenario(Path(scenario), [*overrides, *extra])
    t0 = time.perf_counter()
    summary = run_simulation(sc, out / slug(name))
    fed = summary["federated"]
    print(f"  {name}: accuracy {summary['final_accuracy']:.3f} in {time.perf_counter() - t0:.0f}s", flush=True)
    return {
        "method": name,
        "scenario": scenario,
        "overrides": overrides,
        "final_accuracy": summary["final_accuracy"],
        "accuracy": fed["accuracy"],
        "bytes_per_client_per_round": fed["bytes_per_client_per_round"],
        "compression_entries": fed["compression_entries"],
        "compression_bytes": fed["compression_bytes"],
        "attacker_weight_share": fed["attacker_weight_share"],
        "wall_seconds": summary["wall_seconds"],
    }


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| method | final accuracy | bytes / client / round | compression (entries) | compression (bytes) "
        "| attacker weight share |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        traffic = r["bytes_per_client_per_round"]
        lines.append(
            f"| {r['method']} | {r['final_accuracy']:.3f} | {fmt(traffic and traffic / 1024, ',.0f')} KiB "
            f"| {fmt(r['compression_entries'], '.1f')}x | {fmt(r['compression_bytes'], '.1f')}x "
            f"| {fmt(r['attacker_weight_share'], '.3f')} |"
        )
    return "\n".join(lines).replace("| - KiB |", "| - |")


def targets(by_name: dict[str, dict[str, Any]]) -> list[str]:
    """The issue's targets, each with the numbers it compares."""
    out = []

    def acc(name: str) -> float | None:
        return by_name[name]["final_accuracy"] if name in by_name else None

    fedavg, dense, sparse32, sparse600 = (
        acc("FedAvg"),
        acc("+ calibration (dense Fed-GRPO)"),
        acc("+ sparsity 1/32 (Fed-GRPO)"),
        acc("+ sparsity 1/640"),
    )
    if fedavg is not None and sparse32 is not None:
        out.append(f"Fed-GRPO >= FedAvg: {sparse32:.3f} vs {fedavg:.3f}: {'met' if sparse32 >= fedavg else 'NOT met'}")
    for label, value, name, allowed in (
        ("1/32", sparse32, "+ sparsity 1/32 (Fed-GRPO)", 0.01),
        ("1/640", sparse600, "+ sparsity 1/640", 0.05),
    ):
        if dense is not None and value is not None:
            comp = by_name[name]["compression_entries"]
            ok = value >= dense - allowed
            out.append(
                f"sparse {label} ({comp:.0f}x entries) within {allowed * 100:.0f} point(s) of dense: "
                f"{value:.3f} vs {dense:.3f}: {'met' if ok else 'NOT met'}"
            )
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    from dgrpo.simulations.plots import plot_federated

    plot_federated(
        {r["method"]: r["accuracy"] for r in rows if "attack" not in r["method"]},
        path,
        title="Fed-GRPO on arith, 5 non-IID clients (tiny model)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/federated"))
    parser.add_argument("--jobs", type=int, default=2, help="rows run at once (one torch thread each)")
    parser.add_argument("--rounds", type=int, default=None, help="override every row's rounds")
    parser.add_argument("--only", default="", help="comma-separated row names (default: all)")
    args = parser.parse_args()
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    chosen = [r for r in ROWS if not wanted or r[0] in wanted]
    if wanted - {r[0] for r in ROWS}:
        sys.exit(f"unknown rows {sorted(wanted - {r[0] for r in ROWS})}; rows: {[r[0] for r in ROWS]}")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{len(chosen)} rows, {args.jobs} at a time -> {args.out}", flush=True)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_row, n, s, o, args.out, args.rounds) for n, s, o in chosen]
        rows = [f.result() for f in futures]
    (args.out / "table.json").write_text(json.dumps(rows, indent=2) + "\n")
    with (args.out / "table.csv").open("w", newline="") as f:
        fields = [k for k in rows[0] if k not in ("accuracy", "overrides")]
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    table = markdown(rows)
    (args.out / "table.md").write_text(table + "\n")
    plot(rows, args.out / "accuracy.png")
    print(table)
    for line in targets({r["method"]: r for r in rows}):
        print(line)


if __name__ == "__main__":
    main()
