"""``dgrpo report DIR...``: one comparison table (markdown and CSV) and one overlay plot from several runs.

Each DIR holds a run's ``summary.json``. With a baseline run (``--baseline DIR``, e.g. the same scenario with
no malicious node), the table adds each run's final mean completion length relative to the baseline's, the
DoS figure of merit (paper: honest lengths more than double).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from dgrpo.errors import ConfigError

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


def load_summary(run: Path) -> dict[str, Any]:
    path = run / "summary.json" if run.is_dir() else run
    if not path.is_file():
        raise ConfigError(f"no summary.json in {run}")
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    data.setdefault("_dir", str(path.parent))
    return data


def table_rows(summaries: Sequence[dict[str, Any]], baseline: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    base_len = baseline.get("final_mean_length") if baseline else None
    rows = []
    for s in summaries:
        asr = [v for _, v in s.get("asr") or []]
        length = s.get("final_mean_length")
        comparable = baseline is not None and s.get("task") == baseline.get("task")
        defense = s.get("defense") or {}
        rows.append(
            {
                "run": Path(s["_dir"]).name,
                "attack": s.get("attack") or "none",
                "split": s.get("split"),
                "malicious": s.get("malicious", 0),
                "rounds": s.get("rounds"),
                "metric": s.get("asr_metric") or "",
                "final_asr": s.get("final_asr"),
                "max_asr": max(asr) if asr else None,
                "initial_accuracy": s.get("initial_accuracy"),
                "honest_final_accuracy": s.get("honest_final_accuracy", s.get("final_accuracy")),
                "final_mean_length": length,
                "length_vs_baseline": (length / base_len) if comparable and length is not None and base_len else None,
                "defense": ",".join(defense.get("names") or []) or "none",
                "stop_rate": defense.get("stop_rate"),
                "false_positive_rate": defense.get("false_positive_rate"),
                "overhead_ratio": defense.get("overhead_ratio"),
                "attacker_share": s.get("attacker_share"),
                "fair_share": s.get("fair_share") if s.get("malicious") else None,
                "wall_seconds": s.get("wall_seconds"),
            }
        )
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
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
        writer.writerow({c: "" if r[c] is None else r[c] for c in COLUMNS})
    return buf.getvalue()


def overlay_plot(summaries: Sequence[dict[str, Any]], path: Path) -> None:
    """ASR per round of every run (mean length on its own panel for DoS runs), honest accuracy dashed."""
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        by_metric.setdefault(s.get("asr_metric") or "accuracy", []).append(s)
    fig, axes = plt.subplots(1, len(by_metric), figsize=(7 * len(by_metric), 4.5), squeeze=False)
    for ax, (metric, group) in zip(axes[0], sorted(by_metric.items()), strict=True):
        acc_ax = ax.twinx()
        for i, s in enumerate(group):
            color = f"C{i % 10}"
            label = Path(s["_dir"]).name
            if s.get("asr"):
                ax.plot([a[0] for a in s["asr"]], [a[1] for a in s["asr"]], marker="o", color=color, label=label)
            acc = s.get("accuracy") or []
            acc_ax.plot([a[0] for a in acc], [a[1] for a in acc], linestyle="--", color=color, alpha=0.6)
        ax.set_xlabel("round")
        ax.set_ylabel({"asr": "ASR (solid)", "mean_length": "mean length, chars (solid)"}.get(metric, metric))
        if metric == "asr":
            ax.set_ylim(-0.02, 1.02)
        acc_ax.set_ylim(-0.02, 1.02)
        acc_ax.set_ylabel("honest accuracy (dashed)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_report(runs: Sequence[Path], out: Path, baseline: Path | None = None) -> list[dict[str, Any]]:
    """Write ``report.md``, ``report.csv`` and ``report.png`` to ``out``; returns the table rows."""
    if not runs:
        raise ConfigError("report: give at least one run folder")
    summaries = [load_summary(r) for r in runs]
    rows = table_rows(summaries, load_summary(baseline) if baseline is not None else None)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(to_markdown(rows))
    (out / "report.csv").write_text(to_csv(rows))
    overlay_plot(summaries, out / "report.png")
    return rows
