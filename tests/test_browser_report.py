"""The HTML pages in a real browser (headless Chromium, ``tests/browser.py``): on the run page the plots draw, the
tables sort on a header click, the full configuration folds out, hostile names run nothing, and the console stays
clean; on the comparison page (``dgrpo report A B C``) every overlay draws with its runs' labels, a DoS run's
length on its own chart, a group of seeds with its spread, and the links to the run pages open them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dgrpo.simulations.comparison import build_comparison
from dgrpo.simulations.html_report import write_report
from tests.browser import browser
from tests.report_runs import (
    ATTACKED,
    attacked_rows,
    attacked_run,
    dos_run,
    federated_run,
    honest_dos_baseline,
    write_run,
    write_study,
    write_testnet,
)


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


def legend_texts(page: Any, plot: str) -> list[str]:
    """The texts drawn in chart ``plot`` (axis labels, ticks and the legend's run labels), as the browser shows them."""
    return [t.strip() for t in page.locator(f'figure[data-plot="{plot}"] svg text').all_text_contents()]


@pytest.mark.slow  # the comparison and five run pages in one browser: about 6 s here
def test_the_comparison_page_draws_overlays_and_its_links_open_the_run_pages(tmp_path: Path) -> None:
    runs = [write_study(tmp_path / "sweep"), dos_run(tmp_path / "dos"), federated_run(tmp_path / "fed")]
    runs.append(write_testnet(tmp_path / "tn"))
    out = tmp_path / "out"
    build_comparison(runs, out, baseline=honest_dos_baseline(tmp_path / "honest"))
    group = "text-horizontal/length,repetition"
    labels = [f"{group}/seed0", f"{group}/seed1", "dos", "fed", "tn"]
    with browser() as b:
        page = b.page
        page.goto((out / "report.html").as_uri())
        assert page.title() == "dgrpo report: 5 runs"
        assert_plots_drawn(page, ["accuracy", "reward", "asr", "length", "stop-rate", "fpr"])
        assert column(page, "runs", 0) == labels
        # Every run's label is on the accuracy overlay; the seeds as one group with its band (a filled path).
        accuracy = legend_texts(page, "accuracy")
        assert {f"{group} (mean of 2)", "dos", "fed", "tn"} <= set(accuracy)
        band = page.locator('figure[data-plot="asr"] svg [style*="fill-opacity"]')  # fill_between: a <use> of a path
        assert band.count() == 1 and band.bounding_box() is not None
        # The DoS run's length is on its own chart, with the baseline; never on the ASR chart.
        assert "dos" in legend_texts(page, "length") and "baseline: honest" in legend_texts(page, "length")
        assert "dos" not in legend_texts(page, "asr") and f"{group} (mean of 2)" in legend_texts(page, "asr")
        assert "mean completion length (chars)" in legend_texts(page, "length")
        # Seeds tabled as mean ± s.e.; counts as integers; a header click sorts by the mean.
        assert column(page, "groups", 0) == [group, "dos", "fed", "tn"]
        assert column(page, "groups", 2)[0] == "0.312 ± 0.062" and column(page, "groups", 9)[0] == "24 ± 0"
        header(page, "groups", "honest accuracy").click()
        assert column(page, "groups", 0) == ["dos", group, "fed", "tn"]  # 0.250, 0.312, 0.500, 1.000
        page.evaluate("window.scrollTo(0, 0)")
        b.screenshot("report-compare")

        # Each run's link resolves to its page, which draws.
        links = page.locator('table[data-table="runs"] tbody a')
        assert links.count() == len(labels)
        hrefs = [links.nth(i).evaluate("a => a.href") for i in range(links.count())]
        for href, label in zip(hrefs, labels, strict=True):
            assert href.startswith((out / "runs").as_uri() + "/"), href
            page.goto(href)
            assert page.title().startswith("dgrpo run: "), label
            assert_plots_drawn(page, ["accuracy", "reward"])
        page.goto((out / "report.html").as_uri())
        page.locator('table[data-table="runs"] tbody a', has_text="tn").click()
        page.wait_for_load_state()
        assert page.url.endswith("/runs/tn.html") and page.title() == "dgrpo run: testnet"
        assert column(page, "peers", 1) == ["honest", "honest", "malicious"]
        assert b.errors == []
