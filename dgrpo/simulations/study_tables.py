"""A study's tables, from its output folder: ``tables/<name>.md``, ``.csv`` and (where the study asks)
``.png`` per ``[[table]]``, and all of them in ``tables.md``.

A row is a cell; a column an axis (the value's label) or a measure (:mod:`dgrpo.simulations.measures`), over
the cell's seeds that have a summary (mean ± standard error where there are several). A cell with no finished
run yet is listed as such, so a table of a study in progress says what it is missing.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dgrpo.errors import ConfigError
from dgrpo.simulations.measures import MEASURES, Context, mean_se
from dgrpo.simulations.study import Cell, Study, TableSpec
from dgrpo.simulations.summary import RunSummary, has_summary, load_summary


@dataclass(frozen=True)
class CellRuns:
    cell: Cell  # its seed-0 run's description (coordinates and name)
    runs: tuple[RunSummary, ...]  # the seeds with a finished run


def finished(out: Path, cell: Cell) -> RunSummary | None:
    folder = out / cell.folder
    if not has_summary(folder):
        return None
    summary = load_summary(folder)
    return summary if summary.complete else None


def cell_runs(study: Study, out: Path) -> list[CellRuns]:
    by_name: dict[str, list[Cell]] = {}
    for cell in study.cells():
        by_name.setdefault(cell.name, []).append(cell)
    result = []
    for cells in by_name.values():
        runs = tuple(s for c in cells if (s := finished(out, c)) is not None)
        result.append(CellRuns(cells[0], runs))
    return result


def _holds(run: RunSummary, ctx: Context) -> bool:
    number = MEASURES.get("holds").number
    return number is not None and bool(number(run, ctx))


def _kept(spec: TableSpec, cell: Cell) -> bool:
    return all(cell.value(axis) in values for axis, values in spec.where.items())


def _header(study: Study, column: str) -> str:
    return column if column in study.spec.axes or column == "cell" else MEASURES.get(column).header


def table_markdown(study: Study, spec: TableSpec, cells: Sequence[CellRuns], ctx: Context) -> str:
    lines = []
    if spec.title:
        lines += [f"**{spec.title}**", ""]
    lines.append("| " + " | ".join(_header(study, c) for c in spec.columns) + " |")
    lines.append("|" + " --- |" * len(spec.columns))
    missing = []
    for entry in cells:
        if not entry.runs:
            missing.append(entry.cell.name)
            continue
        row = []
        for column in spec.columns:
            if column in study.spec.axes:
                value = entry.cell.value(column)
                row.append(study.label(column, value) if value is not None else entry.cell.name)
            elif column == "cell":
                row.append(entry.cell.name)
            elif column == "seeds":
                row.append(str(len(entry.runs)))
            elif column == "holds" and len(entry.runs) > 1:
                held = sum(1 for r in entry.runs if _holds(r, ctx))
                row.append(f"{'yes' if held == len(entry.runs) else '**no**'} ({held}/{len(entry.runs)} seeds)")
            else:
                row.append(MEASURES.get(column).show(entry.runs, ctx))
        lines.append("| " + " | ".join(row) + " |")
    if "holds" in spec.columns:
        done = [e for e in cells if e.runs]
        held = sum(1 for e in done if all(_holds(r, ctx) for r in e.runs))
        lines += ["", f"{held} of {len(done)} cells hold ({_target(spec)})"]
    if missing:
        lines += ["", f"not run yet: {', '.join(missing)}"]
    return "\n".join(lines) + "\n"


def _target(spec: TableSpec) -> str:
    h = spec.holds
    if h is None:
        return "no target set"
    parts = []
    if h.stop_min is not None:
        parts.append(f"stop >= {h.stop_min:g}")
    if h.fpr_max is not None:
        parts.append(f"FPR <= {h.fpr_max:g}")
    if h.family_fpr_max is not None:
        parts.append(f"every family's FPR <= {h.family_fpr_max:g}")
    return ", ".join(parts)


def table_csv(study: Study, spec: TableSpec, cells: Sequence[CellRuns], ctx: Context) -> str:
    """Numbers, not text: per cell the axes' values, the seeds, and each measure's mean and standard error."""
    measures = [c for c in spec.columns if c not in study.spec.axes and c not in ("cell", "seeds")]
    axes = [a for a in study.spec.axes]
    buf = io.StringIO()
    writer = csv.writer(buf)
    header = ["cell", *axes, "seeds"]
    for m in measures:
        header += [m, f"{m}_se"] if MEASURES.get(m).number is not None else [m]
    writer.writerow(header)
    for entry in cells:
        if not entry.runs:
            continue
        row: list[object] = [entry.cell.name, *(entry.cell.value(a) or "" for a in axes), len(entry.runs)]
        for m in measures:
            measure = MEASURES.get(m)
            if measure.number is None:
                row.append(measure.show(entry.runs[:1], ctx))
                continue
            values = [v for r in entry.runs if (v := measure.number(r, ctx)) is not None]
            mean, se = mean_se(values) if values else (None, None)
            row += ["" if mean is None else mean, "" if se is None else se]
        writer.writerow(row)
    return buf.getvalue()


def table_plot(study: Study, spec: TableSpec, cells: Sequence[CellRuns], ctx: Context, path: Path) -> None:
    """One panel per measure in ``plot``: a bar per cell (mean over seeds, ± standard error)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [e for e in cells if e.runs]
    if not done or not spec.plot:
        return
    fig, axes = plt.subplots(len(spec.plot), 1, figsize=(max(8, 0.35 * len(done) + 2), 3 * len(spec.plot)))
    axes = [axes] if len(spec.plot) == 1 else list(axes)
    for ax, name in zip(axes, spec.plot, strict=True):
        measure = MEASURES.get(name)
        if measure.number is None:
            raise ConfigError(f"study {study.name}: table {spec.name} plots {name!r}, which has no number")
        means, errors = [], []
        for e in done:
            values = [v for r in e.runs if (v := measure.number(r, ctx)) is not None]
            mean, se = mean_se(values) if values else (0.0, None)  # no value (a DoS run's ASR): no bar
            means.append(mean)
            errors.append(se or 0.0)
        ax.bar(range(len(done)), means, yerr=errors, color="tab:blue")
        ax.set_ylabel(measure.header)
        ax.set_xticks(range(len(done)), [e.cell.name for e in done], rotation=90, fontsize=7)
        if spec.holds is not None and name == "stop" and spec.holds.stop_min is not None:
            ax.axhline(spec.holds.stop_min, color="k", ls="--", lw=1)
        if spec.holds is not None and name == "worst_family_fpr" and spec.holds.family_fpr_max is not None:
            ax.axhline(spec.holds.family_fpr_max, color="k", ls="--", lw=1)
    fig.suptitle(f"{study.name}: {spec.title or spec.name}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_tables(study: Study, out: Path) -> str:
    """Every table of ``study`` from the runs in ``out``; returns them as one markdown text (tables.md)."""
    cells = cell_runs(study, out)
    folder = out / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    parts = [f"# {study.spec.study.title or study.name}\n"]
    if study.spec.study.doc:
        parts.append(f"Published in {study.spec.study.doc}.\n")
    for spec in study.spec.table:
        for column in spec.columns:
            if column not in study.spec.axes and column not in ("cell", "seeds"):
                MEASURES.get(column)  # an unknown name is an error listing the measures
        kept = [e for e in cells if _kept(spec, e.cell)]
        if spec.cells:
            by_name = {e.cell.name: e for e in kept}
            unknown = [c for c in spec.cells if c not in by_name]
            if unknown:
                raise ConfigError(f"study {study.name}: table {spec.name} names no cell {unknown[0]!r}")
            kept = [by_name[c] for c in spec.cells]
        baseline = None
        if spec.baseline is not None:
            base = [e for e in cells if e.cell.name == spec.baseline]
            if not base:
                raise ConfigError(f"study {study.name}: table {spec.name}'s baseline {spec.baseline!r} is no cell")
            baseline = base[0].runs[0] if base[0].runs else None
        ctx = Context(baseline, spec.holds)
        text = table_markdown(study, spec, kept, ctx)
        (folder / f"{spec.name}.md").write_text(text)
        (folder / f"{spec.name}.csv").write_text(table_csv(study, spec, kept, ctx))
        if spec.plot:
            table_plot(study, spec, kept, ctx, folder / f"{spec.name}.png")
        parts.append(f"## {spec.name}\n\n{text}")
    markdown = "\n".join(parts)
    (out / "tables.md").write_text(markdown)
    return markdown
