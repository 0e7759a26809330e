"""A node's identity and the ``--resume`` rule that never continues one node's state under another identity."""

from __future__ import annotations

import logging

from dgrpo.daemon.fresh import FreshStart
from dgrpo.daemon.settings import NodeSettings
from dgrpo.errors import ConfigError
from dgrpo.protocol.identity import Identity

log = logging.getLogger("dgrpo.daemon")


def load_identity(settings: NodeSettings) -> Identity:
    path = settings.key_path
    if path.exists():
        return Identity.load(path)
    if not settings.identity.create:
        raise ConfigError(f"identity key {path} does not exist; create one with `dgrpo keygen {path}`")
    path.parent.mkdir(parents=True, exist_ok=True)
    identity = Identity.generate()
    identity.save(path)
    log.info("created identity %s in %s", identity.peer_id, path)
    return identity


def check_resume(settings: NodeSettings, resume: bool, allow_fresh: bool = False) -> None:
    """``--resume`` never continues one node's state under another identity: refuse (a clear error, exit
    status 2) when the identity key is gone but the state folder holds a node's checkpoints or protocol
    state; with ``allow_fresh``, :class:`~dgrpo.daemon.fresh.FreshStart` (a new node, the old state aside)."""
    if not resume or settings.key_path.exists():
        return
    folder = settings.checkpoint_folder
    held = sorted(p.name for p in folder.glob("round-*.ckpt")) if folder.is_dir() else []
    held += [name for name in ("nonce.json", "replay.json") if (settings.state_dir / name).exists()]
    if not held:
        return
    if allow_fresh:
        raise FreshStart(f"the identity key {settings.key_path} is missing")
    raise ConfigError(
        f"--resume: the identity key {settings.key_path} is missing, but {settings.state_dir} holds a node's "
        f"state ({', '.join(held)}); continuing it under a new identity would hand one node's training and "
        "protocol state to another. Restore the key, or pass --allow-fresh to start a new node (the old state "
        "is moved aside)"
    )
