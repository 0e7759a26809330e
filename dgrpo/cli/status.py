"""``dgrpo status``: a node's status, from its status URL or its state dir, running or stopped.

It answers in well under a second: this module and what it imports hold no torch, libp2p or daemon (the daemon's
import alone takes seconds), and tests/test_cli_status.py checks that. A state dir whose node is not running is
read from the ``status.json`` the daemon writes when it stops, so a stopped node is shown like a running one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from dgrpo.cli.common import app, command, console
from dgrpo.cli.status_table import blacklisted, short_id, stage_rejections, status_table
from dgrpo.daemon.node_file import NODE_FILE, read_node_file
from dgrpo.errors import ConfigError

FETCH_TIMEOUT = 2.0  # seconds: a local status server answers in milliseconds; one that does not is not running
STATUS_FILE = "status.json"  # what the daemon writes on shutdown (dgrpo.daemon.daemon.Daemon._shutdown)


@dataclass(frozen=True)
class Found:
    """A node's status, and, when it was read from ``status.json`` rather than asked of the node, why and when."""

    status: dict[str, Any]
    saved: str | None = None  # the line that says the node is not running and when status.json was written


def fetch(url: str) -> dict[str, Any]:
    """``url``'s ``/status``; OSError (unreachable, refused, timed out) or ValueError (not JSON) where it fails."""
    import urllib.request  # here, not above: only this path needs http.client and its imports

    with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=FETCH_TIMEOUT) as resp:
        data = json.loads(resp.read())
    if not isinstance(data, dict):
        raise ValueError(f"{url}/status is not a JSON object")
    return data


def _saved(state_dir: Path, why: str, fix: str) -> Found:
    """The node's saved ``status.json``, shown because of ``why``; without one, an error naming ``why`` and ``fix``."""
    path = state_dir / STATUS_FILE
    try:
        mtime = path.stat().st_mtime
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{state_dir}: {why}, and there is no {STATUS_FILE} (a node writes it when it stops cleanly); "
            f"{fix}, or give a running node's status URL"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} cannot be read ({exc}); give the node's status URL instead") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a node's status (not a JSON object); give the node's status URL instead")
    when = datetime.fromtimestamp(mtime).astimezone().isoformat(timespec="seconds")
    state = data.get("state", "unknown")
    line = f"node not running ({why}): its state is {state!r}, as saved in {path} at {when}"
    return Found(data, f"{line} ({_ago(time.time() - mtime)} ago)")


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def find_status(target: str) -> Found:
    """The status of the node at ``target``: a status URL (which must answer), or a state dir: its running node
    asked at the URL in its ``node.json``, else (not running, or no status server) its saved ``status.json``."""
    if target.startswith(("http://", "https://")):
        try:
            return Found(fetch(target))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot reach {target}: {exc}; is the node running, its status server on?") from None
    state_dir = Path(target)
    if not state_dir.is_dir():
        raise ConfigError(f"{target} is neither a status URL (http://host:port) nor a folder (a node's --state-dir)")
    info = read_node_file(state_dir)
    if info is None:
        start = f"start a node with `dgrpo node run --state-dir {state_dir}`"
        return _saved(state_dir, f"no {NODE_FILE}: no node has started here", start)
    again = f"start it again with `dgrpo node run --state-dir {state_dir} --resume`"  # it resumes its state
    url = info.get("status_url")
    if not url:
        return _saved(state_dir, f"its {NODE_FILE} names no status URL (its status server is off)", again)
    try:
        st = fetch(str(url))
    except (OSError, ValueError) as exc:
        return _saved(state_dir, f"{url} does not answer: {getattr(exc, 'reason', exc)}", again)  # URLError's why
    # A stopped node's port may since serve another node: that one's status is not this node's.
    if info.get("peer_id") and st.get("peer_id") != info["peer_id"]:
        return _saved(state_dir, f"{url} now serves another node ({short_id(str(st.get('peer_id')))})", again)
    return Found(st)


def print_details(st: dict[str, Any]) -> None:
    """Below the table: the network's view, the run's manifest, every rejection reason by stage, the last errors."""
    net = st.get("network") or {}
    if net:
        console.print(f"reachability: {net['reachability']['status']}  observed: {net['observed_addrs']}")
        console.print(f"announced: {st['listen_addrs']}")
        if net["relays"]:
            console.print(f"relay slots on: {net['relays']}")
        if net.get("relay_service"):
            console.print(
                f"relay service: {net['relay_service_reservations']} slots held by others, "
                f"{net['relay_service_circuits']} circuits open, {net.get('relay_service_bytes', 0)} bytes forwarded"
            )
        punched = set(net.get("hole_punched") or ())
        for peer, kind in net["connections"].items():
            console.print(f"  {peer}  {kind}{'  (hole punched)' if peer in punched else ''}")
    manifest = st.get("manifest") or {}
    if manifest:
        refused = manifest.get("rejected_by_peer") or {}
        console.print(
            f"run {manifest['run_id']!r} manifest {manifest['sha256'][:16]}… by {manifest['creator']} "
            f"({manifest['origin']}); refused: {refused or 'none'}"
        )
    for stage, reasons in stage_rejections(st).items():
        console.print(f"rejected at {stage}: {'no defense chain' if reasons is None else reasons or 'none'}")
    console.print(f"blacklisted: {blacklisted(st) or 'none'}")
    for err in (st.get("last_errors") or [])[-5:]:
        console.print(f"[yellow]{escape(str(err))}[/]")


@command(app)
def status(
    target: Annotated[
        str, typer.Argument(help="status URL (http://127.0.0.1:8780) or a node's state dir (running or stopped)")
    ] = "http://127.0.0.1:8780",
    as_json: Annotated[bool, typer.Option("--json", help="print the raw JSON")] = False,
) -> None:
    """Show a node's status: asked of the running node, or, for a state dir whose node has stopped, as it saved it.

    Examples:
    dgrpo status
    dgrpo status runs/testnet/node-0
    dgrpo status http://127.0.0.1:8781 --json
    """
    found = find_status(target)
    if as_json:  # only the JSON on stdout, for programs: a stopped node's says so in its "state"
        console.print_json(data=found.status)
        return
    if found.saved:
        console.print(f"[bold]{escape(found.saved)}[/]")
    console.print(status_table([found.status], ["node"]))
    print_details(found.status)
