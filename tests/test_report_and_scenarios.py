"""Attack scenarios (shipped TOML, validation), the report command and the poison monitor."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from dgrpo.daemon.monitor import PoisonMonitor
from dgrpo.errors import ConfigError
from dgrpo.simulations.report import build_report
from dgrpo.simulations.scenario import SCENARIO_DIR, load_scenario
from dgrpo.tasks.arith import ArithTask

ATTACKS = ["text", "math", "code", "dos"]


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("split", ["horizontal", "vertical"])
def test_every_attack_and_split_has_a_tiny_scenario(attack: str, split: str) -> None:
    sc = load_scenario(Path(f"{attack}-{split}"))
    assert sc.adversary is not None and sc.adversary.name == attack
    assert sc.nodes.count == 4 and sc.nodes.malicious == 1
    assert sc.rollout.split == split
    assert sc.model.name.startswith("dgrpo:")
    sc.node_rollout()  # B and G divide over the nodes


@pytest.mark.parametrize("attack", ATTACKS)
def test_paper_scale_scenarios_follow_the_paper(attack: str) -> None:
    sc = load_scenario(SCENARIO_DIR / f"paper-{attack}.toml")
    assert (sc.nodes.count, sc.nodes.malicious) == (4, 1)
    assert (sc.round.prompts_per_round, sc.round.group_size) == (32, 12)
    assert sc.learner.lr == 2e-5 and sc.learner.beta == 0.0
    assert sc.sampling.top_k == 50 and sc.sampling.top_p == 1.0 and sc.sampling.temperature == 1.0
    assert "1.5B" in sc.model.name


def test_malicious_nodes_need_an_adversary_and_an_honest_node() -> None:
    with pytest.raises(ConfigError, match="adversary"):
        load_scenario(None, ["nodes.malicious=1"])
    with pytest.raises(ConfigError, match="honest"):
        load_scenario(None, ["nodes.malicious=4", "adversary.name='text'"])
    with pytest.raises(ConfigError, match="adversary"):
        load_scenario(None, ["adversary.nme='text'"])


def _summary(tmp: Path, name: str, attack: str | None, asr: list[list[float]], length: float) -> Path:
    run = tmp / name
    run.mkdir()
    data = {
        "scenario": name,
        "task": "arith",
        "model": "dgrpo:tiny-arith",
        "mode": "homogeneous",
        "attack": attack,
        "split": "horizontal",
        "malicious": 1 if attack else 0,
        "rounds": 10,
        "asr_metric": "mean_length" if attack == "dos" else ("asr" if attack else None),
        "asr": asr,
        "final_asr": asr[-1][1] if asr else None,
        "initial_accuracy": 0.4,
        "final_accuracy": 0.6,
        "honest_final_accuracy": 0.6,
        "accuracy": [[0, 0.4], [10, 0.6]],
        "mean_length": asr if attack == "dos" else [[0, 30.0], [10, length]],
        "final_mean_length": length,
    }
    (run / "summary.json").write_text(json.dumps(data))
    return run


def test_report_builds_table_csv_and_plot(tmp_path: Path) -> None:
    text = _summary(tmp_path, "text-h", "text", [[0, 0.0], [10, 0.8]], 40.0)
    dos = _summary(tmp_path, "dos-h", "dos", [[0, 30.0], [10, 60.0]], 60.0)
    base = _summary(tmp_path, "honest", None, [], 30.0)
    rows = build_report([text, dos], tmp_path / "out", baseline=base)
    assert [r["run"] for r in rows] == ["text-h", "dos-h"]
    assert rows[0]["final_asr"] == 0.8 and rows[0]["max_asr"] == 0.8
    assert rows[1]["length_vs_baseline"] == 2.0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| text-h | text |" in md and "| 60 | 2 | none |" in md  # length, length vs baseline: counts as ints
    with (tmp_path / "out" / "report.csv").open() as fh:
        parsed = list(csv.DictReader(fh))
    assert parsed[1]["run"] == "dos-h" and float(parsed[1]["length_vs_baseline"]) == 2.0
    assert (tmp_path / "out" / "report.png").stat().st_size > 1000


def test_report_rejects_a_folder_without_summary(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"summary\.json"):
        build_report([tmp_path], tmp_path / "out")


def test_poison_monitor_counts_by_detector_and_author() -> None:
    monitor = PoisonMonitor(["text", "math", "code", "dos"], ArithTask())
    assert sorted(monitor.detectors) == ["code", "math", "text"]  # DoS has no per-completion verdict
    assert monitor.observe("evil", "All hail to the thief 2+2+0=5>5") == ["text", "math"]
    assert monitor.observe("good", "2+2+0=4>4") == []
    snap = monitor.snapshot()
    assert snap["flagged"] == {"text": 1, "math": 1}
    assert snap["flagged_by_author"] == {"evil": {"text": 1, "math": 1}}
