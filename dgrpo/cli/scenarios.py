"""``dgrpo scenarios``: the shipped scenarios, each with the first line of its file's header comment.

Instant: this module and what it imports hold no torch (tests/test_cli_researcher.py checks it).
"""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from dgrpo.cli.common import app, command, console
from dgrpo.simulations.scenario import SCENARIO_DIR


def header_line(path: Path) -> str:
    """The first line of the comment that opens ``path`` (without its ``#``), or "" where it opens with none."""
    for line in path.read_text().splitlines():
        text = line.strip()
        if not text:
            continue
        return text.lstrip("#").strip() if text.startswith("#") else ""
    return ""


def shipped_scenarios() -> list[tuple[str, str]]:
    """Every shipped scenario's name and one line about it, by name."""
    return sorted((path.stem, header_line(path)) for path in SCENARIO_DIR.glob("*.toml"))


@command(app)
def scenarios() -> None:
    """List the shipped scenarios: each one's name and what it runs (the first line of its file's header).

    Examples:
    dgrpo scenarios
    dgrpo simulate text-horizontal --defense logit
    """
    table = Table("scenario", "what it runs", box=None, pad_edge=False, header_style="bold")
    for name, line in shipped_scenarios():
        table.add_row(name, escape(line))
    console.print(table)
    console.print(
        f"run one: dgrpo simulate NAME (-s key=value changes a key); the files, with every key: {SCENARIO_DIR}",
        markup=False,
        soft_wrap=True,
    )
