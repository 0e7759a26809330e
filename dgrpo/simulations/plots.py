"""PNG plots of simulation results (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_curves(
    rows: Sequence[dict[str, Any]], accuracy: Sequence[tuple[int, float]], path: Path, title: str = ""
) -> None:
    """Mean honest reward per round and held-out accuracy at each evaluation, on one chart."""
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["round"] for r in rows], [r["honest_mean_reward"] for r in rows], label="mean honest reward")
    ax.plot([a[0] for a in accuracy], [a[1] for a in accuracy], marker="o", label="held-out accuracy")
    ax.set_xlabel("round")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_asr(
    asr: Sequence[Sequence[float]],
    accuracy: Sequence[tuple[int, float]],
    path: Path,
    metric: str = "asr",
    title: str = "",
) -> None:
    """The attack's success per evaluation (ASR, or mean length for DoS), honest accuracy on a second axis."""
    fig, ax = plt.subplots(figsize=(7, 4))
    label = "ASR" if metric == "asr" else "mean completion length (chars)"
    ax.plot([a[0] for a in asr], [a[1] for a in asr], marker="o", color="tab:red", label=label)
    ax.set_xlabel("round")
    ax.set_ylabel(label, color="tab:red")
    if metric == "asr":
        ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    acc_ax = ax.twinx()
    acc_ax.plot(
        [a[0] for a in accuracy], [a[1] for a in accuracy], marker="s", color="tab:blue", label="honest accuracy"
    )
    acc_ax.set_ylabel("honest held-out accuracy", color="tab:blue")
    acc_ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    fig.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_federated(curves: dict[str, Sequence[Sequence[float]]], path: Path, title: str = "") -> None:
    """Held-out accuracy per round, one line per method (federated runs and their baselines)."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (name, points) in enumerate(curves.items()):
        style = "-" if i < 10 else "--"  # ten colours, then the same colours dashed: no two lines look alike
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        ax.plot(xs, ys, style, color=f"C{i % 10}", marker="o", markersize=3, label=name)
    ax.set_xlabel("round")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
