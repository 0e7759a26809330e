"""Inline SVG overlay charts for the comparison page: one line per group of runs, its mean over the group's
runs, with the band from their least to their most where the group has more than one run.

Made like the run page's charts (:mod:`dgrpo.simulations.html_plots`: text kept as text, ids prefixed, labels
made literal for matplotlib); the x axis is rounds, with integer ticks only.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from dgrpo.simulations.compare_series import Band
from dgrpo.simulations.html_plots import literal, to_svg

LABEL_CHARS = 64  # a legend entry: a sweep's <scenario>/<defense> and its seed count fit


def band_plot(
    name: str,
    series: Sequence[Band],
    ylabel: str,
    unit_range: bool = False,
    reference: tuple[float, str] | None = None,
) -> str:
    """One chart of ``series`` over rounds (element ids prefixed with ``name``); ``unit_range`` fixes y to
    [0, 1]; ``reference`` is a labelled horizontal line (e.g. a baseline's final length)."""
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dgrpo"}):
        fig, ax = plt.subplots(figsize=(7, 3.8))
        for s in series:
            color = f"C{s.color % 10}"
            xs, ys = [p[0] for p in s.mean], [p[1] for p in s.mean]
            style = ":" if s.dashed else "-"
            ax.plot(xs, ys, style, color=color, marker="o", markersize=3, label=literal(s.label, LABEL_CHARS))
            if s.runs > 1:
                lows, highs = [p[1] for p in s.low], [p[1] for p in s.high]
                ax.fill_between(xs, lows, highs, color=color, alpha=0.18, linewidth=0)
        if reference is not None:
            ax.axhline(reference[0], color="0.4", linestyle=":", label=literal(reference[1], LABEL_CHARS))
        if unit_range:
            ax.set_ylim(-0.02, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if series or reference is not None:
            ax.legend(loc="best", fontsize=7)
        fig.tight_layout()
        return to_svg(fig, name)
