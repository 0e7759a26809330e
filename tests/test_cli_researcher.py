"""The command line a researcher expects (issue 44): `dgrpo scenarios`, `simulate --defense/--adversary`,
list-valued ``-s`` keys as ``a,b``, type errors that show the syntax, and an example in every command's help."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import click
import pytest
import typer.main
from typer.testing import CliRunner

from dgrpo.cli import app
from dgrpo.cli.scenarios import shipped_scenarios
from dgrpo.cli.simulate import build_scenario_from_cli, simulate_overrides
from dgrpo.daemon.settings import load_node_settings
from dgrpo.errors import ConfigError
from dgrpo.simulations.scenario import SCENARIO_DIR, load_scenario

runner = CliRunner()


def test_scenarios_lists_every_shipped_one_with_its_header_line() -> None:
    result = runner.invoke(app, ["scenarios"])
    assert result.exit_code == 0, result.output
    names = sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
    assert names and [name for name, _ in shipped_scenarios()] == names
    lines = result.output.splitlines()
    for name in names:
        assert any(line.split() and line.split()[0] == name for line in lines), name
    header = (SCENARIO_DIR / "text-horizontal.toml").read_text().splitlines()[0].lstrip("# ")
    assert any(line.startswith("text-horizontal ") and header in line for line in lines), result.output
    assert all(text for _, text in shipped_scenarios())  # every shipped file opens with its header comment


def test_the_scenarios_command_imports_no_torch() -> None:
    """In a fresh interpreter (this one has torch from conftest)."""
    script = textwrap.dedent(
        """
        import sys
        from typer.testing import CliRunner
        from dgrpo.cli import app
        result = CliRunner().invoke(app, ["scenarios"])
        assert result.exit_code == 0 and "text-horizontal" in result.output, result.output
        assert "torch" not in sys.modules
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout


def test_defense_and_adversary_flags_set_the_scenario() -> None:
    sc = build_scenario_from_cli(Path("text-horizontal"), defense="logit", adversary="text:1")
    assert sc.defense.chain == ["logit"]
    assert sc.adversary is not None and sc.adversary.name == "text" and sc.nodes.malicious == 1
    assert sc.adversary.options == {"position": "end"}  # the scenario's own tuning of that attack is kept
    # Another attack: the scenario's options for its own attack are dropped; COUNT is 1 unless given.
    sc = build_scenario_from_cli(Path("text-horizontal"), defense="length,logit", adversary="math")
    assert sc.defense.chain == ["length", "logit"]
    assert sc.adversary is not None and sc.adversary.name == "math" and sc.adversary.options == {}
    assert sc.nodes.malicious == 1
    # On the built-in scenario (no attack), with -s after the flags winning over them.
    sc = build_scenario_from_cli(None, adversary="dos:2", overrides=["nodes.malicious=1"])
    assert sc.adversary is not None and sc.adversary.name == "dos" and sc.nodes.malicious == 1
    sets = simulate_overrides(defense="sampling-proof", engine="ray", ray_address="127.0.0.1:6379")
    assert "rollout.sampler='seeded'" in sets and 'engine.address="127.0.0.1:6379"' in sets


def test_simulate_reaches_the_scenario_with_the_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`dgrpo simulate text-horizontal --defense logit --adversary text:1`: the runner gets that scenario."""
    import dgrpo.simulations.runner as runner_module

    seen: list[Any] = []

    def fake_run(scenario: Any, out: Path, on_round: Any = None, **_: Any) -> Any:
        seen.append(scenario)
        raise ConfigError("stopped before running")

    monkeypatch.setattr(runner_module, "run_simulation", fake_run)
    args = ["simulate", "text-horizontal", "--defense", "logit", "--adversary", "text:1", "-o", str(tmp_path)]
    result = runner.invoke(app, [*args, "-s", "rounds=1"])
    assert result.exit_code == 2 and "stopped before running" in result.output, result.output
    assert "1 malicious (text), defense logit" in result.output
    (sc,) = seen
    assert sc.defense.chain == ["logit"] and sc.adversary.name == "text" and sc.nodes.malicious == 1
    assert sc.rounds == 1


@pytest.mark.parametrize(
    ("flag", "expected", "listed"),
    [
        ("--defense=nope", "unknown defense 'nope'; valid:", "sampling-proof"),
        ("--defense=,", "expected NAME", None),
        ("--adversary=nope:1", "unknown adversary 'nope'; valid:", "text"),
        ("--adversary=text:x", "COUNT must be a positive integer", None),
    ],
)
def test_unknown_defense_or_adversary_is_one_line(flag: str, expected: str, listed: str | None, tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "text-horizontal", flag, "-o", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and expected in result.output, result.output
    assert listed is None or listed in result.output
    assert not (tmp_path / "run").exists()


def test_list_keys_take_comma_separated_names() -> None:
    assert load_scenario(None, ["defense.chain=logit,length"]).defense.chain == ["logit", "length"]
    assert load_scenario(None, ["defense.chain=logit"]).defense.chain == ["logit"]
    assert load_scenario(None, ['defense.chain=["logit","length"]']).defense.chain == ["logit", "length"]
    assert load_scenario(None, ["defense.chain=heterogeneous"]).defense.chain[0] == "repetition"  # a preset
    assert load_scenario(None, ["nodes.models=a, b"]).nodes.models == ["a", "b"]
    assert load_scenario(Path("text-horizontal"), ["defense.chain="]).defense.chain == []
    settings = load_node_settings(None, ["defense.chain=length,logit", "monitor.detectors=text"])
    assert settings.defense.chain == ["length", "logit"] and settings.monitor.detectors == ["text"]


def test_a_type_error_shows_the_syntax(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "-s", "defense.chain=5", "-o", str(tmp_path)])
    assert result.exit_code == 2, result.output
    expected = (
        "defense.chain: Input should be a valid list; expected a list, e.g. -s defense.chain=logit,length or "
        '-s \'defense.chain=["logit","length"]\''
    )
    assert expected in result.output and len(result.output.strip().splitlines()) == 1, result.output
    hints = {
        "eval.greedy=3": "expected true or false, e.g. -s eval.greedy=true",
        "rounds=x": "expected a whole number, e.g. -s rounds=50",
        "learner.lr=abc": "expected a number, e.g. -s learner.lr=",
        "run_id=5": "expected text (quoted where it reads as a number or boolean), e.g. -s 'run_id=\"5\"'",
        "nodes.models=[1]": "nodes.models.0: Input should be a valid string; expected a list, e.g. -s nodes.models=",
    }
    for override, hint in hints.items():
        with pytest.raises(ConfigError, match=r"^invalid scenario: ") as err:
            load_scenario(None, [override])
        assert hint in str(err.value), str(err.value)
    with pytest.raises(ConfigError) as err:
        load_node_settings(None, ["network.bootstrap=5"])
    assert "network.bootstrap: Input should be a valid list; expected a list, e.g. -s network.bootstrap=" in str(
        err.value
    )


def _leaf_commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            found += _leaf_commands(cmd, (*path, name))
        else:
            found.append((*path, name))
    return found


def test_every_command_help_has_an_example() -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, click.Group)
    leaves = _leaf_commands(root)
    assert {("simulate",), ("scenarios",), ("node", "run"), ("testnet", "up"), ("flower", "run")} <= set(leaves)
    groups = [(), ("node",), ("testnet",), ("flower",)]
    for path in [*groups, *leaves]:
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Example" in result.output, (path, result.output)
    assert "dgrpo scenarios" in runner.invoke(app, ["simulate", "--help"]).output


def test_positional_arguments_have_their_help() -> None:
    """click 8.5 hid typer's help of positional arguments (pinned below 8.5 in pyproject.toml)."""
    assert "shipped scenario name" in runner.invoke(app, ["simulate", "--help"], env={"COLUMNS": "200"}).output
    assert (
        "run folders, sweep or study folders" in runner.invoke(app, ["report", "--help"], env={"COLUMNS": "200"}).output
    )
