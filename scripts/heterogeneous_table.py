"""The issue-28 table of docs/results.md from scripts/heterogeneous_matrix.sh's run folders: per attack, mix and
run length, the stop rate, the false-positive rate of each honest model family (the target: stop >= 0.9 and
every family's FPR <= 0.05), the reasons behind the rejections (all, and the honest completions' alone: what
costs each family) and the final ASR. Also writes the rows as CSV
and a plot of stop rate and worst family FPR per cell.

Usage: .venv/bin/python scripts/heterogeneous_table.py runs/heterogeneous [--csv F.csv] [--png F.png]
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any

SHORT = {"dgrpo:tiny-arith": "arith", "dgrpo:tiny-arith-llama": "llama", "dgrpo:tiny-arith-text": "text",
         "dgrpo:tiny-arith-code-text": "code-text"}  # fmt: skip


def cells(root: Path) -> list[dict[str, Any]]:
    out = []
    for run in sorted(p.parent for p in root.glob("*/summary.json")):
        attack, mix, rounds = run.name.rsplit("-", 2)
        s = json.loads((run / "summary.json").read_text())
        d = s.get("defense") or {}
        counts = d.get("counts") or {}
        families = {SHORT.get(m, m): r for m, r in (d.get("false_positive_rate_by_model") or {}).items()}
        worst = max(families.values(), default=0.0)
        stop = d.get("stop_rate")
        metric = s.get("final_asr")
        out.append({
            "attack": attack.replace("_", " "), "mix": mix, "rounds": int(rounds.removeprefix("r")),
            "stop": stop, "stopped": counts.get("poison_rejected", 0), "poisoned": counts.get("poison_received", 0),
            "fpr": d.get("false_positive_rate"), "worst_family_fpr": worst,
            "families": " ".join(f"{m} {r:.3f}" for m, r in sorted(families.items())),
            "reasons": ", ".join(f"{k} {v}" for k, v in Counter(d.get("rejected_by_reason") or {}).most_common(3)),
            "honest_reasons": ", ".join(
                f"{k} {v}" for k, v in Counter((d.get("rejected_by_kind") or {}).get("honest") or {}).most_common()
            ),
            "asr": (f"{metric:.1f} chars" if s.get("asr_metric") == "mean_length" else f"{metric:.3f}")
            if metric is not None else "-",
            "holds": stop is not None and stop >= 0.9 and worst <= 0.05,
        })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--csv", type=Path)
    parser.add_argument("--png", type=Path)
    args = parser.parse_args()
    rows = cells(args.root)
    order = {"E2": 0, "A4": 1, "D3": 2, "M2": 3, "C3": 4}
    rows.sort(key=lambda r: (r["rounds"], order.get(r["mix"], 9), r["attack"]))
    print(
        "| attack | mix | rounds | stop (stopped/poisoned) | FPR per honest family | worst | holds | "
        "most frequent reasons | honest completions rejected by | final ASR |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        stop = "-" if r["stop"] is None else f"{r['stop']:.3f} ({r['stopped']}/{r['poisoned']})"
        holds = "yes" if r["holds"] else "**no**"
        print(
            f"| {r['attack']} | {r['mix']} | {r['rounds']} | {stop} | {r['families']} | "
            f"{r['worst_family_fpr']:.3f} | {holds} | {r['reasons'] or '-'} | {r['honest_reasons'] or '-'} | "
            f"{r['asr']} |"
        )
    print(f"\n{sum(r['holds'] for r in rows)} of {len(rows)} cells hold (stop >= 0.9, every family's FPR <= 0.05)")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = [f"{r['attack']} {r['mix']} r{r['rounds']}" for r in rows]
        fig, ax = plt.subplots(2, 1, figsize=(max(8, len(rows) * 0.35), 7), sharex=True)
        ax[0].bar(range(len(rows)), [r["stop"] or 0.0 for r in rows], color="tab:green")
        ax[0].axhline(0.9, color="k", ls="--", lw=1)
        ax[0].set_ylabel("stop rate")
        ax[1].bar(range(len(rows)), [r["worst_family_fpr"] for r in rows], color="tab:red")
        ax[1].axhline(0.05, color="k", ls="--", lw=1)
        ax[1].set_ylabel("worst family FPR")
        ax[1].set_xticks(range(len(rows)), labels, rotation=90, fontsize=7)
        fig.suptitle("the heterogeneous chain: stop rate and the worst honest family's FPR per cell")
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)


if __name__ == "__main__":
    main()
