"""``dgrpo sweep`` (issues 27 and 44): studies as code, cells continued where they stopped, tables made from
typed summaries, in this process, in worker processes or as Ray tasks."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dgrpo.cli import app
from dgrpo.errors import ConfigError
from dgrpo.simulations.measures import MEASURES, Context, mean_se
from dgrpo.simulations.study import STUDY_DIR, Cell, Holds, adhoc_study, load_study, parse_study
from dgrpo.simulations.summary import DefenseSummary, RunSummary
from dgrpo.simulations.sweep import cell_scenario, run_study

STUDY = """
[study]
name = "two-axes"
scenario = "text-horizontal"
seeds = 2
[set]
rounds = 3
"eval.every" = 1
[axes.attack.text]
set = { "learner.lr" = 2e-4 }
[axes.attack.dos]
scenario = "dos-horizontal"
set = { rounds = 5 }
[axes.defense.none]
set = { "defense.chain" = [] }
[axes.defense.logit]
set = { "defense.chain" = ["logit"] }
label = "logit alone"
[cells.honest]
scenario = "dos-horizontal"
set = { "nodes.malicious" = 0 }
[[table]]
name = "t"
columns = ["attack", "defense", "stop"]
"""


def test_cells_are_the_product_of_the_axes_in_order_with_overrides_later_winning() -> None:
    study = parse_study(STUDY, "test")
    cells = study.cells(("eval.prompts=8",))
    names = [c.folder for c in cells]
    assert names == [
        "text/none/seed0", "text/none/seed1", "text/logit/seed0", "text/logit/seed1",
        "dos/none/seed0", "dos/none/seed1", "dos/logit/seed0", "dos/logit/seed1",
        "honest/seed0", "honest/seed1",
    ]  # fmt: skip
    dos_logit = cells[6]
    assert dos_logit.scenario == "dos-horizontal" and dos_logit.coords == (("attack", "dos"), ("defense", "logit"))
    # study [set], then each axis value's set in axis order, then the command line's
    assert dos_logit.overrides == ("rounds=3", "eval.every=1", "rounds=5", 'defense.chain=["logit"]', "eval.prompts=8")
    assert cells[8].scenario == "dos-horizontal" and cells[8].coords == ()
    scenario = cell_scenario(dos_logit)
    assert scenario.rounds == 5 and scenario.defense.chain == ["logit"] and scenario.run_id == "dos-horizontal"
    seed1 = cell_scenario(cells[7])
    assert seed1.learner.seed == 1 and seed1.run_id == "dos-horizontal-s1"
    assert study.label("defense", "logit") == "logit alone" and study.label("defense", "none") == "none"


def test_grid_blocks_choose_values_and_a_bad_reference_names_the_choices() -> None:
    text = STUDY + '[[grid]]\nattack = ["dos"]\ndefense = ["logit"]\n[[grid]]\ndefense = ["none"]\nattack = ["text"]\n'
    cells = parse_study(text, "t").cells()
    assert [c.folder for c in cells if c.seed == 0] == ["dos/logit/seed0", "text/none/seed0", "honest/seed0"]
    with pytest.raises(ConfigError, match="grid 1: attack has no value 'math'; values: text, dos"):
        parse_study(STUDY + '[[grid]]\nattack = ["math"]\n', "t")
    with pytest.raises(ConfigError, match="unknown study t key 'tables'"):
        parse_study(STUDY + "[[tables]]\nname = 'x'\n", "t")
    with pytest.raises(ConfigError, match="value name 'a/b'"):
        parse_study(STUDY + '[axes.defense."a/b"]\n', "t")


def test_every_shipped_study_builds_every_cell_and_names_known_measures() -> None:
    shipped = sorted(STUDY_DIR.glob("*.toml"))
    assert {p.stem for p in shipped} >= {"attacks", "defenses", "binding", "surprisal", "heterogeneous"}
    for path in shipped:
        study = load_study(path)
        assert study.spec.study.doc, f"{path.name} says where its tables are published"
        for cell in study.cells():
            if cell.seed == 0:
                cell_scenario(cell)  # raises on a bad override
        for table in study.spec.table:
            for column in table.columns:
                assert column in study.spec.axes or column in ("cell", "seeds") or column in MEASURES.names()


def _summary(**kw: object) -> RunSummary:
    base: dict[str, object] = {
        "scenario": "s", "task": "arith", "model": "m", "mode": "homogeneous", "rounds": 4, "rounds_done": 4,
        "initial_accuracy": 0.5, "final_accuracy": 0.625, "accuracy": [(0, 0.5), (4, 0.625)],
    }  # fmt: skip
    return RunSummary.model_validate(base | kw)


def test_measures_by_hand() -> None:
    defense = DefenseSummary(
        names=["heterogeneous"], stop_rate=23 / 24, false_positive_rate=2 / 128,
        counts={"poison_received": 24, "poison_rejected": 23, "honest_received": 128, "honest_rejected": 2},
        false_positive_rate_by_model={"dgrpo:tiny-arith": 0.0, "dgrpo:tiny-arith-llama": 0.03125},
        rejected_by_reason={"meaning": 20, "arith-pattern": 3, "echo": 1, "length": 1},
    )  # fmt: skip
    run = _summary(defense=defense, asr_metric="mean_length", final_asr=41.086, final_mean_length=41.086)
    ctx = Context(holds=Holds(stop_min=0.9, family_fpr_max=0.05))

    def show(name: str, runs: list[RunSummary] = [run]) -> str:  # noqa: B006
        return MEASURES.get(name).show(runs, ctx)

    assert show("stop") == "0.958 (23/24)" and show("fpr") == "0.016 (2/128)"
    assert show("fpr_by_family") == "arith 0.000 llama 0.031" and show("worst_family_fpr") == "0.031"
    assert show("holds") == "yes" and show("reasons") == "meaning 20, arith-pattern 3, echo 1"
    assert show("asr") == "41.1 chars" and show("asr_rate") == "-"  # a DoS length is no success rate
    assert show("accuracy") == "0.500 -> 0.625" and show("rounds") == "4"
    # two seeds: mean ± standard error; counts stay whole numbers
    other = _summary(final_accuracy=0.875, rounds_done=4)
    assert show("final_accuracy", [run, other]) == "0.750 ± 0.125"  # mean 0.75; sd 0.1768 / sqrt(2) = 0.125
    assert show("rounds", [run, other]) == "4 ± 0.000"
    assert mean_se([0.5, 0.7, 0.9]) == pytest.approx((0.7, 0.2 / 3**0.5))  # sd 0.2 (by hand), s.e. 0.2/sqrt(3)
    failing = _summary(defense=defense.model_copy(update={"stop_rate": 0.8}))
    assert MEASURES.get("holds").show([failing], ctx) == "**no**"


TINY = """
[study]
name = "tiny"
scenario = "text-horizontal"
seeds = 1
[set]
rounds = 3
"eval.every" = 1
"eval.prompts" = 8
"eval.asr_prompts" = 8
"round.prompts_per_round" = 4
"rollout.sampler" = "seeded"
[axes.defense.none]
set = { "defense.chain" = [] }
[axes.defense.logit]
set = { "defense.chain" = ["logit"], "defense.reputation.enabled" = false }
[[table]]
name = "main"
columns = ["defense", "seeds", "stop", "fpr", "accuracy", "asr", "attacker_share", "reasons", "rounds"]
"""


@pytest.mark.slow
def test_an_interrupted_study_started_again_finishes_with_the_uninterrupted_table(tmp_path: Path) -> None:
    """Stopped in the middle of its second cell (after that cell's first round of 3), the study is started again:
    finished cells are skipped, the stopped one resumes from its snapshot, and the table equals the table of
    the same study run without a stop."""
    from dgrpo.simulations.stopping import StopRequest

    study = parse_study(TINY, "tiny")
    whole = run_study(study, tmp_path / "whole", progress=lambda line: None)
    assert whole.complete and whole.ran == 2

    stop = StopRequest()
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if line.startswith("logit/seed0: running"):
            stop.set("test")  # seen by the cell after its first round: it stops there, saved

    first = run_study(study, tmp_path / "cut", progress=progress, stop=stop)
    assert not first.complete and first.ran == 2
    assert (tmp_path / "cut" / "logit" / "seed0" / "state" / "snapshot.pkl").is_file()
    assert "not run yet: logit" in first.tables
    lines.clear()
    second = run_study(study, tmp_path / "cut", progress=lines.append)
    assert second.complete and second.skipped == 1 and second.ran == 1
    assert "none/seed0: done already" in lines and "logit/seed0: resuming" in lines
    assert second.tables == whole.tables
    assert "| logit | 1 |" in whole.tables
    # `dgrpo report` on the study's folder makes its tables again (and the comparison page)
    (tmp_path / "cut" / "tables.md").unlink()
    result = CliRunner().invoke(app, ["report", str(tmp_path / "cut"), "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cut" / "tables.md").read_text() == whole.tables
    assert (tmp_path / "report" / "report.html").is_file()


def test_a_finished_cell_of_another_configuration_is_refused(tmp_path: Path) -> None:
    study = parse_study(TINY.replace("rounds = 3", "rounds = 1"), "tiny")
    run_study(study, tmp_path, only="^none/", progress=lambda line: None)
    changed = parse_study(TINY.replace("rounds = 3", "rounds = 2"), "tiny")
    with pytest.raises(ConfigError, match="holds a run of another configuration"):
        run_study(changed, tmp_path, only="^none/", progress=lambda line: None)


def test_the_command_line_sweep_is_a_study_of_scenarios_by_defenses() -> None:
    study = adhoc_study(["text-horizontal", "default"], [(), ("logit", "length")], 2)
    cells = study.cells()
    assert [c.folder for c in cells][:3] == ["text-horizontal/none/seed0", "text-horizontal/none/seed1",
                                            "text-horizontal/logit+length/seed0"]  # fmt: skip
    assert cells[-1] == Cell(
        "default/logit+length", None, ('defense.chain=["logit", "length"]',),
        (("scenario", "default"), ("defense", "logit+length")), 1,
    )  # fmt: skip


@pytest.mark.slow
def test_a_sweep_on_ray_and_in_workers_gives_the_in_process_table(tmp_path: Path) -> None:
    """Four cells (no defense and `logit` against TEXT, two seeds) as Ray tasks on a local Ray, two at a time
    in worker processes, and one after another here: the same table."""
    common = [
        "default", "-d", "none", "-d", "logit", "--seeds", "2", "-s", "rounds=2", "-s", "eval.prompts=16",
        "-s", "nodes.malicious=1", "-s", "adversary.name=text", "-s", "model.name=dgrpo:tiny-arith-text",
    ]  # fmt: skip
    runner = CliRunner()
    tables = {}
    for engine, extra in (("inprocess", []), ("ray", []), ("workers", ["--jobs", "2"])):
        args = ["sweep", *common, "--engine", "inprocess" if engine == "workers" else engine, *extra]
        result = runner.invoke(app, [*args, "--out", str(tmp_path / engine)])
        assert result.exit_code == 0, result.output
        assert "| default | logit | 2 |" in result.output
        tables[engine] = (tmp_path / engine / "tables" / "sweep.csv").read_text()
        assert (tmp_path / engine / "default" / "logit" / "seed1" / "summary.json").is_file()
    assert tables["ray"] == tables["inprocess"] == tables["workers"]
