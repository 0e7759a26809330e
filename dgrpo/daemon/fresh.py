"""``--allow-fresh``: a really fresh node, with the old one's state moved aside, never deleted.

A fresh node has a new identity and none of the old node's checkpoints, nonces, replay window, reputation,
blacklist, round log or known peers: continuing any of them under a new identity would hand one node's
training and protocol state to another (``dgrpo.daemon.identity.check_resume``), and keeping them under the
old identity would not be fresh. Before, ``--allow-fresh`` made a new key but resumed the old checkpoint,
replay state and blacklist when the key was gone, and left corrupt checkpoints in place, so the next
``--resume`` refused again.

What moves: the state folder, whole, to ``<state_dir>.aside-<UTC time>`` beside it (a rename: same file
system, nothing copied), and the identity key and checkpoint folder where they are configured outside it. What
stays: the run manifest (``manifest.json``: it names the run, not the node; a copy is put back) and the
node's local settings (``settings.json``, rewritten at start).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from dgrpo.daemon.settings import NodeSettings
from dgrpo.errors import DgrpoError

log = logging.getLogger("dgrpo.daemon")

KEPT = ("manifest.json",)  # put back into the fresh state folder


class FreshStart(DgrpoError):
    """Resuming is impossible and ``--allow-fresh`` was given: start a fresh node (the message says why)."""


def holds_state(settings: NodeSettings) -> list[str]:
    """What of a node's state exists (names, for messages); empty for a node that never ran."""
    held = [p.name for p in (settings.state_dir.iterdir() if settings.state_dir.is_dir() else []) if p.name not in KEPT]
    folder = settings.checkpoint_folder
    if folder.is_dir() and not folder.is_relative_to(settings.state_dir):
        held += [p.name for p in folder.iterdir()]
    if settings.key_path.exists() and not settings.key_path.is_relative_to(settings.state_dir):
        held.append(settings.key_path.name)
    return sorted(held)


def _aside(path: Path, stamp: str) -> Path:
    target = path.with_name(f"{path.name}.aside-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.aside-{stamp}-{n}")
    path.rename(target)
    return target


def move_aside(settings: NodeSettings, why: str) -> Path | None:
    """Move the node's state aside (see the module docstring); returns where the state folder went, None when
    there was nothing to move."""
    if not holds_state(settings):
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    state = settings.state_dir
    moved: Path | None = None
    if state.is_dir():
        moved = _aside(state, stamp)
        state.mkdir(parents=True)
        for name in KEPT:
            if (moved / name).is_file():
                shutil.copy2(moved / name, state / name)
    folder = settings.checkpoint_folder
    if folder.is_dir() and not folder.is_relative_to(state):
        _aside(folder, stamp)
    key = settings.key_path
    if key.exists() and not key.is_relative_to(state):
        _aside(key, stamp)
    log.warning("--allow-fresh: %s; the old node's state is in %s; starting a new node", why, moved or state)
    return moved
