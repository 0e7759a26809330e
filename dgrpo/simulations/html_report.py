"""``dgrpo report --html RUN``: one self-contained HTML page per run folder.

The page holds the run's configuration, its results, accuracy and reward curves, and by kind of run: the
attack's success over rounds, the defense's verdicts (stopped / passed by sender role, stop rate and
false-positive rate) and each peer's acceptance; for a federated run the compression of the updates and each
client's aggregation weight. Plots are inline SVG, tables sort on a header click with a few lines of inline
script: the file opens with no network. Each plot and table carries ``data-plot`` / ``data-table`` for the
browser tests (``tests/test_browser_report.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dgrpo.errors import ConfigError
from dgrpo.simulations.html_federated import (
    compression_section,
    fed_attack_section,
    fed_rounds_section,
    weights_section,
)
from dgrpo.simulations.html_parts import Section, page
from dgrpo.simulations.html_run import RunData, load_run
from dgrpo.simulations.html_sections import (
    attack_section,
    config_section,
    curves_section,
    defense_section,
    peers_section,
    results_section,
    rounds_section,
)

Builder = Callable[[RunData], Section]
DECENTRALISED: list[Builder] = [
    config_section,
    results_section,
    curves_section,
    attack_section,
    defense_section,
    peers_section,
    rounds_section,
]
FEDERATED: list[Builder] = [
    config_section,
    results_section,
    curves_section,
    compression_section,
    weights_section,
    fed_attack_section,
    fed_rounds_section,
]


def render_page(run: RunData) -> str:
    sections = [build(run) for build in (FEDERATED if run.federated is not None else DECENTRALISED)]
    s = run.summary
    kind = "federated" if run.federated is not None else "testnet" if s.mode.startswith("testnet") else "decentralised"
    subtitle = f"{kind} run, task {s.task}, {s.rounds} rounds; folder {run.folder}"
    return page(f"dgrpo run: {s.scenario}", subtitle, sections)


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Render ``run_dir``'s page to ``out`` (default ``run_dir/report.html``); returns the path written."""
    run = load_run(run_dir)
    path = out if out is not None else run.folder / "report.html"
    text = render_page(run)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc}") from None
    return path
