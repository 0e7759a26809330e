"""``dgrpo report A B C``: one self-contained HTML page comparing runs (``OUT/report.html``), with each run's own
page (:mod:`dgrpo.simulations.html_report`) written next to it as ``OUT/runs/<label>.html`` and linked.

The page overlays, one chart each and one colour per group of runs (:mod:`dgrpo.simulations.compare_series`):
held-out accuracy, honest reward, the attack success rate, a DoS run's mean completion length (on its own
chart), and the defense's stop rate and false-positive rate per round. A group with several runs (the seeds of
one cell) is drawn as its mean with the band from its least to its most run, and tabled as mean ± standard
error. Tables: every run (linked to its page), every group, and the defense's totals per run. Plots are inline
SVG: the page, like the run pages, loads nothing from the network.

Not on this page, but on each run's own: the configuration, verdicts per peer, rejections by reason, and a
federated run's compression and client weights.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import quote

from dgrpo.errors import ConfigError
from dgrpo.simulations.compare_series import (
    BY_KEY,
    Band,
    Group,
    Stat,
    band,
    bands,
    group_stat,
    groups_of,
    length_points,
)
from dgrpo.simulations.html_bands import band_plot
from dgrpo.simulations.html_parts import Cell, Link, Section, absent, figure, fmt, page, paragraph, section, table
from dgrpo.simulations.html_report import render_page
from dgrpo.simulations.html_run import RunData, read_rows
from dgrpo.simulations.run_set import ReportRun
from dgrpo.simulations.summary import RunSummary

RUN_PAGES = "runs"  # OUT/runs/<label>.html
Pair = tuple[ReportRun, RunData]


def page_names(runs: Sequence[ReportRun]) -> list[str]:
    """Each run's page, relative to the comparison page: ``runs/<label>.html`` with the label's ``/`` as ``__``
    and anything but letters, digits, ``.``, ``_`` and ``-`` as ``_`` (unique: a clash gets ``-2``, ...)."""
    names: list[str] = []
    taken: set[str] = set()
    for run in runs:
        stem = "__".join(re.sub(r"[^A-Za-z0-9._-]", "_", part) for part in run.label.split("/") if part)
        stem = stem.lstrip(".") or "run"
        name, k = stem, 2
        while name.lower() in taken:
            name, k = f"{stem}-{k}", k + 1
        taken.add(name.lower())
        names.append(f"{RUN_PAGES}/{name}.html")
    return names


def _count(value: float | int | None) -> float | int | None:
    """A count shows as one: 288, never 288.0."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def stat_cell(st: Stat | None, count: bool = False) -> object:
    """``mean ± s.e.`` (sorting by the mean); one run: its value alone."""
    if st is None:
        return None
    mean = _count(st.mean) if count else st.mean
    if st.se is None:
        return mean
    return Cell(f"{fmt(mean)} ± {fmt(_count(st.se) if count else st.se)}", st.mean)


def _rounds(s: RunSummary) -> int:
    return s.rounds_done if s.rounds_done is not None else s.rounds


def _length_ratio(s: RunSummary, baseline: RunSummary | None) -> float | None:
    base = baseline.final_mean_length if baseline is not None else None
    if baseline is None or not base or not s.length_metric or s.final_mean_length is None or s.task != baseline.task:
        return None
    return s.final_mean_length / base


def runs_table(pairs: Sequence[Pair], hrefs: Sequence[str], baseline: RunSummary | None) -> str:
    headers = ["run", "group", "seed", "mode", "attack", "defense", "rounds", "honest accuracy", "honest reward",
               "final ASR", "final mean length", "length vs baseline", "stop rate", "FPR", "attackers' share",
               "wall seconds"]  # fmt: skip
    rows = []
    for (run, _), href in zip(pairs, hrefs, strict=True):
        s = run.summary
        rows.append(
            [Link(run.label, href), run.group, run.seed, s.mode, s.attack or "none", s.chain, _rounds(s),
             s.honest_accuracy, s.final_honest_reward, s.final_rate, s.final_mean_length if s.length_metric else None,
             _length_ratio(s, baseline), s.stop_rate, s.false_positive_rate, s.attacker_share, s.wall_seconds]
        )  # fmt: skip
    caption = "Every run (a link opens its own page); final figures, ASR for attacks with a success rate"
    return table("runs", headers, rows, caption)


GROUP_MEASURES: list[tuple[str, Callable[[RunSummary], float | int | None], bool]] = [
    ("honest accuracy", lambda s: s.honest_accuracy, False),
    ("honest reward", lambda s: s.final_honest_reward, False),
    ("final ASR", lambda s: s.final_rate, False),
    ("final mean length", lambda s: s.final_mean_length if s.length_metric else None, False),
    ("stop rate", lambda s: s.stop_rate, False),
    ("FPR", lambda s: s.false_positive_rate, False),
    ("poisoned stopped", lambda s: s.defense.ratio("poison")[0] if s.defense else None, True),
    ("poisoned received", lambda s: s.defense.ratio("poison")[1] if s.defense else None, True),
    ("honest rejected", lambda s: s.defense.ratio("honest")[0] if s.defense else None, True),
    ("honest received", lambda s: s.defense.ratio("honest")[1] if s.defense else None, True),
]


def groups_table(groups: Sequence[Group]) -> str:
    headers = ["group", "runs", *(name for name, _, _ in GROUP_MEASURES)]
    rows = [
        [g.name, len(g.runs), *(stat_cell(group_stat(g, value), count) for _, value, count in GROUP_MEASURES)]
        for g in groups
    ]
    caption = "Per group (a cell's seeds): mean ± standard error over its runs"
    return table("groups", headers, rows, caption)


def runs_section(
    pairs: Sequence[Pair], hrefs: Sequence[str], groups: Sequence[Group], baseline: RunSummary | None
) -> Section:
    parts = [
        paragraph(
            f"{len(pairs)} run(s) in {len(groups)} group(s). Each run's configuration, verdicts per peer, rejections "
            "by reason and (federated) compression and client weights are on its own page, linked from its name."
        ),
        runs_table(pairs, hrefs, baseline),
    ]
    if any(len(g.runs) > 1 for g in groups):
        parts.append(groups_table(groups))
    else:
        parts.append(paragraph("Every group has one run: no means over seeds to table."))
    return section("runs", "Runs", *parts)


def chart(
    groups: Sequence[Group], key: str, extra: Sequence[Band] = (), reference: tuple[float, str] | None = None
) -> str | None:
    """The overlay of measure ``key``, or None where no run has points for it."""
    measure = BY_KEY[key]
    series = [*bands(groups, key), *extra]
    if not series:
        return None
    name = key.replace("_", "-")
    svg = band_plot(name, series, measure.ylabel, unit_range=measure.unit_range, reference=reference)
    spread = " A group of several runs: their mean, shaded from the least to the most of them at each round."
    return figure(name, svg, measure.caption + (spread if any(b.runs > 1 for b in series) else ""))


def _charts(groups: Sequence[Group], keys: Sequence[str]) -> list[str]:
    found = []
    for key in keys:
        fig = chart(groups, key)
        found.append(fig if fig is not None else paragraph(f"No run has {BY_KEY[key].title.lower()} points."))
    return found


def curves_section(groups: Sequence[Group]) -> Section:
    return section(
        "curves", "Accuracy and reward", '<div class="grid">', *_charts(groups, ["accuracy", "reward"]), "</div>"
    )


def attack_section(groups: Sequence[Group], baseline: RunData | None) -> Section:
    summaries = [run.summary for g in groups for run, _ in g.runs]
    if not any(s.attack for s in summaries):
        return absent("attack", "Attack", "no run has an attack")
    parts = _charts(groups, ["asr"]) if any(s.attack and not s.length_metric for s in summaries) else []
    if any(s.length_metric for s in summaries):
        extra: list[Band] = []
        reference = None
        if baseline is not None:
            base = length_points(baseline.summary)
            if base:
                extra.append(band(f"baseline: {baseline.folder.name}", len(groups), [base], dashed=True))
            elif baseline.summary.final_mean_length is not None:
                reference = (baseline.summary.final_mean_length, f"baseline: {baseline.folder.name}")
        fig = chart(groups, "length", extra, reference)
        parts.append(fig if fig is not None else paragraph("No DoS run has mean length points."))
    return section("attack", "Attack", '<div class="grid">', *parts, "</div>")


def defense_table(pairs: Sequence[Pair]) -> str:
    headers = ["run", "chain", "poisoned stopped", "poisoned received", "stop rate", "honest rejected",
               "honest received", "FPR", "overhead (x generation time)"]  # fmt: skip
    rows: list[list[object]] = []
    for run, _ in pairs:
        d = run.summary.defense
        if d is None:
            rows.append([run.label, "none", None, None, None, None, None, None, None])
            continue
        (ps, pr), (hr, hn) = d.ratio("poison"), d.ratio("honest")
        rows.append(
            [run.label, run.summary.chain, ps, pr, d.stop_rate, hr, hn, d.false_positive_rate, d.overhead_ratio]
        )
    return table("defense", headers, rows, "Defense totals per run (completions counted by the sender's role)")


def defense_section(pairs: Sequence[Pair], groups: Sequence[Group]) -> Section:
    if all(run.summary.defense is None for run, _ in pairs):
        return absent("defense", "Defense", "no run has a defense chain or an attacker to measure")
    charts = _charts(groups, ["stop_rate", "fpr"])
    return section("defense", "Defense", '<div class="grid">', *charts, "</div>", defense_table(pairs))


def render_comparison(pairs: Sequence[Pair], hrefs: Sequence[str], baseline: RunData | None = None) -> str:
    groups = groups_of(pairs)
    base = baseline.summary if baseline is not None else None
    sections = [
        runs_section(pairs, hrefs, groups, base),
        curves_section(groups),
        attack_section(groups, baseline),
        defense_section(pairs, groups),
    ]
    seeds = sum(1 for g in groups if len(g.runs) > 1)
    subtitle = f"{len(pairs)} run(s), {len(groups)} group(s), {seeds} with several seeds (mean, band min-max)"
    return page(f"dgrpo report: {len(pairs)} runs", subtitle, sections)


def write_comparison(runs: Sequence[ReportRun], out: Path, baseline: RunData | None = None) -> Path:
    """``out/report.html`` and each run's page in ``out/runs/``; returns the comparison page's path."""
    pairs = [(run, RunData(run.folder, run.summary, read_rows(run.folder))) for run in runs]
    hrefs = page_names(runs)
    path = out / "report.html"
    try:
        (out / RUN_PAGES).mkdir(parents=True, exist_ok=True)
        for (_, data), href in zip(pairs, hrefs, strict=True):
            (out / href).write_text(render_page(data), encoding="utf-8")
        path.write_text(render_comparison(pairs, [quote(h) for h in hrefs], baseline), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write the report in {out}: {exc}") from None
    return path
