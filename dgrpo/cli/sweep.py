"""``dgrpo sweep``: a study (a TOML file, or scenarios x defense chains x seeds from the command line) run cell
by cell, continued where it stopped, and tabled (:mod:`dgrpo.simulations.sweep`)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dgrpo.cli.common import app, command, console
from dgrpo.errors import ConfigError

if TYPE_CHECKING:
    from dgrpo.simulations.study import Study


def _study_file(names: list[str]) -> Path | None:
    """The study a lone argument names (a TOML file with a [study] table, or a shipped study), else None."""
    from dgrpo.simulations.study import STUDY_DIR

    if len(names) != 1:
        return None
    path = Path(names[0])
    if not path.is_file() and (STUDY_DIR / f"{names[0]}.toml").is_file():
        return STUDY_DIR / f"{names[0]}.toml"
    if path.suffix != ".toml" or not path.is_file():
        return None
    try:
        return path if "study" in tomllib.loads(path.read_text()) else None
    except tomllib.TOMLDecodeError:
        return path  # the study loader says what is wrong with it


def build_study(names: list[str], defense: list[str] | None, seeds: int | None) -> Study:
    from dgrpo.simulations.study import adhoc_study, load_study

    path = _study_file(names)
    if path is not None:
        if defense or seeds is not None:
            raise ConfigError("a study file names its own defenses and seeds: leave out -d and --seeds (or use -s)")
        return load_study(path)
    from dgrpo.cli.common import defense_chain

    chains = [
        tuple(() if d.strip() in ("", "none") else defense_chain(d.replace("+", ","))) for d in defense or ["none"]
    ]
    return adhoc_study(names or ["default"], chains, seeds or 1)


@command(app)
def sweep(
    scenarios: Annotated[
        list[str] | None,
        typer.Argument(
            help="a study (TOML file with [study], or a shipped study's name), or scenarios (shipped names or "
            "TOML files); default: the built-in scenario"
        ),
    ] = None,
    defense: Annotated[
        list[str] | None,
        typer.Option("--defense", "-d", help="a defense chain per option (names joined by +), or none; repeatable"),
    ] = None,
    seeds: Annotated[
        int | None, typer.Option("--seeds", min=1, help="seeds per cell (seed 0: the scenario as shipped); default 1")
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder")] = Path("runs/sweep"),
    overrides: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="override a key in every cell, e.g. -s rounds=20")
    ] = None,
    only: Annotated[
        str | None, typer.Option("--only", help="run only the cells whose CELL/seedK matches this regular expression")
    ] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="cells run at a time (in worker processes)")] = 1,
    engine: Annotated[
        str, typer.Option("--engine", help="inprocess (cells in this machine's processes) or ray (each a Ray task)")
    ] = "inprocess",
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="with --engine ray: an existing cluster (default: a local Ray)")
    ] = None,
    cpus_per_cell: Annotated[float, typer.Option("--cpus-per-cell", help="with --engine ray: CPUs a cell holds")] = 1.0,
) -> None:
    """Run a study, or scenarios x defense chains x seeds, and make its tables (tables.md, tables/*.md, .csv,
    .png). Run again into the same --out, it continues: finished cells are skipped, an interrupted one resumes.

    Examples:
    dgrpo sweep studies/heterogeneous.toml --out runs/heterogeneous --jobs 2
    dgrpo sweep studies/heterogeneous.toml --out runs/het-r20 -s rounds=20 --only 'text'
    dgrpo sweep text-horizontal math-horizontal -d none -d logit -d length+logit --seeds 3
    dgrpo report runs/heterogeneous
    """
    from dgrpo.simulations.stopping import StopRequest, stop_on_signals
    from dgrpo.simulations.sweep import run_study

    if engine not in ("inprocess", "ray"):
        raise ConfigError(f"--engine: inprocess or ray, not {engine!r}")
    study = build_study(scenarios or [], defense, seeds)
    cells = study.cells()
    names = len({c.name for c in cells})
    console.print(
        f"[bold]{study.name}[/]: {names} cells x {study.spec.study.seeds} seeds = {len(cells)} runs ({engine}"
        f"{f', {jobs} at a time' if jobs > 1 and engine == 'inprocess' else ''}) -> {out}"
    )
    stop = StopRequest()
    with stop_on_signals(stop, announce=lambda line: console.print(f"[yellow]{line}[/]")):
        result = run_study(
            study, out, overrides or [], only=only, jobs=jobs, engine=engine, address=ray_address,
            cpus_per_cell=cpus_per_cell, progress=lambda line: console.print(line, markup=False), stop=stop,
        )  # fmt: skip
    console.print(result.tables, markup=False)
    console.print(f"ran {result.ran} runs, {result.skipped} done already; tables in {out}/tables.md and {out}/tables/")
    if not result.complete:
        again = " ".join(["dgrpo sweep", *(scenarios or []), f"--out {out}"])
        console.print(f"the sweep stopped before every cell finished; continue with: {again} (same options)")
        raise typer.Exit(130)
