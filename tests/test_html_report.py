"""``dgrpo report --html``: the page of one run (read through the typed summary), its sections by kind of run, the
numbers in its tables, escaping of hostile strings, no network resources, and clear errors for a bad run folder."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dgrpo.cli import app
from dgrpo.errors import ConfigError
from dgrpo.simulations.html_report import render_page, write_report
from dgrpo.simulations.html_run import load_run
from tests.report_runs import (
    ATTACKED,
    attacked_rows,
    attacked_run,
    federated_rows,
    federated_run,
    federated_summary,
    honest_run,
    write_run,
)

HOSTILE = "<script>alert(1)</script>"


class Page(HTMLParser):
    """The parts of a page the tests look at: sections, plots, tables (cell texts by row), script tags."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.plots: dict[str, int] = {}  # data-plot -> how many <svg> inside
        self.tables: dict[str, list[list[str]]] = {}
        self.scripts = 0
        self.tags: set[str] = set()
        self.attributes: set[str] = set()
        self._plot: str | None = None
        self._table: str | None = None
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.add(tag)
        self.attributes |= set(a)
        if tag == "section":
            self.sections.append(a["data-section"] or "")
        elif tag == "figure":
            self._plot = a["data-plot"]
            self.plots[self._plot or ""] = 0
        elif tag == "svg" and self._plot is not None:
            self.plots[self._plot] += 1
        elif tag == "table":
            self._table = a["data-table"]
            self.tables[self._table or ""] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []
        elif tag == "script":
            self.scripts += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._plot = None
        elif tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._table is not None and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def rows(self, name: str) -> dict[str, list[str]]:
        """The body rows of table ``name``, by their first cell."""
        return {row[0]: row[1:] for row in self.tables[name][1:]}


def page_of(folder: Path) -> tuple[str, Page]:
    text = render_page(load_run(folder))
    return text, Page(text)


def test_an_attacked_defended_run_has_every_section_and_its_numbers(tmp_path: Path) -> None:
    text, page = page_of(attacked_run(tmp_path / "run"))
    assert page.sections == ["config", "results", "curves", "attack", "defense", "peers", "rounds"]
    for plot in ("accuracy", "reward", "asr", "defense"):
        assert page.plots[plot] == 1, plot
    config = page.rows("config")
    assert config["scenario"] == ["text-horizontal"] and config["attack"] == ["text"]
    assert config["defense chain"] == ["length, repetition"]
    assert config["seeds"] == ["learner 0, sampling 0, eval 1234, adversary 0"]
    # stopped, passed, received, rate: poison 18 of 24 stopped (0.75), honest 8 of 144 (FPR 0.056)
    confusion = page.rows("confusion")
    assert confusion["malicious: poisoned"] == ["18", "6", "24", "stop rate 0.750"]
    assert confusion["honest"] == ["8", "136", "144", "FPR 0.056"]
    assert "malicious: other (fill)" not in confusion  # none received
    peers = page.rows("peers")
    assert peers["node-3"] == ["malicious", "2", "1"] and peers["node-0"] == ["honest", "0", "-"]
    acceptance = page.rows("acceptance")
    assert acceptance["honest"] == ["node-0, node-1, node-2", "136", "8", "144", "0.944"]
    assert acceptance["malicious: poisoned"] == ["node-3", "6", "18", "24", "0.250"]
    reasons = {(r[0], r[1]): r[2] for r in page.tables["reasons"][1:]}
    assert reasons == {
        ("defense", "length:group_outlier"): "8",
        ("defense", "repetition:repeated_span"): "18",
        ("admission", "closed_round"): "24",
    }
    assert page.rows("blacklisted") == {"node-0": ["node-3", "2"], "node-1": ["node-3", "1"]}
    rounds = page.rows("rounds")
    assert [rounds[r][0] for r in ("1", "2", "3")] == ["0.250", "0.500", "0.125"]  # honest reward
    assert rounds["3"][9] == "-"  # no poison checked in round 3: no stop rate
    assert page.rows("results")["final asr"] == ["0.750"]
    assert page.rows("results")["defense overhead (x generation time)"] == ["3.00e-04"]
    assert "length, repetition" in text and page.scripts == 1


def test_an_honest_run_leaves_attack_and_defense_out(tmp_path: Path) -> None:
    text, page = page_of(honest_run(tmp_path / "run"))
    assert page.sections == ["config", "results", "curves", "attack", "defense", "peers", "rounds"]
    assert set(page.plots) == {"accuracy", "reward"}
    assert "no attack in this run" in text and "no defense in this run" in text
    assert "confusion" not in page.tables and "acceptance" not in page.tables
    assert page.rows("peers")["node-3"] == ["honest", "0", "-"]
    assert "Nothing was rejected." in text
    assert page.rows("config")["defense chain"] == ["none"]


def test_a_federated_run_shows_compression_and_client_weights(tmp_path: Path) -> None:
    text, page = page_of(federated_run(tmp_path / "run"))
    assert page.sections == ["config", "results", "curves", "compression", "weights", "attack", "rounds"]
    for plot in ("accuracy", "reward", "compression-bytes", "compression-entries", "weights", "attack-share"):
        assert page.plots[plot] == 1, plot
    compression = [r for r in page.tables["compression"][1:] if r[:2] == ["2", "client-1"]]
    # round, client, entries, bytes, fraction of 998,016 entries, x smaller than 3,992,064 dense bytes
    assert compression == [["2", "client-1", "38,210", "277,602", "0.038", "14.381"]]
    clients = page.rows("clients")
    assert clients["client-4"][:3] == ["attacker", "0.277", "0.270"]  # mean and last weight
    assert clients["client-0"][:3] == ["honest", "0.147", "0.150"]
    assert page.rows("results")["compression, bytes (x fewer than dense)"] == ["16.880"]
    assert "3,992,064 bytes" in text
    assert "peers" not in page.sections and "confusion" not in page.tables


def test_a_federated_baseline_has_no_compression_or_weights(tmp_path: Path) -> None:
    run = federated_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["federated"].update(method="centralized", per_round=[], attack=None)
    dropped = ("weights", "bytes_sent", "entries_sent", "attacker_weight_share", "attacker_influence")
    rows = [{k: v for k, v in r.items() if k not in dropped} for r in federated_rows()]
    write_run(run, summary, rows)
    text, page = page_of(run)
    assert "no updates sent in this run (method centralized)" in text
    assert "no aggregation weights in this run" in text and "no attack in this run" in text
    assert "compression" not in page.tables and "weights" not in page.plots


def test_hostile_strings_are_escaped(tmp_path: Path) -> None:
    summary = json.loads(json.dumps(ATTACKED))
    summary["scenario"] = HOSTILE
    summary["defense"]["blacklisted"] = {HOSTILE: {HOSTILE: 1}, "node-0": {'"><img src=x onerror=alert(1)>': 1}}
    summary["defense"]["rejected_by_reason"] = {HOSTILE: 3}
    summary["scenario_config"] = {**summary["scenario_config"], "run_id": HOSTILE}
    text, page = page_of(write_run(tmp_path / "run", summary, attacked_rows()))
    assert HOSTILE not in text and "<img" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert page.scripts == 1  # the page's own sorter
    assert "img" not in page.tags and not [a for a in page.attributes if a.startswith("on")]
    assert page.rows("peers")[HOSTILE] == ["unknown", "1", "1"]  # shown as text
    assert page.rows("config")["run id"] == [HOSTILE]
    # Client names reach the plots' legends too (as SVG text); '$' would be mathtext to matplotlib.
    fed_text, _ = page_of(federated_run(tmp_path / "fed", clients=[HOSTILE, "a$b", "$\\frac{", "_x", "c"]))
    assert HOSTILE not in fed_text and fed_text.count("<script") == 1


def test_the_page_loads_nothing_from_the_network(tmp_path: Path) -> None:
    for build in (attacked_run, honest_run, federated_run):
        text = render_page(load_run(build(tmp_path / build.__name__)))
        assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I), build.__name__
        assert "http://" not in text and "https://" not in text and "@import" not in text
        assert "default-src 'none'" in text  # CSP: nothing but the page's own script and inline styles


def test_wrongly_typed_rows_leave_cells_empty_instead_of_crashing(tmp_path: Path) -> None:
    """The summary is typed (a wrong type is an error naming the key, below); the rows stay dicts, read
    defensively: a value of the wrong type leaves its cell or point out."""
    summary = json.loads(json.dumps(ATTACKED))
    summary.update(final_accuracy=float("nan"), accuracy=[], asr=[])
    rows = [{"round": "one", "defense": 3}, {"round": 2, "honest_mean_reward": 10**400, "by_author": [1]}]
    _, page = page_of(write_run(tmp_path / "run", summary, rows))
    assert "accuracy" not in page.plots and "asr" not in page.plots and "reward" not in page.plots
    assert page.rows("results")["final accuracy"] == ["-"]  # NaN: not a number to show
    assert page.rows("rounds")["-"][0] == "-" and page.rows("rounds")["2"][0] == "-"
    clients = ["client-²", "client-" + "9" * 5000, "a", "b", "c"]  # int() fails on both: not client indices
    fed = federated_summary(clients)
    fed["scenario_config"]["federated"] = {"clients": 10**12, "attack": {"clients": 10**12}}
    _, page = page_of(write_run(tmp_path / "fed", fed, federated_rows(clients)))
    assert page.rows("clients")["client-²"][0] == "honest"  # not a client index: not taken for the attacker


def test_wrongly_typed_summaries_are_errors_naming_the_key(tmp_path: Path) -> None:
    for key, value, where in [
        ("nodes", "four", "nodes"),
        ("accuracy", "lots", "accuracy"),
        ("defense", {"counts": {"honest_received": "x"}}, "defense.counts.honest_received"),
    ]:
        summary = {**json.loads(json.dumps(ATTACKED)), key: value}
        run = write_run(tmp_path / key, summary, attacked_rows())
        with pytest.raises(ConfigError, match=rf"summary\.json: not a run summary \({re.escape(where)}: "):
            load_run(run)
    fed = federated_summary()
    fed["federated"].update(per_round=5)
    with pytest.raises(ConfigError, match=r"federated\.per_round"):
        load_run(write_run(tmp_path / "fed", fed, None))


def test_bad_run_folders_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no summary\.json"):
        load_run(tmp_path)
    (tmp_path / "summary.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"not a run summary \(a JSON object\)"):
        load_run(tmp_path)
    (tmp_path / "summary.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_run(tmp_path)
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"not a run summary \(scenario: Field required\)"):
        load_run(tmp_path)
    minimal = {"scenario": "s", "task": "arith", "model": "m", "mode": "homogeneous", "rounds": 1,
               "initial_accuracy": 0.5, "final_accuracy": 0.5, "accuracy": []}  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps(minimal))
    (tmp_path / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2')
    with pytest.raises(ConfigError, match=r"metrics\.jsonl line 2"):
        load_run(tmp_path)
    (tmp_path / "metrics.jsonl").unlink()
    assert "no accuracy or reward points" in render_page(load_run(tmp_path))  # a bare summary still renders


def test_write_report_defaults_to_the_run_folder(tmp_path: Path) -> None:
    run = attacked_run(tmp_path / "run")
    assert write_report(run) == run / "report.html"
    assert write_report(run / "summary.json", tmp_path / "x" / "page.html") == tmp_path / "x" / "page.html"
    assert (tmp_path / "x" / "page.html").read_text().startswith("<!DOCTYPE html>")


def test_report_command_html(tmp_path: Path) -> None:
    runner = CliRunner()
    a, f = attacked_run(tmp_path / "a"), federated_run(tmp_path / "f")
    result = runner.invoke(app, ["report", "--html", str(a), str(f)])
    assert result.exit_code == 0, result.output
    assert f"written: {a / 'report.html'}" in result.output and f"written: {f / 'report.html'}" in result.output
    assert (a / "report.html").is_file() and (f / "report.html").is_file()
    assert not (tmp_path / "runs").exists()  # no markdown report as a side effect
    out = tmp_path / "page.html"
    assert runner.invoke(app, ["report", "--html", str(a), "--out", str(out)]).exit_code == 0 and out.is_file()
    both = runner.invoke(app, ["report", "--html", str(a), str(f), "--out", str(out)])
    assert both.exit_code == 2 and "--out names one page" in both.output
    missing = runner.invoke(app, ["report", "--html", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "no summary.json" in missing.output and "Traceback" not in missing.output
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.json").write_text("{")
    bad = runner.invoke(app, ["report", "--html", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "not valid JSON" in bad.output


@pytest.mark.slow
def test_real_runs_render(tmp_path: Path) -> None:
    """The page of real (tiny) runs: an attacked and defended one and a federated one, from the runners."""
    from dgrpo.simulations.runner import run_simulation
    from dgrpo.simulations.scenario import load_scenario

    fast = ["rounds=2", "eval.every=1", "eval.prompts=8", "round.prompts_per_round=4"]
    attacked = load_scenario(Path("text-horizontal"), [*fast, "eval.asr_prompts=8", 'defense.chain=["repetition"]'])
    run_simulation(attacked, tmp_path / "a")
    _, page = page_of(tmp_path / "a")
    assert {"asr", "accuracy", "reward"} <= set(page.plots) and "confusion" in page.tables
    assert page.rows("confusion")["honest"][2] != "0"  # honest completions were received and counted
    per_peer = page.rows("per-peer")  # metrics.jsonl by_author, summed: the attacker's own row
    assert set(per_peer) == {"node-0", "node-1", "node-2", "node-3"} and per_peer["node-3"][0] == "malicious"
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    checked = sum(r["by_author"].get("node-3", {}).get("defense_checked", 0) for r in rows)
    assert checked > 0 and per_peer["node-3"][2] == str(checked)
    fed = load_scenario(Path("fed-grpo"), ["rounds=2", "eval.every=1", "eval.prompts=8", "federated.local_steps=1"])
    run_simulation(fed, tmp_path / "f")
    _, page = page_of(tmp_path / "f")
    assert {"compression-bytes", "weights"} <= set(page.plots)
    assert len(page.rows("clients")) == 5 and len(page.tables["compression"]) == 1 + 2 * 5
