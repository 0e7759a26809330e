"""Starting a daemon: the class for its mode, resumed or fresh (``--allow-fresh`` moves the old state aside,
:mod:`dgrpo.daemon.fresh`), and the ``node.json`` a running node writes for tools to find it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from dgrpo.daemon.completions import CompletionExchange
from dgrpo.daemon.daemon import Daemon
from dgrpo.daemon.exchange import Exchange
from dgrpo.daemon.federated import FederatedExchange
from dgrpo.daemon.fresh import FreshStart, move_aside
from dgrpo.daemon.settings import NodeSettings

EXCHANGES: dict[str, type[CompletionExchange] | type[FederatedExchange]] = {
    CompletionExchange.mode: CompletionExchange,
    FederatedExchange.mode: FederatedExchange,
}


def exchange_for(settings: NodeSettings) -> type[Exchange]:
    """The exchange of the settings' ``mode`` (:mod:`dgrpo.daemon.exchange`)."""
    return EXCHANGES[settings.mode]


def open_daemon(settings: NodeSettings, resume: bool = False, allow_fresh: bool = False) -> Daemon:
    """The daemon of ``settings``, with its mode's exchange: resumed from its state (``resume``), or, with
    ``allow_fresh``, a new node where resuming is impossible (or always, without ``resume``), the old state moved
    aside (:mod:`dgrpo.daemon.fresh`)."""
    exchange = exchange_for(settings)
    if allow_fresh and not resume:
        move_aside(settings, "a fresh node was asked for")
        return Daemon(settings, exchange)
    try:
        return Daemon(settings, exchange, resume=resume, allow_fresh=allow_fresh)
    except FreshStart as why:
        move_aside(settings, str(why))
        return Daemon(settings, exchange)


def run_daemon(settings: NodeSettings, resume: bool = False, allow_fresh: bool = False) -> None:
    trio.run(open_daemon(settings, resume, allow_fresh).run)


def read_node_file(state_dir: Path) -> dict[str, Any] | None:
    path = state_dir / "node.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None
