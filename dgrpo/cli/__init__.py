"""The ``dgrpo`` command line (typer + rich).

Errors are handled in one place (:func:`command`): any :class:`~dgrpo.errors.DgrpoError` (a bad setting, a
bad spec, a missing file, an unavailable sandbox) is one red line naming the problem, and exit status 2.
Anything else is a bug and keeps its traceback (short, without local variables, unless ``--debug``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dgrpo.cli import scenarios as scenarios  # `dgrpo scenarios`, on `app`: in its own module, importing no torch
from dgrpo.cli import simulate as simulate  # `dgrpo simulate`, on `app`
from dgrpo.cli import status as status  # the `status` command, on `app`: in its own module, importing no torch
from dgrpo.cli import sweep as sweep  # `dgrpo sweep`, on `app`
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
from dgrpo.cli.simulate import _format_federated_row as _format_federated_row  # `flower run` prints its rows
from dgrpo.cli.simulate import _format_row as _format_row
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


@command(app)
def report(
    runs: Annotated[
        list[Path],
        typer.Argument(help="runs to compare: run folders, sweep or study folders of runs, testnet folders"),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="where report.md/.csv/.png/.html and the run pages (runs/) go (default runs/report); with "
            "--html, the page's file (default RUN/report.html; one run only)",
        ),
    ] = None,
    baseline: Annotated[
        Path | None, typer.Option(help="an honest-only run: lengths are reported relative to it (DoS)")
    ] = None,
    html: Annotated[
        bool,
        typer.Option("--html", help="only each run's own HTML page (RUN/report.html), no comparison"),
    ] = False,
) -> None:
    """Compare runs: a markdown and CSV table, an overlay plot, and one self-contained HTML page (report.html)
    overlaying accuracy, honest reward, ASR (a DoS run's mean length on its own chart) and the defense's stop
    rate and FPR per round, each group of seeds as its mean with its spread, with each run's own page
    (configuration, curves, attack, defense, peers; compression and client weights for a federated run) in
    OUT/runs/ and linked. The pages open with no network. With --html: only the run pages, in the run folders.

    Examples:
    dgrpo report runs/text runs/text-logit --out runs/compare
    dgrpo report runs/sweep runs/testnet --out runs/compare
    dgrpo report runs/heterogeneous (a study's folder: its tables too)
    dgrpo report runs/dos runs/dos-length --baseline runs/honest
    dgrpo report runs/text --html
    """
    if html:
        from dgrpo.simulations.html_report import write_report

        if out is not None and len(runs) > 1:
            raise ConfigError("--out names one page: give one run folder with it, or leave --out out")
        if baseline is not None:
            raise ConfigError("--baseline is for the comparison, not --html")
        for run in runs:
            console.print(f"written: {write_report(run, out)}", markup=False, soft_wrap=True)
        return
    from dgrpo.simulations.comparison import build_comparison
    from dgrpo.simulations.report import to_markdown
    from dgrpo.simulations.study_tables import write_tables
    from dgrpo.simulations.sweep import saved_study

    folder = out if out is not None else Path("runs/report")
    for run in runs:  # a study's (or sweep's) folder: its own tables again, from the runs now there
        study = saved_study(run)
        if study is not None:
            console.print(write_tables(study, run), markup=False, soft_wrap=True)
            console.print(f"written: {run / 'tables.md'}, {run / 'tables'}/", markup=False, soft_wrap=True)
    result = build_comparison(runs, folder, baseline)
    console.print(to_markdown(result.rows), markup=False, soft_wrap=True)
    written = ", ".join(str(p) for p in result.files)
    console.print(f"written: {written} (run pages in {folder / 'runs'})", markup=False, soft_wrap=True)


testnet_app = typer.Typer(
    help="A local testnet of daemons on 127.0.0.1.\n\nExample: dgrpo testnet up -n 4 --rounds 10 --adversary text:1",
    no_args_is_help=True,
)
app.add_typer(node_app, name="node")
app.add_typer(testnet_app, name="testnet")
app.add_typer(flower_app, name="flower")


@command(app)
def keygen(
    path: Annotated[Path, typer.Argument(help="where to write the Ed25519 identity key (PEM, mode 0600)")],
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing key")] = False,
) -> None:
    """Write a new node identity key and print its peer id.

    Example:
    dgrpo keygen keys/node-a.key
    """
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
    """Start N daemons on 127.0.0.1 with generated keys and bootstrap wiring, and show a live status table.

    Examples:
    dgrpo testnet up -n 3 --rounds 5
    dgrpo testnet up -n 4 --adversary text:1 --defense logit,length --rounds 20 --out runs/tn
    dgrpo testnet up -n 100 --per-process 25 --background
    """
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
    """Stop a testnet started in the background.

    Example:
    dgrpo testnet down --out runs/testnet
    """
    from dgrpo.daemon.testnet import testnet_down

    count = testnet_down(out)
    console.print(f"sent SIGTERM to {count} node(s)")


if __name__ == "__main__":
    app()
