"""The issue-12 tables of docs/results.md from the matrices' run folders (scripts/binding_matrix.sh,
scripts/surprisal_matrix.sh): stop rate, FPR, the attacker's share of what honest nodes trained on, the
admission and defense reasons behind the stops, the final ASR (or mean length) and honest accuracy.

Usage: .venv/bin/python scripts/binding_table.py runs/binding [--hetero runs/surprisal]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any


def _f(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(counts: dict[str, int], kind: str) -> str:
    received = counts.get(f"{kind}_received", 0)
    return f"{counts.get(f'{kind}_rejected', 0)}/{received}" if received else "-"


def row(run: Path, label: str, defense: str) -> str:
    s = json.loads((run / "summary.json").read_text())
    d = s.get("defense") or {}
    counts = d.get("counts") or {}
    reasons = Counter(d.get("rejected_by_reason") or {})
    top = ", ".join(f"{k} {v}" for k, v in reasons.most_common(3)) or "-"
    metric = s.get("final_asr")
    shown = f"{metric:.1f} chars" if s.get("asr_metric") == "mean_length" and metric is not None else _f(metric)
    accuracy = f"{_f(s.get('initial_accuracy'))} -> {_f(s.get('honest_final_accuracy'))}"
    return (
        f"| {label} | {defense} | {_f(d.get('stop_rate'))} ({_ratio(counts, 'poison')}) | "
        f"{_f(d.get('false_positive_rate'))} ({_ratio(counts, 'honest')}) | {_f(s.get('attacker_share'))} | "
        f"{shown} | {accuracy} | {top} | {s['rounds']} |"
    )


HEADER = (
    "| attack | defense | stop rate (stopped/poisoned) | FPR (honest rejected/received) | attacker share "
    "(fair 0.25) | final ASR (metric) | honest accuracy | most frequent reasons | rounds |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("matrix", type=Path, nargs="?")
    parser.add_argument("--hetero", type=Path)
    args = parser.parse_args()
    if args.matrix is not None:
        print(HEADER)
        attacks = ["text", "math", "math-on-plan", "code", "dos", "select", "over-publish", "repeat-part",
                   "off-plan", "non-canonical"]  # fmt: skip
        names = {"none": "none (binding only)", "logit": "logit", "sampling-proof": "sampling-proof",
                 "best": "best: code-policy+sampling-proof"}  # fmt: skip
        for attack in attacks:
            for defense, label in names.items():
                run = args.matrix / f"{attack}-{defense}"
                if (run / "summary.json").exists():
                    print(row(run, attack, label))
    if args.hetero is not None:
        print()
        print(HEADER.replace("attack |", "attack (mix) |", 1))
        for run in sorted(p.parent for p in args.hetero.glob("*/summary.json")):
            attack, mix, *chain = run.name.split("-")
            print(row(run, f"{attack} ({mix})", "-".join(chain)))


if __name__ == "__main__":
    main()
