"""The ``dgrpo`` command line (typer + rich)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dgrpo.errors import DgrpoError

app = typer.Typer(help="dgrpo: decentralised GRPO nodes, attacks and defenses.", no_args_is_help=True)
console = Console()


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s %(message)s")


def _format_row(row: dict[str, Any]) -> str:
    acc = f"  accuracy {row['accuracy']:.3f}" if "accuracy" in row else ""
    return (
        f"round {row['round']:>3}  honest reward {row['honest_mean_reward']:.3f}{acc}"
        f"  exchanged {row['completions_exchanged']}  ({row['seconds']:.1f}s)"
    )


@app.command()
def simulate(
    scenario: Annotated[
        Path | None, typer.Argument(help="scenario TOML file or shipped scenario name; default: built-in")
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder")] = Path("runs/default"),
    overrides: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="override a scenario key, e.g. -s learner.lr=1e-4")
    ] = None,
) -> None:
    """Run a decentralised GRPO simulation (N nodes in one process, in-memory transport)."""
    from dgrpo.simulations.runner import run_simulation
    from dgrpo.simulations.scenario import load_scenario

    try:
        sc = load_scenario(scenario, overrides or [])
        console.print(
            f"[bold]{sc.name}[/]: {sc.nodes.count} nodes ({sc.nodes.mode}, {sc.round.split}), task {sc.task.name}, "
            f"model {sc.model.name}, {sc.rounds} rounds -> {out}"
        )
        with Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            bar = progress.add_task("rounds", total=sc.rounds)

            def on_round(row: dict[str, Any]) -> None:
                progress.console.print(_format_row(row))
                progress.advance(bar)

            summary = run_simulation(sc, out, on_round)
    except DgrpoError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    console.print(
        f"accuracy {summary['initial_accuracy']:.3f} -> {summary['final_accuracy']:.3f} "
        f"in {summary['wall_seconds']:.0f}s; results in {out}/ (summary.json, metrics.jsonl, curves.png)"
    )


if __name__ == "__main__":
    app()
