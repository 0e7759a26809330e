"""The HTML run page in a real browser (headless Chromium, ``tests/browser.py``): the plots draw, the tables sort
on a header click, the full configuration folds out, hostile names run nothing, and the console stays clean."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dgrpo.simulations.html_report import write_report
from tests.browser import browser
from tests.report_runs import ATTACKED, attacked_rows, attacked_run, federated_run, write_run


def column(page: Any, table: str, index: int) -> list[str]:
    """The texts of column ``index`` of table ``data-table=table``, top to bottom, as the page shows them."""
    cells = page.locator(f'table[data-table="{table}"] tbody tr td:nth-child({index + 1})')
    return [t.strip() for t in cells.all_inner_texts()]


def header(page: Any, table: str, text: str) -> Any:
    return page.locator(f'table[data-table="{table}"] thead th', has_text=text).first


def assert_plots_drawn(page: Any, names: list[str]) -> None:
    for name in names:
        svg = page.locator(f'figure[data-plot="{name}"] svg')
        assert svg.count() == 1, name
        box = svg.bounding_box()
        assert box is not None and box["width"] > 200 and box["height"] > 100, (name, box)
        assert svg.locator("path").count() > 5, name  # axes, ticks and the lines themselves


@pytest.mark.slow  # two pages in one browser: about 7 s here
def test_the_run_page_draws_sorts_and_has_no_console_errors(tmp_path: Path) -> None:
    attacked = write_report(attacked_run(tmp_path / "attacked"))
    fed = write_report(federated_run(tmp_path / "fed"))
    with browser() as b:
        page = b.page
        page.goto(attacked.as_uri())
        assert page.title() == "dgrpo run: text-horizontal"
        assert_plots_drawn(page, ["accuracy", "reward", "asr", "defense"])

        # Honest reward per round is 0.250, 0.500, 0.125: a click sorts up, a second down.
        assert column(page, "rounds", 0) == ["1", "2", "3"]
        reward = header(page, "rounds", "honest reward")
        reward.click()
        assert reward.get_attribute("aria-sort") == "ascending"
        assert column(page, "rounds", 1) == ["0.125", "0.250", "0.500"]
        assert column(page, "rounds", 0) == ["3", "1", "2"]
        b.screenshot("report-attacked-sorted")
        reward.click()
        assert reward.get_attribute("aria-sort") == "descending"
        assert column(page, "rounds", 0) == ["2", "1", "3"]
        # A round with no stop rate ("-") stays last either way; Enter on a focused header sorts too.
        stop = header(page, "rounds", "stop rate")
        stop.focus()
        page.keyboard.press("Enter")
        assert column(page, "rounds", 10) == ["0.500", "1.000", "-"]
        assert reward.get_attribute("aria-sort") is None
        page.keyboard.press("Enter")
        assert column(page, "rounds", 10) == ["1.000", "0.500", "-"]
        # Text columns sort as text.
        header(page, "reasons", "reason").click()
        assert column(page, "reasons", 1) == ["closed_round", "length:group_outlier", "repetition:repeated_span"]

        dump = page.locator("details pre")
        assert not dump.is_visible()
        page.locator("details summary").click()
        assert dump.is_visible() and '"run_id": "text-horizontal"' in dump.inner_text()
        page.evaluate("window.scrollTo(0, 0)")
        b.screenshot("report-attacked")

        page.goto(fed.as_uri())
        assert_plots_drawn(
            page, ["accuracy", "reward", "compression-bytes", "compression-entries", "weights", "attack-share"]
        )
        weight = header(page, "clients", "mean weight")
        weight.click()
        weight.click()
        assert column(page, "clients", 0)[0] == "client-4"  # the std-inflating attacker has the most weight
        b.screenshot("report-federated")
        assert b.errors == []


def test_hostile_names_run_nothing_in_the_browser(tmp_path: Path) -> None:
    summary = json.loads(json.dumps(ATTACKED))
    summary["defense"]["blacklisted"] = {
        "<script>alert(1)</script>": {'"><img src=x onerror=alert(2)>': 1},
        "node-0": {"</table><script>alert(3)</script>": 2},
    }
    summary["scenario"] = "<img src=x onerror=alert(4)>"
    page_path = write_report(write_run(tmp_path / "run", summary, attacked_rows()))
    dialogs: list[str] = []
    with browser() as b:
        b.page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        b.page.goto(page_path.as_uri())
        assert b.page.locator("img").count() == 0
        assert b.page.locator("script").count() == 1
        peers = column(b.page, "peers", 0)
        assert '"><img src=x onerror=alert(2)>' in peers and "</table><script>alert(3)</script>" in peers
        assert b.page.title() == "dgrpo run: <img src=x onerror=alert(4)>"
        b.screenshot("report-hostile")
        assert dialogs == [] and b.errors == []
