"""``dgrpo flower run``: a federated scenario on a local Flower deployment (a SuperLink and one SuperNode per
client, or Flower's simulation engine), one line per round as it ends, like ``dgrpo simulate``.

flwr and torch are imported inside the command (through :mod:`dgrpo.flower.local`), so that ``dgrpo --help``
does not pay for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dgrpo.cli.common import SetOption, command, console

if TYPE_CHECKING:
    from dgrpo.flower.local import Deployment

flower_app = typer.Typer(
    help="Fed-GRPO as a Flower app (docs/flower.md), on this machine.\n\nExample: dgrpo flower run fed-grpo",
    no_args_is_help=True,
)


@command(flower_app, "run")
def flower_run(
    scenario: Annotated[
        str, typer.Argument(help="a shipped federated scenario (fed-grpo, fed-grpo-skewed, ...) or a TOML file")
    ] = "fed-grpo",
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder")] = Path("runs/flower"),
    overrides: SetOption = None,
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="deployment (a SuperLink and one SuperNode per client, processes on 127.0.0.1) or simulation "
            "(Flower's Ray engine; the flower-sim extra)",
        ),
    ] = "deployment",
    port: Annotated[
        int | None, typer.Option("--port", help="the SuperLink's port on 127.0.0.1 (default: a free one)")
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds the whole run may take")] = 1800,
) -> None:
    """Run a federated scenario on Flower, started and stopped here: the same experiment as `dgrpo simulate`
    of that scenario, with Flower's processes and transport.

    Examples:
    dgrpo flower run fed-grpo --out runs/flower
    dgrpo flower run fed-avg --engine simulation -s rounds=5
    """
    from dgrpo.cli import _format_federated_row  # here: dgrpo.cli imports this module
    from dgrpo.flower.config import scenario_of
    from dgrpo.flower.local import DeploymentError, chosen_port, require_flower, run_on_flower

    sets = overrides or []
    # Checked before the header and before anything starts, so a mistake is the only line printed.
    sc = scenario_of({"scenario": scenario, "overrides": ";".join(sets)})
    require_flower(engine)
    if port is not None:
        chosen_port(port)
    fed = sc.federated
    assert fed is not None  # scenario_of refuses a scenario without one
    console.print(
        f"[bold]{sc.name}[/]: {fed.clients} clients ({fed.weighting} / {fed.aggregator}, budget "
        f"{fed.sparsity.budget:g}), task {sc.task.name}, model {sc.model.name}, {sc.rounds} rounds "
        f"on Flower's {engine} engine -> {out}"
    )
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        starting = (
            f"starting a SuperLink and {fed.clients} SuperNodes"
            if engine == "deployment"
            else f"starting Flower's simulation engine ({fed.clients} virtual SuperNodes)"
        )
        bar = progress.add_task(starting, total=sc.rounds)

        def on_started(d: Deployment) -> None:
            up = d.timings.get("startup_seconds")
            took = f" in {up:.1f}s" if up is not None else ""
            progress.console.print(f"Flower up{took}: SuperLink {d.superlink}, {fed.clients} SuperNodes")
            progress.update(bar, description="rounds")

        def on_round(row: dict[str, Any]) -> None:
            progress.console.print(_format_federated_row(row))
            progress.update(bar, completed=row["round"])  # by number: a round no client answered has no row

        try:
            summary = run_on_flower(
                scenario, sets, out, timeout=timeout, engine=engine, port=port, on_round=on_round,
                on_started=on_started,
            )  # fmt: skip
        except DeploymentError as exc:
            # flwr's own answer can run to many lines; the first names the problem, the logs hold the rest.
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DeploymentError(f"{first} (Flower's logs: {out.resolve() / 'flower-logs'})") from None
    flower = summary.flower or {}
    refused = sum(r["count"] for r in flower.get("rejected", []))
    if refused:
        console.print(f"[yellow]{refused} client replies refused[/] (summary.json: flower.rejected)")
    overhead = f", Flower start-up {flower['startup_seconds']:.1f}s" if "startup_seconds" in flower else ""
    console.print(
        f"accuracy {summary.initial_accuracy:.3f} -> {summary.final_accuracy:.3f} in "
        f"{summary.wall_seconds:.0f}s{overhead}; results in {out}/ (summary.json, metrics.jsonl, flower-logs/)"
    )
