"""What a node keeps so that ``dgrpo node run --state-dir DIR --resume`` needs no other flag.

* ``settings.json``: the node's settings as it last started (every key, JSON), written at each start. On
  ``--resume`` they are the lowest-precedence source: a TOML file, ``DGRPO_*`` variables and ``--set`` still
  override them (:func:`dgrpo.daemon.settings.load_node_settings`). Identity, run (with ``manifest.json``),
  listen address, bootstrap list and everything else thus come back as they were.
* ``peers.json``: the peers it knew (peer id -> the addresses it last announced in a signed heartbeat), the
  most recently heard first, at most :data:`MAX_SAVED_PEERS`; written with every checkpoint and at shutdown.
  After a restart they are dial candidates besides the bootstrap list (peer exchange, with its backoff and
  per-subnet bound): a node whose bootstrap peers are gone still finds the network it was in.

Both are read as untrusted input (a hand-edited or truncated file): what does not parse is ignored with a
warning, never a crash.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dgrpo.atomic import write_atomically

log = logging.getLogger("dgrpo.daemon")

SETTINGS_FILE = "settings.json"
PEERS_FILE = "peers.json"
MAX_SAVED_PEERS = 64
MAX_ADDRS_PER_PEER = 8  # as many as a heartbeat announces


def save_settings(state_dir: Path, dump: Mapping[str, Any]) -> None:
    write_atomically(state_dir / SETTINGS_FILE, json.dumps(dump, indent=2, sort_keys=True).encode() + b"\n")


def saved_settings(state_dir: Path) -> Path | None:
    """The settings file of ``state_dir`` when there is one."""
    path = state_dir / SETTINGS_FILE
    return path if path.is_file() else None


def save_peers(state_dir: Path, peers: Iterable[tuple[str, float, Sequence[str]]]) -> None:
    """``peers``: (peer id, last heard, announced addresses); the newest :data:`MAX_SAVED_PEERS` are kept."""
    newest = sorted(peers, key=lambda p: -p[1])[:MAX_SAVED_PEERS]
    table = {peer: list(addrs)[:MAX_ADDRS_PER_PEER] for peer, _, addrs in newest if addrs}
    write_atomically(state_dir / PEERS_FILE, json.dumps(table, indent=2).encode() + b"\n")


def load_peers(state_dir: Path) -> dict[str, tuple[str, ...]]:
    """The saved peer table; empty (with a warning) when the file is missing or not one."""
    path = state_dir / PEERS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return {}
    if not isinstance(data, dict):
        log.warning("ignoring %s: not a JSON object", path)
        return {}
    out: dict[str, tuple[str, ...]] = {}
    for peer, addrs in list(data.items())[:MAX_SAVED_PEERS]:
        if isinstance(addrs, list) and all(isinstance(a, str) and a.endswith(f"/p2p/{peer}") for a in addrs):
            out[peer] = tuple(addrs[:MAX_ADDRS_PER_PEER])
    return out
