"""``dgrpo node run`` and ``dgrpo node join``: a node of a network, configured here or learnt from its peers."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from dgrpo.adversary import ADVERSARIES
from dgrpo.cli.common import WEAK_SANDBOX, SetOption, WeakSandboxOption, command, daemon_logging, defense_chain
from dgrpo.errors import ConfigError

log = logging.getLogger("dgrpo.daemon")

# Built from the registry, never typed: importing it costs no torch (`python -X importtime -c "import
# dgrpo.adversary"`), so the help lists every attack registered. Defenses import torch: their list is in the error.
ADVERSARY_NAMES = ", ".join(ADVERSARIES.names())

node_app = typer.Typer(
    help="Run a node of a decentralised GRPO network.\n\nExample: dgrpo node run --state-dir runs/a --solo",
    no_args_is_help=True,
)


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
        str | None, typer.Option(help=f"run as an attacker (research testnets): {ADVERSARY_NAMES}")
    ] = None,
    defense: Annotated[
        str | None, typer.Option(help="defense chain NAME[,NAME...] (an unknown name's error lists the defenses)")
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(help="completions (exchange completions, the default) | federated (exchange model updates)"),
    ] = None,
    solo: Annotated[
        bool,
        typer.Option(
            "--solo",
            help="train alone: start the first round without waiting for a peer (rounds.min_peers=0; by default "
            "a node waits for one, at most rounds.start_timeout_seconds)",
        ),
    ] = False,
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
    slow: Annotated[
        float | None,
        typer.Option(
            "--slow",
            help="fault injection: run FACTOR times slower (after generating and after updating, wait FACTOR - 1 "
            "times as long as each took), a straggler for testing sync and async rounds",
        ),
    ] = None,
    tensorboard: Annotated[
        Path | None,
        typer.Option(
            help="write TensorBoard event files of this node's rounds to this folder (-s logging.tensorboard=DIR); "
            "view them with `tensorboard --logdir DIR`"
        ),
    ] = None,
) -> None:
    """Join (or start) a network and run GRPO rounds until stopped (SIGINT/SIGTERM stop it cleanly).

    Given only --bootstrap (no --config, --run-id, --mode, --defense, --max-rounds or --set of a run key), the
    node learns the run from its bootstrap peers, as `dgrpo node join` does.

    Examples:
    dgrpo node run --state-dir runs/a --solo --max-rounds 20
    dgrpo node run --state-dir runs/b --bootstrap /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW...
    dgrpo node run -c node.toml --defense logit,length -s learner.lr=1e-4
    dgrpo node run --state-dir runs/a --resume
    """
    import json as _json

    from dgrpo.daemon.join import overrides_run
    from dgrpo.daemon.launch import run_daemon
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
        if adversary not in ADVERSARIES and not any(c in adversary for c in ".:"):  # a dotted path: user code
            raise ConfigError(f"unknown adversary {adversary!r}; valid: {ADVERSARY_NAMES}")
        local.append(f"adversary.name={_json.dumps(adversary)}")
    if solo:
        local.append("rounds.min_peers=0")
    if slow is not None:
        local.append(f"rounds.slowdown={slow}")
    if tensorboard is not None:
        local.append(f"logging.tensorboard={_json.dumps(str(tensorboard))}")
    sets = list(local)
    if run_id is not None:
        sets.append(f"run_id={_json.dumps(run_id)}")
    if max_rounds is not None:
        sets.append(f"rounds.max_rounds={max_rounds}")
    if mode is not None:
        from dgrpo.daemon.settings import LEGACY_MODES, MODES

        if mode not in MODES and mode not in LEGACY_MODES:
            raise ConfigError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
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
    daemon_logging()  # first: what follows goes to the log, in its format (--log-format json: JSON lines only)
    if saved is not None:
        log.info("resuming with the settings saved in %s (flags given override them)", saved)
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
    this node cannot).

    Example:
    dgrpo node join /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW... --state-dir runs/joined
    """
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
    from dgrpo.daemon.join import fetch_run_manifest, join_settings
    from dgrpo.daemon.launch import run_daemon
    from dgrpo.daemon.run_manifest import joining

    learnt = fetch_run_manifest(addrs, state_dir, manifest_sha256)
    signed = learnt.manifest
    m = signed.manifest
    settings = join_settings(signed, addrs, sets)
    daemon_logging()  # first: what follows goes to the log, in its format (--log-format json: JSON lines only)
    log.info(
        "run %r by %s: model %s, task %s, manifest sha256 %s",
        m.run_id, m.creator_peer_id, m.model_id, m.config["task"]["name"], signed.sha256,
    )  # fmt: skip
    with joining(signed, learnt.refused):
        run_daemon(settings, resume=resume, allow_fresh=allow_fresh)


@command(node_app, "host")
def node_host(
    plan: Annotated[Path, typer.Argument(help="JSON plan of the nodes to host (dgrpo.daemon.light)")],
) -> None:
    """Run several nodes in this one process (light peers, for testnets at scale: `dgrpo testnet up
    --per-process K` writes the plans). Each node has its own key, libp2p host, model, state directory, status
    server and node.log; SIGINT/SIGTERM stop them all cleanly.

    Example (the plans `dgrpo testnet up --per-process 25 --out runs/testnet` writes):
    dgrpo node host runs/testnet/host-0.json
    """
    from dgrpo.daemon.light import HostPlan, run_host

    if not plan.is_file():
        raise ConfigError(f"plan {str(plan)!r} not found")
    daemon_logging()
    raise typer.Exit(run_host(HostPlan.load(plan)))
