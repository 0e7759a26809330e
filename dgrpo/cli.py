"""The ``dgrpo`` command line (typer + rich).

Errors are handled in one place (:func:`command`): any :class:`~dgrpo.errors.DgrpoError` (a bad setting, a
bad spec, a missing file, an unavailable sandbox) is one red line naming the problem, and exit status 2.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dgrpo.errors import ConfigError, DgrpoError

app = typer.Typer(help="dgrpo: decentralised GRPO nodes, attacks and defenses.", no_args_is_help=True)
console = Console()
F = TypeVar("F", bound=Callable[..., Any])


def command(group: typer.Typer, name: str | None = None) -> Callable[[F], F]:
    """Register a command of ``group`` whose dgrpo errors become one line and exit status 2."""

    def register(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except DgrpoError as exc:
                console.print(f"[red]error:[/] {exc}")
                raise typer.Exit(2) from None

        group.command(name)(wrapper)
        return fn

    return register


def defense_chain(spec: str) -> list[str]:
    """``--defense a,b``: the chain's names, each a registered defense (else an error listing them)."""
    from dgrpo.config import parse_defense_spec
    from dgrpo.defense import DEFENSES

    chain = parse_defense_spec(spec)
    unknown = [d for d in chain if d not in DEFENSES]
    if unknown:
        raise ConfigError(f"unknown defense {unknown[0]!r}; valid: {', '.join(DEFENSES.names())}")
    return chain


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s %(message)s")


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


WEAK_SANDBOX = "task.options.unsafe_weak_sandbox=true"
WeakSandboxOption = Annotated[
    bool,
    typer.Option(
        "--unsafe-weak-sandbox",
        help="UNSAFE: where bubblewrap is unavailable, run peers' programs (code tasks) without OS-level "
        "isolation instead of refusing to start",
    ),
]


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
) -> None:
    """Run a decentralised GRPO simulation (N nodes in one process, over the signed wire format in memory)."""
    from dgrpo.simulations.runner import run_simulation
    from dgrpo.simulations.scenario import load_scenario

    sc = load_scenario(scenario, [*(overrides or []), *([WEAK_SANDBOX] if unsafe_weak_sandbox else [])])
    attack = f", {sc.nodes.malicious} malicious ({sc.adversary.name})" if sc.adversary and sc.nodes.malicious else ""
    if sc.defense.chain:
        attack += f", defense {','.join(sc.defense.chain)}"
    who = f"{sc.nodes.count} nodes ({sc.nodes.mode}, {sc.rollout.split}){attack}"
    if sc.federated is not None:
        fed = sc.federated
        who = (
            f"{fed.clients} clients ({fed.method}, {fed.weighting} / {fed.aggregator}, budget {fed.sparsity.budget:g})"
        )
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
def report(
    runs: Annotated[list[Path], typer.Argument(help="run folders (each with a summary.json)")],
    out: Annotated[Path, typer.Option("--out", "-o", help="where report.md/.csv/.png go")] = Path("runs/report"),
    baseline: Annotated[
        Path | None, typer.Option(help="an honest-only run: lengths are reported relative to it (DoS)")
    ] = None,
) -> None:
    """Compare runs: a markdown and CSV table and one overlay plot of ASR and honest accuracy per round."""
    from dgrpo.simulations.report import build_report, to_markdown

    rows = build_report(runs, out, baseline)
    console.print(to_markdown(rows))
    console.print(f"written: {out}/report.md, {out}/report.csv, {out}/report.png")


node_app = typer.Typer(help="Run a node of a decentralised GRPO network.", no_args_is_help=True)
testnet_app = typer.Typer(help="A local testnet of daemons on 127.0.0.1.", no_args_is_help=True)
app.add_typer(node_app, name="node")
app.add_typer(testnet_app, name="testnet")

SetOption = Annotated[list[str] | None, typer.Option("--set", "-s", help="override a setting, e.g. -s learner.lr=1e-4")]


@command(node_app, "run")
def node_run(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="node TOML configuration")] = None,
    overrides: SetOption = None,
    state_dir: Annotated[Path | None, typer.Option(help="keys, nonce, checkpoints, status")] = None,
    listen: Annotated[str | None, typer.Option(help="listen multiaddr, e.g. /ip4/0.0.0.0/tcp/4001")] = None,
    bootstrap: Annotated[
        list[str] | None,
        typer.Option(help="bootstrap multiaddr (repeatable); with no run flags the node learns the run from it"),
    ] = None,
    run_id: Annotated[str | None, typer.Option(help="network/run id")] = None,
    max_rounds: Annotated[int | None, typer.Option(help="stop after this many rounds")] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="continue from the newest valid checkpoint, with the settings, run, identity and known peers "
            "kept in --state-dir (other flags override them)",
        ),
    ] = False,
    allow_fresh: Annotated[
        bool,
        typer.Option(
            "--allow-fresh",
            help="start a new node (new identity, no checkpoints, replay state, reputation or blacklist), moving "
            "the old state aside; with --resume only where resuming is impossible (no checkpoint verifies, the "
            "identity key is missing, the checkpoint holds another model)",
        ),
    ] = False,
    adversary: Annotated[
        str | None, typer.Option(help="run as an attacker: text, dos, math or code (research testnets)")
    ] = None,
    defense: Annotated[
        str | None, typer.Option(help="defense chain NAME[,NAME...], e.g. length,arith-check,logit")
    ] = None,
    mode: Annotated[
        str | None, typer.Option(help="httt (exchange rollouts, the default) | federated (exchange model updates)")
    ] = None,
    unsafe_weak_sandbox: WeakSandboxOption = False,
    relay_service: Annotated[
        bool,
        typer.Option(
            "--relay-service",
            help="serve as a circuit relay v2 for peers behind NAT (a public node; see docs/joining.md)",
        ),
    ] = False,
    manifest_sha256: Annotated[
        str | None, typer.Option(help="when learning the run from --bootstrap: accept only this run manifest")
    ] = None,
) -> None:
    """Join (or start) a network and run GRPO rounds until stopped (SIGINT/SIGTERM stop it cleanly).

    Given only --bootstrap (no --config, --run-id, --mode, --defense, --max-rounds or --set of a run key), the
    node learns the run from its bootstrap peers, as `dgrpo node join` does."""
    import json as _json

    from dgrpo.daemon.daemon import run_daemon
    from dgrpo.daemon.join import overrides_run
    from dgrpo.daemon.local_state import saved_settings
    from dgrpo.daemon.settings import load_node_settings

    given = list(overrides or [])
    local = list(given)  # the node's own keys: never a reason not to learn the run from the network
    if unsafe_weak_sandbox:
        local.append(WEAK_SANDBOX)
    if state_dir is not None:
        local.append(f"state_dir={_json.dumps(str(state_dir))}")
    if listen is not None:
        local.append(f"network.listen={_json.dumps(listen)}")
    if bootstrap:
        local.append(f"network.bootstrap={_json.dumps(bootstrap)}")
    if relay_service:
        local.append("network.traversal.relay_service=true")
    if adversary is not None:
        local.append(f"adversary.name={_json.dumps(adversary)}")
    sets = list(local)
    if run_id is not None:
        sets.append(f"run_id={_json.dumps(run_id)}")
    if max_rounds is not None:
        sets.append(f"rounds.max_rounds={max_rounds}")
    if mode is not None:
        if mode not in ("httt", "federated"):
            raise ConfigError(f"unknown mode {mode!r}; valid modes: federated, httt")
        sets.append(f"mode={_json.dumps(mode)}")
    if defense is not None:
        from dgrpo.config import needs_seeded_sampler

        chain = defense_chain(defense)
        sets.append(f"defense.chain={_json.dumps(chain)}")
        if needs_seeded_sampler(chain):
            sets.append("rollout.sampler='seeded'")
    first = load_node_settings(config, sets)
    saved = saved_settings(first.state_dir) if resume else None
    run_flags = config is not None or len(sets) > len(local) or overrides_run(given)
    if bootstrap and not run_flags and saved is None:
        local = [item for item in local if not item.startswith("network.bootstrap=")]
        _join(bootstrap, local, first.state_dir, manifest_sha256, resume=resume, allow_fresh=allow_fresh)
        return
    if manifest_sha256 is not None:
        raise ConfigError("--manifest-sha256 applies when the node learns the run from --bootstrap (no run flags)")
    settings = load_node_settings(config, sets, saved=saved) if saved is not None else first
    if saved is not None:
        console.print(f"resuming with the settings saved in {saved} (flags given override them)")
    _daemon_logging()
    run_daemon(settings, resume=resume, allow_fresh=allow_fresh)


@command(node_app, "join")
def node_join(
    bootstrap: Annotated[
        list[str], typer.Argument(help="nodes of the run: /ip4/.../tcp/.../p2p/<peer id> (one or more, agreeing)")
    ],
    state_dir: Annotated[Path | None, typer.Option(help="keys, nonce, checkpoints, status, the run's manifest")] = None,
    overrides: SetOption = None,
    listen: Annotated[str | None, typer.Option(help="listen multiaddr, e.g. /ip4/0.0.0.0/tcp/4001")] = None,
    manifest_sha256: Annotated[
        str | None, typer.Option(help="refuse any run manifest but this one (its SHA-256, from the run's creator)")
    ] = None,
    relay_service: Annotated[
        bool, typer.Option("--relay-service", help="serve as a circuit relay v2 for peers behind NAT")
    ] = False,
) -> None:
    """Join the run the given nodes serve: fetch and verify its signed run manifest from each (they must agree),
    check this machine's base model against it, and run a daemon of that run (exit 2, naming what differs, where
    this node cannot)."""
    import json as _json

    from dgrpo.daemon.join import DEFAULT_STATE_DIR

    sets = list(overrides or [])
    if state_dir is not None:
        sets.append(f"state_dir={_json.dumps(str(state_dir))}")
    if listen is not None:
        sets.append(f"network.listen={_json.dumps(listen)}")
    if relay_service:
        sets.append("network.traversal.relay_service=true")
    _join(bootstrap, sets, state_dir or DEFAULT_STATE_DIR, manifest_sha256)


def _join(
    addrs: list[str],
    sets: list[str],
    state_dir: Path,
    manifest_sha256: str | None,
    resume: bool = False,
    allow_fresh: bool = False,
) -> None:
    from dgrpo.daemon.daemon import run_daemon
    from dgrpo.daemon.join import fetch_run_manifest, join_settings
    from dgrpo.daemon.run_manifest import joining

    learnt = fetch_run_manifest(addrs, state_dir, manifest_sha256)
    signed = learnt.manifest
    m = signed.manifest
    console.print(
        f"run {m.run_id!r} by {m.creator_peer_id}: model {m.model_id}, task {m.config['task']['name']}, "
        f"manifest sha256 {signed.sha256}"
    )
    settings = join_settings(signed, addrs, sets)
    _daemon_logging()
    with joining(signed, learnt.refused):
        run_daemon(settings, resume=resume, allow_fresh=allow_fresh)


def _daemon_logging() -> None:
    logging.getLogger("dgrpo").setLevel(logging.INFO)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s", force=True)
    for noisy in ("libp2p", "multiaddr", "async_service"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@command(app)
def keygen(
    path: Annotated[Path, typer.Argument(help="where to write the Ed25519 identity key (PEM, mode 0600)")],
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing key")] = False,
) -> None:
    """Write a new node identity key and print its peer id."""
    from dgrpo.protocol.identity import Identity

    identity = Identity.generate()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        identity.save(path, overwrite=force)
    except FileExistsError as exc:
        raise ConfigError(f"{exc} (--force overwrites it)") from None
    console.print(f"peer id {identity.peer_id} -> {path}")


def _status_table(statuses: list[dict[str, Any] | None], names: list[str]) -> Any:
    from rich.table import Table

    table = Table(title="dgrpo nodes")
    columns = ("node", "peer", "state", "round", "done", "peers", "reach", "links", "accepted", "rejected", "reward")
    for col in (*columns, "errors"):
        table.add_column(col)
    for name, st in zip(names, statuses, strict=True):
        if st is None:
            table.add_row(name, "-", "starting", *[""] * (len(columns) - 2))
            continue
        reward = st.get("mean_reward")
        net = st.get("network") or {}
        table.add_row(
            name,
            str(st["peer_id"])[-8:],
            str(st["state"]),
            str(st["round"]),
            str(st["rounds_done"]),
            str(len(st["peers"])),
            str((net.get("reachability") or {}).get("status", "")),
            f"{net.get('direct_peers', 0)}d/{net.get('relayed_peers', 0)}r" if net else "",
            str(st["messages_accepted"]),
            str(sum(st["messages_rejected"].values())),
            "" if reward is None else f"{reward:.3f}",
            str(len(st["last_errors"])),
        )
    return table


@command(app)
def status(
    target: Annotated[str, typer.Argument(help="status URL (http://127.0.0.1:8780) or a node's state dir")] = (
        "http://127.0.0.1:8780"
    ),
    as_json: Annotated[bool, typer.Option("--json", help="print the raw JSON")] = False,
) -> None:
    """Show a running node's status."""
    import json as _json
    import urllib.request

    from dgrpo.daemon.daemon import read_node_file

    url = target
    if not target.startswith("http"):
        info = read_node_file(Path(target))
        if info is None or not info.get("status_url"):
            raise ConfigError(f"no running node found in {target}")
        url = str(info["status_url"])
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=5) as resp:
            st = _json.loads(resp.read())
    except OSError as exc:
        raise ConfigError(f"cannot reach {url}: {exc}") from None
    if as_json:
        console.print_json(data=st)
        return
    console.print(_status_table([st], ["node"]))
    net = st.get("network") or {}
    if net:
        console.print(f"reachability: {net['reachability']['status']}  observed: {net['observed_addrs']}")
        console.print(f"announced: {st['listen_addrs']}")
        if net["relays"]:
            console.print(f"relay slots on: {net['relays']}")
        for peer, kind in net["connections"].items():
            console.print(f"  {peer}  {kind}")
    console.print(f"rejected by reason: {st['messages_rejected']}  blacklisted: {st['blacklisted_peers']}")
    for err in st["last_errors"][-5:]:
        console.print(f"[yellow]{err}[/]")


@command(testnet_app, "up")
def testnet_up(
    n: Annotated[int, typer.Option("-n", "--nodes", help="number of daemons")] = 3,
    rounds: Annotated[int | None, typer.Option("--rounds", help="stop after R rounds; default: until Ctrl-C")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="state and results folder")] = Path("runs/testnet"),
    config: Annotated[Path | None, typer.Option("--config", "-c", help="node TOML for every node")] = None,
    overrides: SetOption = None,
    adversary: Annotated[str | None, typer.Option(help="NAME:COUNT malicious nodes")] = None,
    defense: Annotated[str | None, typer.Option(help="defense chain NAME[,NAME...]")] = None,
    mode: Annotated[str, typer.Option(help="homogeneous | heterogeneous | federated")] = "homogeneous",
    topology: Annotated[
        str | None, typer.Option(help="federated mode: star (node 0 aggregates) | decentralised")
    ] = None,
    timeout: Annotated[float, typer.Option(help="give up after this many seconds (with --rounds)")] = 3600.0,
    background: Annotated[
        bool, typer.Option("--background", help="start the nodes and return; stop them with `testnet down`")
    ] = False,
    unsafe_weak_sandbox: WeakSandboxOption = False,
) -> None:
    """Start N daemons on 127.0.0.1 with generated keys and bootstrap wiring, and show a live status table."""
    import json as _json
    import time as _time

    from rich.live import Live

    from dgrpo.daemon.testnet import join_command, start_testnet, stop_nodes, wait_rounds

    if mode not in ("homogeneous", "heterogeneous", "federated"):
        raise ConfigError(f"unknown mode {mode!r}; valid modes: federated, heterogeneous, homogeneous")
    if topology is not None and (mode != "federated" or topology not in ("star", "decentralised")):
        raise ConfigError("--topology is star or decentralised, with --mode federated")
    attack: tuple[str, int] | None = None
    if adversary:
        from dgrpo.adversary import ADVERSARIES, parse_adversary_spec

        attack = parse_adversary_spec(adversary)
        if attack[0] not in ADVERSARIES:
            raise ConfigError(f"unknown adversary {attack[0]!r}; valid: {', '.join(ADVERSARIES.names())}")
        if attack[1] >= n:
            raise ConfigError(f"{attack[1]} malicious nodes leave no honest node among {n}")
    chain = defense_chain(defense) if defense else []
    if mode == "heterogeneous":
        from dgrpo.config import SAME_MODEL_DEFENSES

        same = [name for name in chain if name in SAME_MODEL_DEFENSES]
        if same:
            raise ConfigError(
                f"--defense {','.join(same)} in a heterogeneous testnet: these compare a completion with the "
                "receiver's own model and weights, which the other nodes do not hold; use defenses that work "
                "across models (surprisal, judge, arith-check, code-policy, length)"
            )
    extra = [*(overrides or []), *([WEAK_SANDBOX] if unsafe_weak_sandbox else [])]
    if topology is not None:
        extra.insert(0, f"federated.topology='{topology}'")
    nodes = start_testnet(n, out, rounds, mode=mode, defense=chain, extra=extra, config=config, adversary=attack)
    names = [f"node-{nd.index}" + (f" ({attack[0]})" if attack and nd.index >= n - attack[1] else "") for nd in nodes]
    console.print(f"testnet of {n} nodes up in {out}; peers: {', '.join(nd.peer_id[-8:] for nd in nodes)}")
    console.print(f"another machine joins with: {join_command(nodes[0])}")
    if background:
        console.print(f"running in the background; `dgrpo status {out}/node-0`, `dgrpo testnet down --out {out}`")
        return
    finished = False
    try:
        with Live(_status_table([None] * n, names), console=console, refresh_per_second=2) as live:

            def show(statuses: list[dict[str, Any] | None]) -> None:
                live.update(_status_table(statuses, names))

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
