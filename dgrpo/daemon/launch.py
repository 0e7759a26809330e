"""Starting a daemon: the class for its mode, resumed or fresh (``--allow-fresh`` moves the old state aside,
:mod:`dgrpo.daemon.fresh`), and the ``node.json`` a running node writes for tools to find it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from dgrpo.daemon.daemon import Daemon
from dgrpo.daemon.federated import FederatedDaemon
from dgrpo.daemon.fresh import FreshStart, move_aside
from dgrpo.daemon.settings import NodeSettings


def open_daemon(settings: NodeSettings, resume: bool = False, allow_fresh: bool = False) -> Daemon:
    """The daemon of ``settings``: resumed from its state (``resume``), or, with ``allow_fresh``, a new node
    where resuming is impossible (or always, without ``resume``), the old state moved aside
    (:mod:`dgrpo.daemon.fresh`)."""
    cls: type[Daemon] = FederatedDaemon if settings.mode == "federated" else Daemon
    if allow_fresh and not resume:
        move_aside(settings, "a fresh node was asked for")
        return cls(settings)
    try:
        return cls(settings, resume=resume, allow_fresh=allow_fresh)
    except FreshStart as why:
        move_aside(settings, str(why))
        return cls(settings)


def run_daemon(settings: NodeSettings, resume: bool = False, allow_fresh: bool = False) -> None:
    trio.run(open_daemon(settings, resume, allow_fresh).run)


def read_node_file(state_dir: Path) -> dict[str, Any] | None:
    path = state_dir / "node.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None
