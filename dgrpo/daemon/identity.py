"""A node's identity and the ``--resume`` rule that never continues one node's state under another identity."""

from __future__ import annotations

import logging

from dgrpo.daemon.fresh import FreshStart
from dgrpo.daemon.local_state import SETTINGS_FILE
from dgrpo.daemon.settings import NodeSettings
from dgrpo.errors import ConfigError
from dgrpo.protocol.identity import Identity, IdentityError

log = logging.getLogger("dgrpo.daemon")


def load_identity(settings: NodeSettings) -> Identity:
    path = settings.key_path
    if path.exists():
        try:
            return Identity.load(path)
        except IdentityError as exc:  # a corrupt, unreadable or foreign file: say what to do about it
            raise ConfigError(
                f"{exc}; put the node's key back there, or start a new node with another --state-dir "
                "(or identity.key_path)"
            ) from None
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
    state; with ``allow_fresh``, :class:`~dgrpo.daemon.fresh.FreshStart` (a new node, the old state aside).
    Nor does it start a new node where there is nothing to resume (a mistyped or empty ``--state-dir``: no key,
    no checkpoint, no saved settings), which made a new identity and trained alone; ``allow_fresh`` does."""
    if not resume or settings.key_path.exists():
        return
    folder = settings.checkpoint_folder
    held = sorted(p.name for p in folder.glob("round-*.ckpt")) if folder.is_dir() else []
    held += [name for name in ("nonce.json", "replay.json") if (settings.state_dir / name).exists()]
    if not held and not allow_fresh and not (settings.state_dir / SETTINGS_FILE).exists():
        raise ConfigError(f"no node state in {settings.state_dir}; drop --resume to start a new node there")
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
