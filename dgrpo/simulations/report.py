"""``dgrpo report DIR...``: one comparison table (markdown and CSV) and one overlay plot from several runs.

Each DIR is a run, or a sweep's or a study's folder of runs (:mod:`dgrpo.simulations.run_set`). With a
baseline run (``--baseline DIR``, e.g. the same scenario with no malicious node), the table adds each run's
final mean completion length relative to the baseline's, the DoS figure of merit (paper: honest lengths more
than double).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from dgrpo.simulations.run_set import ReportRun, collect
from dgrpo.simulations.summary import RunSummary, load_summary

COLUMNS = [
    "run",
    "attack",
    "split",
    "malicious",
    "rounds",
    "metric",
    "final_asr",
    "max_asr",
    "initial_accuracy",
    "honest_final_accuracy",
    "final_mean_length",
    "length_vs_baseline",
    "defense",
    "stop_rate",
    "false_positive_rate",
    "overhead_ratio",
    "attacker_share",
    "fair_share",
    "wall_seconds",
]


def table_rows(runs: Sequence[ReportRun], baseline: RunSummary | None = None) -> list[dict[str, Any]]:
    """One row per run. ``final_asr`` is a success rate; a DoS run (measured by length) has none, its figure is
    ``final_mean_length`` and, with a baseline, ``length_vs_baseline``."""
    base_len = baseline.final_mean_length if baseline is not None else None
    rows = []
    for run in runs:
        s = run.summary
        length = s.final_mean_length
        comparable = baseline is not None and s.task == baseline.task
        rows.append(
            {
                "run": run.label,
                "attack": s.attack or "none",
                "split": s.split,
                "malicious": s.malicious,
                "rounds": s.rounds_done if s.rounds_done is not None else s.rounds,
                "metric": s.asr_metric or "",
                "final_asr": s.final_rate,
                "max_asr": None if s.length_metric else s.max_asr,
                "initial_accuracy": s.initial_accuracy,
                "honest_final_accuracy": s.honest_accuracy,
                "final_mean_length": length,
                "length_vs_baseline": (length / base_len) if comparable and length is not None and base_len else None,
                "defense": s.chain,
                "stop_rate": s.stop_rate,
                "false_positive_rate": s.false_positive_rate,
                "overhead_ratio": s.defense.overhead_ratio if s.defense is not None else None,
                "attacker_share": s.attacker_share,
                "fair_share": s.fair_share if s.malicious else None,
                "wall_seconds": s.wall_seconds,
            }
        )
    return rows


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):  # NaN: not measured (a testnet's accuracy)
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1:
        return str(int(value))  # a count that went through a mean or JSON prints as one
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def to_markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    for r in rows:
        writer.writerow({c: "" if r[c] is None or r[c] != r[c] else r[c] for c in COLUMNS})  # None, NaN: empty
    return buf.getvalue()


def overlay_plot(runs: Sequence[ReportRun], path: Path) -> None:
    """ASR per round of every run (mean length on its own panel for DoS runs), honest accuracy dashed."""
    by_metric: dict[str, list[ReportRun]] = {}
    for run in runs:
        by_metric.setdefault(run.summary.asr_metric or "accuracy", []).append(run)
    fig, axes = plt.subplots(1, len(by_metric), figsize=(7 * len(by_metric), 4.5), squeeze=False)
    for ax, (metric, group) in zip(axes[0], sorted(by_metric.items()), strict=True):
        acc_ax = ax.twinx()
        for i, run in enumerate(group):
            color = f"C{i % 10}"
            s = run.summary
            if s.asr:
                ax.plot([a[0] for a in s.asr], [a[1] for a in s.asr], marker="o", color=color, label=run.label)
            acc_ax.plot([a[0] for a in s.accuracy], [a[1] for a in s.accuracy], linestyle="--", color=color, alpha=0.6)
        ax.set_xlabel("round")
        ax.xaxis.get_major_locator().set_params(integer=True)  # rounds are whole
        ax.set_ylabel({"asr": "ASR (solid)", "mean_length": "mean length, chars (solid)"}.get(metric, metric))
        if metric == "asr":
            ax.set_ylim(-0.02, 1.02)
        acc_ax.set_ylim(-0.02, 1.02)
        acc_ax.set_ylabel("honest accuracy (dashed)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # runs without an ASR (federated, testnet) draw accuracy only
            ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_report(paths: Sequence[Path], out: Path, baseline: Path | None = None) -> list[dict[str, Any]]:
    """Write ``report.md``, ``report.csv`` and ``report.png`` to ``out`` for every run under ``paths`` (runs,
    sweeps, studies: :func:`dgrpo.simulations.run_set.collect`); returns the table rows."""
    runs = collect(paths)
    rows = table_rows(runs, load_summary(baseline) if baseline is not None else None)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(to_markdown(rows))
    (out / "report.csv").write_text(to_csv(rows))
    overlay_plot(runs, out / "report.png")
    return rows
