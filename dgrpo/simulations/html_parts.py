"""The HTML building blocks of the run page: escaped text, tables that sort on a header click, figures,
sections, and the page shell with its inline style and script.

The page opens from a file with no network: nothing is loaded from anywhere. Every string that came from the
run folder goes through :func:`esc` (peer names and reasons may come from hostile peers), and the page's
Content-Security-Policy allows only its own script, by hash, so markup that escaped escaping still could not
run a script or load a resource.
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Sequence
from dataclasses import dataclass

from dgrpo.simulations.html_run import number


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: object) -> str:
    """A cell's text: ``-`` for nothing, three decimals for small floats, thousands grouped for large ones."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if value.is_integer() and abs(value) >= 100:
            return f"{value:,.0f}"  # a count that went through a float (a mean, a JSON float) shows as one
        if 0 < abs(value) < 0.001:
            return f"{value:.2e}"  # an overhead ratio of 3e-4 is not 0.000
        return f"{value:.3f}" if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    return str(value)


@dataclass(frozen=True)
class Cell:
    """A table cell whose shown text differs from its value (the value sorts it)."""

    text: str
    value: object


@dataclass(frozen=True)
class Link:
    """A table cell that links to ``href`` (a relative path: another page next to this one)."""

    text: str
    href: str


def _cell(value: object) -> str:
    if isinstance(value, Link):
        return f'<td data-sort="{esc(value.text)}"><a href="{esc(value.href)}">{esc(value.text)}</a></td>'
    shown, key = (value.text, value.value) if isinstance(value, Cell) else (fmt(value), value)
    n = number(key)
    if n is not None:
        return f'<td data-sort="{n!r}" class="num">{esc(shown)}</td>'
    if key is None:
        return f'<td data-sort="">{esc(shown)}</td>'
    return f'<td data-sort="{esc(key)}">{esc(shown)}</td>'


def table(name: str, headers: Sequence[str], rows: Sequence[Sequence[object]], caption: str = "") -> str:
    """A sortable table, ``data-table=name``; numeric cells sort as numbers, empty ones last."""
    head = "".join(f'<th scope="col" tabindex="0">{esc(h)}</th>' for h in headers)
    body = "\n".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return (
        f'<table data-table="{esc(name)}" class="sortable">{cap}<thead><tr>{head}</tr></thead>'
        f"<tbody>\n{body}\n</tbody></table>"
    )


def figure(name: str, svg: str, caption: str) -> str:
    """A plot, ``data-plot=name``; ``svg`` is trusted markup from :mod:`dgrpo.simulations.html_plots`."""
    return f'<figure data-plot="{esc(name)}">{svg}<figcaption>{esc(caption)}</figcaption></figure>'


@dataclass(frozen=True)
class Section:
    """A titled part of the page (``data-section=name``, linked from the page's header)."""

    name: str
    title: str
    html: str


def section(name: str, title: str, *parts: str) -> Section:
    body = "\n".join(parts)
    return Section(
        name, title, f'<section data-section="{esc(name)}" id="{esc(name)}"><h2>{esc(title)}</h2>\n{body}</section>'
    )


def absent(name: str, title: str, why: str) -> Section:
    """A section this run has nothing for, said in one line (so a reader knows it was not forgotten)."""
    return section(name, title, f'<p class="absent">{esc(why)}</p>')


def paragraph(text: str) -> str:
    return f"<p>{esc(text)}</p>"


def details(summary: str, text: str) -> str:
    return f"<details><summary>{esc(summary)}</summary><pre>{esc(text)}</pre></details>"


STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5rem auto; max-width: 1100px; padding: 0 1rem;
       color: #1d2430; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.15rem; border-bottom: 1px solid #d5dae3; padding-bottom: 0.2rem; margin-top: 2rem; }
nav a { margin-right: 0.8rem; }
table { border-collapse: collapse; margin: 0.6rem 0 1rem; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-weight: 600; padding-bottom: 0.3rem; }
th, td { border: 1px solid #d5dae3; padding: 0.2rem 0.55rem; text-align: left; }
td.num { text-align: right; }
th { background: #f1f3f7; cursor: pointer; user-select: none; white-space: nowrap; }
th[aria-sort="ascending"]::after { content: " \\25B2"; }
th[aria-sort="descending"]::after { content: " \\25BC"; }
figure { margin: 0.8rem 0; }
figure svg { max-width: 100%; height: auto; display: block; }
figcaption { color: #4a5568; font-size: 0.9rem; }
p.absent { color: #6b7280; font-style: italic; }
pre { background: #f6f8fa; padding: 0.6rem; overflow-x: auto; font-size: 12px; }
.grid { display: flex; flex-wrap: wrap; gap: 1rem; align-items: flex-start; }
.grid figure { flex: 1 1 460px; min-width: 0; }
"""

# Sorts a table.sortable by the clicked (or Enter-pressed) header: numbers by value, text by locale, empty cells
# last in either direction; a second click reverses.
SCRIPT = """
"use strict";
function sortKey(row, col) {
  var cell = row.cells[col];
  return cell ? cell.getAttribute("data-sort") || "" : "";
}
function compareKeys(a, b) {
  var x = Number(a), y = Number(b);
  if (a !== "" && b !== "" && isFinite(x) && isFinite(y)) { return x - y; }
  return a.localeCompare(b);
}
function sortTable(table, th, col) {
  var ascending = th.getAttribute("aria-sort") !== "ascending";
  table.querySelectorAll("thead th").forEach(function (other) { other.removeAttribute("aria-sort"); });
  th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  var full = rows.filter(function (r) { return sortKey(r, col) !== ""; });
  var empty = rows.filter(function (r) { return sortKey(r, col) === ""; });
  full.sort(function (a, b) { return compareKeys(sortKey(a, col), sortKey(b, col)) * (ascending ? 1 : -1); });
  full.concat(empty).forEach(function (r) { body.appendChild(r); });
}
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("thead th").forEach(function (th, col) {
    th.addEventListener("click", function () { sortTable(table, th, col); });
    th.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortTable(table, th, col); }
    });
  });
});
"""


def _csp() -> str:
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    return f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{digest}'"


def page(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """The whole document, with a link to each of ``sections`` in its header."""
    links = " ".join(f'<a href="#{esc(s.name)}">{esc(s.title)}</a>' for s in sections)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_csp()}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>{esc(title)}</title>\n<style>{STYLE}</style></head>\n"
        f"<body><header><h1>{esc(title)}</h1><p>{esc(subtitle)}</p><nav>{links}</nav></header>\n<main>\n"
        + "\n".join(s.html for s in sections)
        + f"\n</main>\n<script>{SCRIPT}</script>\n</body></html>\n"
    )
