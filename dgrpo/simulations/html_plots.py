"""Inline SVG line plots for the run page (matplotlib, headless).

Text stays text (``svg.fonttype = none``): no glyph outlines to embed and the browser's own sans-serif draws
it, so the page needs no font file. The XML prologue, DOCTYPE and metadata matplotlib writes are cut: inline
SVG in HTML needs none of them, and they name ``http://`` URLs that a reader of the page could take for
resources. Labels that came from the run (peer and client names) are made literal for matplotlib, whose
mathtext would otherwise parse, and could fail on, a hostile name holding ``$``.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

LABEL_CHARS = 40  # a legend entry; longer names are cut


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    dashed: bool = False


def literal(label: str, chars: int = LABEL_CHARS) -> str:
    """``label`` as matplotlib will show it verbatim: ``$`` escaped (no mathtext), no leading ``_`` (which
    would hide it from the legend), cut to ``chars`` characters."""
    text = label if len(label) <= chars else label[: chars - 1] + "…"
    text = text.replace("\\", "\\\\").replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def line_plot(
    name: str,
    series: Sequence[Series],
    ylabel: str,
    unit_range: bool = False,
    log_y: bool = False,
    reference: tuple[float, str] | None = None,
) -> str:
    """One chart of ``series`` over rounds, its element ids prefixed with ``name``; ``unit_range`` fixes y to
    [0, 1]; ``reference`` is a labelled horizontal line (e.g. the dense size an update is compressed against)."""
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dgrpo"}):
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for i, s in enumerate(series):
            xs, ys = [p[0] for p in s.points], [p[1] for p in s.points]
            ax.plot(
                xs, ys, "--" if s.dashed else "-", color=f"C{i % 10}", marker="o", markersize=3, label=literal(s.label)
            )
        if reference is not None:
            ax.axhline(reference[0], color="0.4", linestyle=":", label=literal(reference[1]))
        if log_y:
            ax.set_yscale("log")
        if unit_range:
            ax.set_ylim(-0.02, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if series or reference is not None:
            ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        return to_svg(fig, name)


def to_svg(fig: Figure, name: str) -> str:
    """``fig`` as inline SVG markup, its ids prefixed with ``name``; the figure is closed."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    # The HTML parser puts <svg> in the SVG namespace and knows xlink:href; the declarations are URLs only.
    head, rest = text.split(">", 1)
    return _prefix_ids(re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", head) + ">" + rest, name)


def _prefix_ids(svg: str, prefix: str) -> str:
    """Every figure names its parts ``figure_1``, ``axes_1``...: prefixed, ids stay unique on a page of several.
    Only inside tags (text content has its ``<`` escaped, so a tag never starts in it)."""

    def tag(match: re.Match[str]) -> str:
        t = match.group(0)
        t = re.sub(r'(\sid=")', rf"\1{prefix}-", t)
        t = t.replace("url(#", f"url(#{prefix}-")
        return re.sub(r'(href=")#', rf"\1#{prefix}-", t)

    return re.sub(r"<[^<>]+>", tag, svg)
