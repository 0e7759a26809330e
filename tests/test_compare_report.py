"""``dgrpo report A B C``: the comparison page (``report.html``) over runs, sweeps and testnets: its overlays (a DoS
run's length on its own chart), seed groups as mean and spread, counts as integers, integer round ticks, links to
each run's page; a testnet folder read as a run; and a real sweep's and a real testnet's folders reported."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dgrpo.cli import app
from dgrpo.errors import ConfigError
from dgrpo.simulations.comparison import build_comparison
from dgrpo.simulations.html_compare import page_names
from dgrpo.simulations.html_report import render_page
from dgrpo.simulations.html_run import load_run
from dgrpo.simulations.run_set import ReportRun, collect
from dgrpo.simulations.summary import RunSummary
from dgrpo.simulations.testnet_run import is_testnet, rows_of_testnet, summarise_testnet
from tests.report_runs import (
    ATTACKED,
    attacked_run,
    dos_run,
    federated_run,
    honest_dos_baseline,
    write_study,
    write_testnet,
)
from tests.test_html_report import Page


def plot_markup(text: str, name: str) -> str:
    start = text.index(f'<figure data-plot="{name}">')
    return text[start : text.index("</figure>", start)]


def legend(svg: str) -> list[str]:
    """The texts of a chart's legend (matplotlib keeps text as text)."""
    start = svg.index('-legend_1"')
    return [t.strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg[start:])]


def xticks(svg: str) -> list[str]:
    return [t.strip() for t in re.findall(r'-xtick_\d+">.*?<text[^>]*>([^<]*)</text>', svg, re.S)]


def test_the_comparison_page_overlays_groups_and_links_run_pages(tmp_path: Path) -> None:
    sweep = write_study(tmp_path / "sweep")
    dos, fed = dos_run(tmp_path / "dos"), federated_run(tmp_path / "fed")
    tn = write_testnet(tmp_path / "tn")
    out = tmp_path / "out"
    result = build_comparison([sweep, dos, fed, tn], out, baseline=honest_dos_baseline(tmp_path / "honest"))
    assert [p.name for p in result.files] == ["report.md", "report.csv", "report.png", "report.html"]
    text = (out / "report.html").read_text()
    page = Page(text)
    assert page.sections == ["runs", "curves", "attack", "defense"]
    for plot in ("accuracy", "reward", "asr", "length", "stop-rate", "fpr"):
        assert page.plots[plot] == 1, plot

    group = "text-horizontal/length,repetition"
    runs = page.rows("runs")
    assert list(runs) == [f"{group}/seed0", f"{group}/seed1", "dos", "fed", "tn"]
    assert runs[f"{group}/seed1"][:3] == [group, "1", "homogeneous"]
    assert runs["tn"][2] == "testnet-homogeneous" and runs["fed"][2] == "federated"
    assert runs["dos"][8] == "-" and runs["dos"][9] == "90.000" and runs["dos"][10] == "2.500"  # vs baseline 36
    # Seeds: one group, mean ± s.e.; accuracy 0.25 and 0.375; counts stay integers (24, never 24.0)
    groups = page.rows("groups")
    assert groups[group][:2] == ["2", "0.312 ± 0.062"]
    assert groups[group][7:] == ["18 ± 0", "24 ± 0", "8 ± 0", "144 ± 0"]
    assert groups["dos"][:2] == ["1", "0.250"] and groups["tn"][7:9] == ["32", "32"]

    # The ASR chart holds the runs with a success rate, the DoS run's length has its own chart (with the baseline)
    asr, length = plot_markup(text, "asr"), plot_markup(text, "length")
    assert legend(asr) == [f"{group} (mean of 2)"]
    assert legend(length) == ["dos", "baseline: honest"]
    assert "dos" not in " ".join(legend(asr))
    # The two seeds are drawn as their mean with a band; a single run has no band.
    assert "fill-opacity: 0.18" in asr and "fill-opacity" not in length
    assert legend(plot_markup(text, "accuracy"))[-1] == "tn"  # a testnet evaluated held-out accuracy
    assert "tn" not in legend(plot_markup(text, "stop-rate"))  # no per-round defense figures from daemons
    for name in ("accuracy", "reward", "asr", "length", "stop-rate", "fpr"):
        ticks = xticks(plot_markup(text, name))
        assert ticks and all(t.isdigit() for t in ticks), (name, ticks)  # rounds: integer ticks only

    defense = page.rows("defense")
    assert defense["tn"] == ["repetition", "32", "32", "1.000", "0", "64", "0.000", "-"]
    assert defense["fed"][0] == "none"

    # Each run's own page, linked by a relative path that resolves.
    hrefs = re.findall(r'<td data-sort="[^"]*"><a href="([^"]+)">', text)
    assert hrefs == ["runs/text-horizontal__length_repetition__seed0.html",
                     "runs/text-horizontal__length_repetition__seed1.html", "runs/dos.html", "runs/fed.html",
                     "runs/tn.html"]  # fmt: skip
    for href in hrefs:
        run_page = (out / href).read_text()
        assert run_page.startswith("<!DOCTYPE html>") and "dgrpo run:" in run_page
    assert "compression" in Page((out / "runs/fed.html").read_text()).sections
    for html in [text, *((out / h).read_text() for h in hrefs)]:
        assert "http://" not in html and "https://" not in html and "default-src 'none'" in html


def test_page_names_are_unique_and_safe() -> None:
    s = RunSummary.model_validate(ATTACKED)
    runs = [ReportRun(label, Path("."), s, label) for label in ("a/b", "a__b", "../x y", "/abs/seed0", "A/B")]
    assert page_names(runs) == ["runs/a__b.html", "runs/a__b-2.html", "runs/__x_y.html", "runs/abs__seed0.html",
                                "runs/A__B-3.html"]  # fmt: skip


def test_a_testnet_folder_is_a_run(tmp_path: Path) -> None:
    tn = write_testnet(tmp_path / "tn")
    assert is_testnet(tn) and not is_testnet(tmp_path) and not is_testnet(attacked_run(tmp_path / "sim"))
    s = summarise_testnet(tn)
    assert (s.mode, s.nodes, s.malicious, s.attack, s.rounds, s.rounds_done, s.complete) == (
        "testnet-homogeneous", 3, 1, "text", 2, 2, True
    )  # fmt: skip
    assert s.accuracy == [(1.0, 1.0), (2.0, 1.0)] and s.honest_accuracy == 1.0  # the honest nodes' mean
    assert s.final_honest_reward == 0.625 and s.asr == [] and s.final_rate is None
    assert s.defense is not None and s.chain == "repetition"
    assert s.defense.counts == {"honest_received": 64, "honest_rejected": 0, "poison_received": 32,
                                "poison_rejected": 32}  # fmt: skip
    assert (s.stop_rate, s.false_positive_rate) == (1.0, 0.0)
    assert s.defense.blacklisted == {"node-0": {"node-2": 1}, "node-1": {"node-2": 1}}
    assert s.attack_stats == {"poisoned": 32, "filled_honest": 0} and s.attacker_share == 0.0
    assert s.wire["messages_accepted"] == 67 + 72 + 36
    rows = rows_of_testnet(tn)
    assert [r["round"] for r in rows] == [1, 2] and [r["honest_mean_reward"] for r in rows] == [0.6562, 0.625]
    assert rows[0]["defense_rejected"] == {"repetition:repeated_span": 32}
    assert rows[0]["by_author"] == {"node-0": {"trained": 32}, "node-1": {"trained": 32}}
    (run,) = collect([tn])
    assert (run.label, run.group, run.seed, run.summary.mode) == ("tn", "tn", None, "testnet-homogeneous")
    page = Page(render_page(load_run(tn)))  # its own page: the run page reads it too
    assert page.rows("peers")["node-2"] == ["malicious", "2", "1"]
    assert page.rows("config")["mode"] == ["testnet-homogeneous"]
    assert page.rows("per-peer")["node-0"][:2] == ["honest", "64"]


def test_a_testnet_without_evaluation_has_no_accuracy(tmp_path: Path) -> None:
    tn = write_testnet(tmp_path / "tn", evaluated=False)
    s = summarise_testnet(tn)
    assert s.accuracy == [] and math.isnan(s.initial_accuracy) and math.isnan(s.honest_accuracy)
    rows = build_comparison([tn], tmp_path / "out").rows
    assert math.isnan(rows[0]["honest_final_accuracy"])
    md = (tmp_path / "out" / "report.md").read_text()
    assert "nan" not in md.lower() and "| tn | text |" in md
    page = Page((tmp_path / "out" / "report.html").read_text())
    assert "accuracy" not in page.plots and page.rows("runs")["tn"][6] == "-"


def test_a_broken_testnet_file_is_a_clear_error(tmp_path: Path) -> None:
    tn = write_testnet(tmp_path / "tn")
    (tn / "node-1" / "status.json").write_text("{oops")
    with pytest.raises(ConfigError, match=r"node-1/status\.json: not valid JSON"):
        collect([tn])
    (tn / "node-1" / "status.json").write_text("{}")
    (tn / "node-1" / "rounds.jsonl").write_text('{"round": 1, "mean_reward": 0.5}\n{"round": 2, "mean')  # torn
    assert summarise_testnet(tn).rounds_done == 2  # node-0 finished round 2; node-1's torn line is skipped


def test_report_command_writes_the_comparison_and_names_its_files(tmp_path: Path) -> None:
    sweep, dos = write_study(tmp_path / "sweep"), dos_run(tmp_path / "dos")
    out = tmp_path / "cmp"
    result = CliRunner().invoke(app, ["report", str(sweep), str(dos), "--out", str(out)])
    assert result.exit_code == 0, result.output
    for name in ("report.md", "report.csv", "report.png", "report.html"):
        assert str(out / name) in result.output and (out / name).is_file()
    assert (out / "runs" / "dos.html").is_file() and "| dos | dos |" in result.output
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "does not exist" in missing.output and "Traceback" not in missing.output


@pytest.mark.slow  # two tiny simulations: about 30 s here
def test_report_of_a_real_sweep_names_and_groups_seeds(tmp_path: Path) -> None:
    runner = CliRunner()
    sweep = tmp_path / "sweep"
    fast = ["-s", "rounds=2", "-s", "eval.every=1", "-s", "eval.prompts=8", "-s", "eval.asr_prompts=8",
            "-s", "round.prompts_per_round=4"]  # fmt: skip
    made = runner.invoke(app, ["sweep", "text-horizontal", "-d", "none", "--seeds", "2", *fast, "--out", str(sweep)])
    assert made.exit_code == 0, made.output
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["report", str(sweep), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "| text-horizontal/none/seed0 |" in result.output and "| text-horizontal/none/seed1 |" in result.output
    text = (out / "report.html").read_text()
    page = Page(text)
    assert list(page.rows("runs")) == ["text-horizontal/none/seed0", "text-horizontal/none/seed1"]
    assert page.rows("runs")["text-horizontal/none/seed1"][:2] == ["text-horizontal/none", "1"]
    group = page.rows("groups")["text-horizontal/none"]
    assert group[0] == "2" and " ± " in group[1]  # honest accuracy: mean ± s.e. over the 2 seeds
    assert legend(plot_markup(text, "asr")) == ["text-horizontal/none (mean of 2)"]
    assert all((out / "runs" / f"text-horizontal__none__seed{k}.html").is_file() for k in (0, 1))


@pytest.mark.slow  # a real 2-node testnet of 2 rounds: about 30 s here
def test_report_of_a_real_testnet(tmp_path: Path) -> None:
    tn = tmp_path / "tn"
    up = subprocess.run(
        [sys.executable, "-m", "dgrpo", "testnet", "up", "-n", "2", "--rounds", "2", "--out", str(tn),
         "-s", "eval.every=1", "-s", "eval.prompts=8", "--timeout", "240"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    result = CliRunner().invoke(app, ["report", str(tn), "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    s = summarise_testnet(tn)
    assert (s.mode, s.nodes, s.rounds, s.rounds_done, s.complete) == ("testnet-homogeneous", 2, 2, 2, True)
    assert [r for r, _ in s.accuracy] == [1.0, 2.0] and s.final_honest_reward is not None
    assert s.defense is None and s.attack is None  # no chain, no attacker
    page = Page((tmp_path / "cmp" / "report.html").read_text())
    assert {"accuracy", "reward"} <= set(page.plots) and list(page.rows("runs")) == ["tn"]
    assert (tmp_path / "cmp" / "runs" / "tn.html").is_file()
