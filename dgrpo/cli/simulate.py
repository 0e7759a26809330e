"""``dgrpo simulate``: a decentralised GRPO simulation (or a federated one), one line per round as it ends.

The scenario is built from the command line by :func:`build_scenario_from_cli` (a shipped name or a TOML file,
``--defense``, ``--adversary``, ``--engine`` and ``-s`` overrides), which loads no model: a mistake is one line
before anything starts.
"""

from __future__ import annotations

import json
import time
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from dgrpo.cli.common import WEAK_SANDBOX, WeakSandboxOption, app, command, console, defense_chain
from dgrpo.cli.node import ADVERSARY_NAMES
from dgrpo.errors import ConfigError

if TYPE_CHECKING:
    from dgrpo.simulations.scenario import Scenario
    from dgrpo.simulations.summary import RunSummary


def _format_federated_row(row: dict[str, Any]) -> str:
    acc = f"  accuracy {row['accuracy']:.3f}" if "accuracy" in row else ""
    sent = row.get("bytes_sent") or {}
    traffic = f"  {sum(sent.values()) / len(sent) / 1024:.0f} KiB/client" if sent else ""
    share = row.get("attacker_weight_share")
    attacker = f"  attacker weight {share:.3f}" if share is not None else ""
    seconds = f"  ({row['seconds']:.1f}s)"
    return f"round {row['round']:>3}  mean reward {row['mean_reward']:.3f}{acc}{traffic}{attacker}{seconds}"


def _format_row(row: dict[str, Any]) -> str:
    if "client_reward" in row:
        return _format_federated_row(row)
    acc = f"  accuracy {row['accuracy']:.3f}" if "accuracy" in row else ""
    asr = f"  asr {row['asr']:.3f}" if "asr" in row else ""
    length = f"  length {row['mean_length']:.1f}" if "mean_length" in row else ""
    poison = f"  poison {row['poison_published']}" if row.get("poison_published") else ""
    defense = ""
    if row.get("defense"):
        d = row["defense"]
        stop = f"{d['stop_rate']:.2f}" if d.get("stop_rate") is not None else "-"
        fpr = f"{d['false_positive_rate']:.3f}" if d.get("false_positive_rate") is not None else "-"
        defense = f"  stop {stop} fpr {fpr}"
    return (
        f"round {row['round']:>3}  honest reward {row['honest_mean_reward']:.3f}{acc}{asr}{length}"
        f"  exchanged {row['completions_exchanged']}{poison}{defense}  ({row['seconds']:.1f}s)"
    )


def _named_attack(scenario: Path | None) -> str | None:
    """The attack the scenario's file names in its ``[adversary]`` section; None where it names none, or where
    the file cannot be read (loading it then says why)."""
    from dgrpo.simulations.scenario import SCENARIO_DIR

    if scenario is None:
        return None
    path = scenario if scenario.exists() else SCENARIO_DIR / f"{scenario}.toml"
    try:
        section = tomllib.loads(path.read_text()).get("adversary")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return section.get("name") if isinstance(section, dict) else None


def simulate_overrides(
    scenario: Path | None = None,
    *,
    defense: str | None = None,
    adversary: str | None = None,
    engine: str | None = None,
    ray_address: str | None = None,
    overrides: list[str] | None = None,
    unsafe_weak_sandbox: bool = False,
) -> list[str]:
    """The ``key=value`` overrides the command line makes of the scenario: its flags first, then ``-s`` (which
    wins over them). ``--defense a,b`` sets ``defense.chain`` (and the seeded sampler the sampling-proof needs);
    ``--adversary NAME[:COUNT]`` sets ``adversary.name`` and ``nodes.malicious`` (COUNT, default 1), and drops
    the options of another attack the scenario names. Unknown names are a ConfigError listing the valid ones."""
    sets: list[str] = []
    if engine:
        sets.append(f"engine.name={json.dumps(engine)}")
    if ray_address:
        sets.append(f"engine.address={json.dumps(ray_address)}")
    if defense is not None:
        from dgrpo.config import needs_seeded_sampler

        chain = defense_chain(defense)
        sets.append(f"defense.chain={json.dumps(chain)}")
        if needs_seeded_sampler(chain):
            sets.append("rollout.sampler='seeded'")
    if adversary is not None:
        from dgrpo.adversary import ADVERSARIES, parse_adversary_spec

        name, count = parse_adversary_spec(adversary)
        if name not in ADVERSARIES:
            raise ConfigError(f"unknown adversary {name!r}; valid: {ADVERSARY_NAMES}")
        if _named_attack(scenario) not in (None, name):  # another attack's options mean nothing to this one
            sets.append("adversary.options={}")
        sets += [f"adversary.name={json.dumps(name)}", f"nodes.malicious={count}"]
    return [*sets, *(overrides or []), *([WEAK_SANDBOX] if unsafe_weak_sandbox else [])]


def build_scenario_from_cli(scenario: Path | None = None, **flags: Any) -> Scenario:
    """The scenario ``dgrpo simulate`` runs: ``scenario`` (a TOML file, a shipped name or None: the built-in
    one) with the command line's overrides (:func:`simulate_overrides`, which takes the same keywords)."""
    from dgrpo.simulations.scenario import load_scenario

    return load_scenario(scenario, simulate_overrides(scenario, **flags))


def _describe(sc: Scenario) -> str:
    attack = f", {sc.nodes.malicious} malicious ({sc.adversary.name})" if sc.adversary and sc.nodes.malicious else ""
    if sc.defense.chain:
        attack += f", defense {','.join(sc.defense.chain)}"
    who = f"{sc.nodes.count} nodes ({sc.nodes.mode}, {sc.rollout.split}){attack}"
    if sc.federated is not None:
        fed = sc.federated
        who = (
            f"{fed.clients} clients ({fed.method}, {fed.weighting} / {fed.aggregator}, budget {fed.sparsity.budget:g})"
        )
    if sc.engine.name == "ray" and sc.federated is None:
        who += f", on Ray ({sc.engine.workers} actors{', ' + sc.engine.address if sc.engine.address else ''})"
    return who


def _eta(seconds: float) -> str:
    whole = round(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


def _finished(summary: RunSummary, out: Path) -> None:
    asr = ""
    if summary.final_asr is not None:
        name = "mean length" if summary.length_metric else "ASR"
        asr = f"; final {name} {summary.final_asr:.3f}"
    if not summary.complete:
        console.print(
            f"stopped after round {summary.rounds_done} of {summary.rounds}: accuracy {summary.initial_accuracy:.3f} "
            f"-> {summary.final_accuracy:.3f}{asr}; what ran is in {out}/ (summary.json, metrics.jsonl)"
        )
        console.print(f"continue with: dgrpo simulate --resume {out}", markup=False, soft_wrap=True)
        raise typer.Exit(130)
    console.print(
        f"accuracy {summary.initial_accuracy:.3f} -> {summary.final_accuracy:.3f}{asr} "
        f"in {summary.wall_seconds:.0f}s; results in {out}/ (summary.json, metrics.jsonl, curves.png"
        f"{', asr.png' if asr else ''})"
    )


@command(app)
def simulate(
    scenario: Annotated[
        Path | None,
        typer.Argument(
            help="scenario TOML file or shipped scenario name (`dgrpo scenarios` lists them); default: built-in"
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder")] = Path("runs/default"),
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set", "-s", help="override a scenario key, e.g. -s learner.lr=1e-4 or -s defense.chain=logit,length"
        ),
    ] = None,
    defense: Annotated[
        str | None,
        typer.Option(
            "--defense",
            help="the honest nodes' defense chain NAME[,NAME...] (an unknown name's error lists the defenses); "
            "same as -s defense.chain=...",
        ),
    ] = None,
    adversary: Annotated[
        str | None,
        typer.Option(
            "--adversary",
            help=f"NAME[:COUNT]: the last COUNT nodes (default 1) run attack NAME, one of {ADVERSARY_NAMES}",
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            help="continue the interrupted run in this folder from its last saved round (same results as a run "
            "never interrupted); takes no scenario, flags or -s",
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="replace the run already in --out (without it, that is refused)")
    ] = False,
    tensorboard: Annotated[
        Path | None,
        typer.Option(
            "--tensorboard",
            help="also log every round's scalars (per node and for the run) to TensorBoard event files in this "
            "folder (`tensorboard --logdir DIR`); same as -s logging.tensorboard=DIR",
        ),
    ] = None,
    unsafe_weak_sandbox: WeakSandboxOption = False,
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            help="inprocess (default: every node in this process) or ray (nodes as Ray actors; the `ray` extra); "
            "same as -s engine.name=...",
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="with --engine ray: an existing Ray cluster (default: start a local one)"),
    ] = None,
) -> None:
    """Run a decentralised GRPO simulation (N nodes over the signed wire format in memory; in this process or
    spread over Ray actors). Ctrl-C or SIGTERM stops it after the round in progress; --resume continues it.

    Examples:
    dgrpo scenarios
    dgrpo simulate text-horizontal --out runs/text
    dgrpo simulate text-horizontal --defense logit --out runs/text-logit
    dgrpo simulate math-vertical --adversary math:2 -s rounds=20 -s learner.lr=1e-4
    dgrpo simulate --resume runs/text
    dgrpo simulate my-scenario.toml --engine ray --tensorboard runs/tb
    """
    from dgrpo.simulations.runner import resume_simulation, run_simulation
    from dgrpo.simulations.stopping import StopRequest, stop_on_signals

    if resume is not None:
        given = [name for name, value in (("SCENARIO", scenario), ("--defense", defense), ("--adversary", adversary),
                 ("-s", overrides), ("--engine", engine), ("--ray-address", ray_address),
                 ("--tensorboard", tensorboard), ("--overwrite", overwrite)) if value]  # fmt: skip
        if given:
            raise ConfigError(f"--resume continues a run as it was started: leave out {', '.join(given)}")
        out = resume
        done, total = _progress_of(out)
        console.print(f"resuming {out} after round {done}")
    else:
        sets = [*(overrides or []), *([f"logging.tensorboard={json.dumps(str(tensorboard))}"] if tensorboard else [])]
        sc = build_scenario_from_cli(
            scenario, defense=defense, adversary=adversary, engine=engine, ray_address=ray_address,
            overrides=sets, unsafe_weak_sandbox=unsafe_weak_sandbox,
        )  # fmt: skip
        console.print(
            f"[bold]{sc.name}[/]: {_describe(sc)}, task {sc.task.name}, model {sc.model.name}, {sc.rounds} rounds "
            f"-> {out}"
        )
        done, total = 0, sc.rounds
    stop = StopRequest()
    with (
        stop_on_signals(stop, announce=lambda line: console.print(f"[yellow]{line}[/]")),
        Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        ) as progress,
    ):
        bar = progress.add_task("rounds", total=total, completed=done)
        started = time.monotonic()
        first = done

        def on_round(row: dict[str, Any]) -> None:
            goal = progress.tasks[0].total
            ran = row["round"] - first
            left = (goal - row["round"]) if goal is not None else 0
            eta = f"  eta {_eta((time.monotonic() - started) / ran * left)}" if ran and left > 0 else ""
            progress.console.print(_format_row(row) + eta)
            progress.update(bar, completed=row["round"])

        if resume is not None:
            summary = resume_simulation(out, on_round, stop=stop)
        else:
            summary = run_simulation(sc, out, on_round, overwrite=overwrite, stop=stop)
    _finished(summary, out)


def _progress_of(out: Path) -> tuple[int, int | None]:
    """Rounds an interrupted run in ``out`` finished, and of how many (from its summary, where it wrote one)."""
    from dgrpo.simulations.run_folder import RunFolder
    from dgrpo.simulations.summary import has_summary, load_summary

    metrics = RunFolder(out).metrics
    done = sum(1 for line in metrics.read_text().splitlines() if line.strip()) if metrics.is_file() else 0
    try:
        total = load_summary(out).rounds if has_summary(out) else None
    except ConfigError:
        total = None
    return done, total
