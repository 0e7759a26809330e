"""The ``dgrpo`` command line (typer + rich).

Errors are handled in one place (:func:`command`): any :class:`~dgrpo.errors.DgrpoError` (a bad setting, a
bad spec, a missing file, an unavailable sandbox) is one red line naming the problem, and exit status 2.
Anything else is a bug and keeps its traceback (short, without local variables, unless ``--debug``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dgrpo.cli import status as status  # the `status` command, on `app`: in its own module, importing no torch
from dgrpo.cli.common import (
    WEAK_SANDBOX,
    SetOption,
    WeakSandboxOption,
    app,  # the entry point (dgrpo.cli:app)
    command,
    console,
    defense_chain,
)
from dgrpo.cli.flower import flower_app
from dgrpo.cli.node import ADVERSARY_NAMES, node_app
from dgrpo.cli.status_table import status_table
from dgrpo.daemon.log_setup import LogFormat, choose, configure
from dgrpo.errors import ConfigError, DgrpoError

__all__ = ["app"]


@app.callback()
def main(
    log_format: Annotated[
        LogFormat,
        typer.Option(
            "--log-format",
            envvar="DGRPO_LOG_FORMAT",
            help="human: short lines, one per round for a daemon; json: one JSON object per line (a round's whole "
            "record in it), for log shippers",
        ),
    ] = LogFormat.human,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            envvar="DGRPO_DEBUG",
            help="debug logging (py-libp2p's too) and, for an unexpected error, the full traceback with local "
            "variables (they may hold settings and keys: mind where you paste it)",
        ),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="dgrpo's debug logging")] = False,
) -> None:
    # Set on every invocation, not only with --debug: the app object outlives one call (tests invoke it many times).
    app.pretty_exceptions_show_locals = debug
    app.pretty_exceptions_short = not debug
    choose(log_format, verbose=verbose, debug=debug)
    configure()


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


@command(app)
def simulate(
    scenario: Annotated[
        Path | None, typer.Argument(help="scenario TOML file or shipped scenario name; default: built-in")
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder")] = Path("runs/default"),
    overrides: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="override a scenario key, e.g. -s learner.lr=1e-4")
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
    spread over Ray actors)."""
    from dgrpo.simulations.runner import run_simulation
    from dgrpo.simulations.scenario import load_scenario

    chosen = [
        *([f"engine.name={engine}"] if engine else []),
        *([f"engine.address={ray_address}"] if ray_address else []),
    ]
    sc = load_scenario(scenario, [*chosen, *(overrides or []), *([WEAK_SANDBOX] if unsafe_weak_sandbox else [])])
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
    console.print(f"[bold]{sc.name}[/]: {who}, task {sc.task.name}, model {sc.model.name}, {sc.rounds} rounds -> {out}")
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
    asr = ""
    if summary.get("final_asr") is not None:
        name = "ASR" if summary["asr_metric"] == "asr" else "mean length"
        asr = f"; final {name} {summary['final_asr']:.3f}"
    console.print(
        f"accuracy {summary['initial_accuracy']:.3f} -> {summary['final_accuracy']:.3f}{asr} "
        f"in {summary['wall_seconds']:.0f}s; results in {out}/ (summary.json, metrics.jsonl, curves.png"
        f"{', asr.png' if asr else ''})"
    )


@command(app)
def sweep(
    scenarios: Annotated[
        list[str] | None,
        typer.Argument(help="scenarios (shipped names or TOML files; each an attack, or none); default: built-in"),
    ] = None,
    defense: Annotated[
        list[str] | None,
        typer.Option("--defense", "-d", help="a defense chain per option (names joined by +), or none; repeatable"),
    ] = None,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="seeds per cell (seed 0: the scenario as shipped)")] = 1,
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder")] = Path("runs/sweep"),
    overrides: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="override a key in every cell, e.g. -s rounds=20")
    ] = None,
    engine: Annotated[
        str, typer.Option("--engine", help="inprocess (cells one after another) or ray (each cell a Ray task)")
    ] = "inprocess",
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="with --engine ray: an existing cluster (default: a local Ray)")
    ] = None,
    cpus_per_cell: Annotated[float, typer.Option("--cpus-per-cell", help="with --engine ray: CPUs a cell holds")] = 1.0,
) -> None:
    """Scenarios x defense chains x seeds, in this process or as Ray tasks, collected into one table."""
    from dgrpo.simulations.sweep import cells_of, run_sweep

    if engine not in ("inprocess", "ray"):
        raise typer.BadParameter(f"--engine: inprocess or ray, not {engine!r}")
    names = scenarios or ["default"]
    chains = defense or ["none"]
    n = len(cells_of(names, chains, seeds))
    console.print(f"[bold]sweep[/]: {len(names)} scenarios x {len(chains)} defenses x {seeds} seeds = {n} runs "
                  f"({engine}) -> {out}")  # fmt: skip
    run_sweep(names, chains, seeds, out, overrides or [], engine, ray_address, cpus_per_cell, progress=console.print)
    console.print((out / "sweep.md").read_text())
    console.print(f"results in {out}/ (sweep.md, sweep.csv, sweep.json, sweep.png; one folder per run)")


@command(app)
def report(
    runs: Annotated[list[Path], typer.Argument(help="run folders (each with a summary.json)")],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="where report.md/.csv/.png go (default runs/report); with --html, the page's file "
            "(default RUN/report.html; one run only)",
        ),
    ] = None,
    baseline: Annotated[
        Path | None, typer.Option(help="an honest-only run: lengths are reported relative to it (DoS)")
    ] = None,
    html: Annotated[
        bool, typer.Option("--html", help="one self-contained HTML page per run instead of the comparison table")
    ] = False,
) -> None:
    """Compare runs: a markdown and CSV table and one overlay plot of ASR and honest accuracy per round.
    With --html: one page per run (configuration, curves, attack, defense, peers; compression and client
    weights for a federated run) that opens with no network."""
    if html:
        from dgrpo.simulations.html_report import write_report

        if out is not None and len(runs) > 1:
            raise ConfigError("--out names one page: give one run folder with it, or leave --out out")
        if baseline is not None:
            raise ConfigError("--baseline is for the comparison table, not --html")
        for run in runs:
            console.print(f"written: {write_report(run, out)}", markup=False, soft_wrap=True)
        return
    from dgrpo.simulations.report import build_report, to_markdown

    folder = out if out is not None else Path("runs/report")
    rows = build_report(runs, folder, baseline)
    console.print(to_markdown(rows))
    console.print(f"written: {folder}/report.md, {folder}/report.csv, {folder}/report.png")


testnet_app = typer.Typer(help="A local testnet of daemons on 127.0.0.1.", no_args_is_help=True)
app.add_typer(node_app, name="node")
app.add_typer(testnet_app, name="testnet")
app.add_typer(flower_app, name="flower")


@command(app)
def keygen(
    path: Annotated[Path, typer.Argument(help="where to write the Ed25519 identity key (PEM, mode 0600)")],
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing key")] = False,
) -> None:
    """Write a new node identity key and print its peer id."""
    from dgrpo.protocol.identity import Identity

    if path.exists() and not force:  # (save refuses too, without a race, but names its Python argument)
        raise ConfigError(f"{path} exists; --force overwrites it")
    identity = Identity.generate()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the folder {path.parent} ({exc.strerror or exc})") from None
    identity.save(path, overwrite=force)
    console.print(f"peer id {identity.peer_id} -> {path}")


PAGES_LISTED = 5  # `testnet up` prints the live page of this many nodes


@command(testnet_app, "up")
def testnet_up(
    n: Annotated[int, typer.Option("-n", "--nodes", help="number of daemons")] = 3,
    rounds: Annotated[int | None, typer.Option("--rounds", help="stop after R rounds; default: until Ctrl-C")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="state and results folder")] = Path("runs/testnet"),
    config: Annotated[Path | None, typer.Option("--config", "-c", help="node TOML for every node")] = None,
    overrides: SetOption = None,
    adversary: Annotated[
        str | None, typer.Option(help=f"NAME:COUNT malicious nodes; NAME one of {ADVERSARY_NAMES}")
    ] = None,
    defense: Annotated[
        str | None, typer.Option(help="defense chain NAME[,NAME...] (an unknown name's error lists the defenses)")
    ] = None,
    mode: Annotated[
        str, typer.Option(help="what the nodes exchange: completions (decentralised GRPO) | federated (Fed-GRPO)")
    ] = "completions",
    models: Annotated[
        str, typer.Option(help="homogeneous (one model) | heterogeneous (the embedded models in turn)")
    ] = "homogeneous",
    topology: Annotated[
        str | None, typer.Option(help="federated mode: star (node 0 aggregates) | decentralised")
    ] = None,
    timeout: Annotated[float, typer.Option(help="give up after this many seconds (with --rounds)")] = 3600.0,
    background: Annotated[
        bool, typer.Option("--background", help="start the nodes and return; stop them with `testnet down`")
    ] = False,
    unsafe_weak_sandbox: WeakSandboxOption = False,
    per_process: Annotated[
        int | None,
        typer.Option(
            "--per-process",
            help="light peers: K nodes to a process, each with its own key, libp2p host, model and state "
            "(torch loaded once per process), so that 100 nodes fit a small machine",
        ),
    ] = None,
    slow: Annotated[
        list[str] | None,
        typer.Option(
            "--slow",
            help="INDEX:FACTOR (repeatable): node INDEX runs FACTOR times slower, a straggler (compare "
            "-s rollout.mode=sync and async)",
        ),
    ] = None,
) -> None:
    """Start N daemons on 127.0.0.1 with generated keys and bootstrap wiring, and show a live status table."""
    import json as _json
    import time as _time

    from rich.live import Live

    from dgrpo.daemon.testnet import check_testnet_kind, join_command, start_testnet, stop_nodes, wait_rounds

    check_testnet_kind(mode, models)
    if topology is not None and (mode != "federated" or topology not in ("star", "decentralised")):
        raise ConfigError("--topology is star or decentralised, with --mode federated")
    attack: tuple[str, int] | None = None
    if adversary:
        from dgrpo.adversary import ADVERSARIES, parse_adversary_spec

        attack = parse_adversary_spec(adversary)
        if attack[0] not in ADVERSARIES:
            raise ConfigError(f"unknown adversary {attack[0]!r}; valid: {ADVERSARY_NAMES}")
        if attack[1] >= n:
            raise ConfigError(f"{attack[1]} malicious nodes leave no honest node among {n}")
    chain = defense_chain(defense) if defense else []
    if models == "heterogeneous":
        from dgrpo.config import SAME_MODEL_DEFENSES
        from dgrpo.defense import DEFENSES

        same = [name for name in chain if name in SAME_MODEL_DEFENSES]
        if same:
            raise ConfigError(
                f"--defense {','.join(same)} in a heterogeneous testnet: these compare a completion with the "
                "receiver's own model and weights, which the other nodes do not hold; use defenses that work "
                f"across models ({', '.join(n for n in DEFENSES.names() if n not in SAME_MODEL_DEFENSES)})"
            )
    extra = [*(overrides or []), *([WEAK_SANDBOX] if unsafe_weak_sandbox else [])]
    if topology is not None:
        extra.insert(0, f"federated.topology='{topology}'")
    stragglers: dict[int, float] = {}
    for item in slow or []:
        index, sep, factor = item.partition(":")
        try:
            stragglers[int(index)] = float(factor)
        except ValueError:
            raise ConfigError(f"--slow {item!r}: expected INDEX:FACTOR, e.g. 2:3") from None
        if not sep or stragglers[int(index)] < 1:
            raise ConfigError(f"--slow {item!r}: expected INDEX:FACTOR with FACTOR >= 1, e.g. 2:3")
    nodes = start_testnet(
        n, out, rounds, mode=mode, defense=chain, extra=extra, config=config, adversary=attack,
        per_process=per_process, slow=stragglers, models=models,
    )  # fmt: skip
    names = [f"node-{nd.index}" + (f" ({attack[0]})" if attack and nd.index >= n - attack[1] else "") for nd in nodes]
    console.print(f"testnet of {n} nodes up in {out}; peers: {', '.join(nd.peer_id[-8:] for nd in nodes)}")
    console.print(f"another machine joins with: {join_command(nodes[0])}")
    pages = [(nd.index, nd.page_url()) for nd in nodes]
    for i, page in pages[:PAGES_LISTED]:
        console.print(f"node-{i} live page: {page or '(status server off)'}")
    if len(pages) > PAGES_LISTED:
        console.print(f"... and {len(pages) - PAGES_LISTED} more (status_url in {out}/node-<i>/node.json)")
    console.print("open a live page in a browser: the node, its peers and its reward curve, updated every 2 s")
    if background:
        console.print(f"running in the background; `dgrpo status {out}/node-0`, `dgrpo testnet down --out {out}`")
        return
    finished = False
    try:
        with Live(status_table([None] * n, names), console=console, refresh_per_second=2) as live:

            def show(statuses: list[dict[str, Any] | None]) -> None:
                live.update(status_table(statuses, names))

            if rounds is not None:
                finished = wait_rounds(nodes, rounds, show, timeout)
            else:
                while True:
                    show([nd.status() for nd in nodes])
                    _time.sleep(1.0)
    except KeyboardInterrupt:
        console.print("stopping the testnet")
    except DgrpoError as exc:
        console.print(f"[red]error:[/] {exc}")
    console.line()  # the live table's last render ends without one where output is not a terminal
    clean = stop_nodes(nodes)
    for nd in nodes:
        path = nd.state_dir / "status.json"
        if path.exists():
            st = _json.loads(path.read_text())
            console.print(f"node-{nd.index}: {st['rounds_done']} rounds, status in {path}")
    if rounds is not None and not (finished and clean):
        console.print("[red]the testnet did not complete cleanly[/]; see the node.log files")
        raise typer.Exit(1)


@command(testnet_app, "down")
def testnet_down_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="the testnet's folder")] = Path("runs/testnet"),
) -> None:
    """Stop a testnet started in the background."""
    from dgrpo.daemon.testnet import testnet_down

    count = testnet_down(out)
    console.print(f"sent SIGTERM to {count} node(s)")


if __name__ == "__main__":
    app()
