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
