"""Reading a node's ``node.json``: what a running daemon writes in its state dir for tools to find it (its peer id,
listen addresses and status URL; :meth:`dgrpo.daemon.daemon.Daemon.write_node_file`).

Apart from the daemon on purpose: ``dgrpo status`` and the testnet tools read it, and importing the daemon would
cost them torch and libp2p (seconds) for one small JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

NODE_FILE = "node.json"


def read_node_file(state_dir: Path) -> dict[str, Any] | None:
    """The node's ``node.json`` in ``state_dir``, or None where there is none or it cannot be read (a node that
    never started there, or one writing it this very moment)."""
    try:
        data = json.loads((state_dir / NODE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
