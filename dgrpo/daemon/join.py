"""``dgrpo node join <multiaddr>``: learn the run from a bootstrap node, then run a daemon of it.

The joiner fetches the manifest the bootstrap serves, checks it (signature, schema, and against the manifest
its state folder already pins, or a ``--manifest-sha256`` given out of band), builds its settings from it
(the bootstrap address and its own local overrides added) and starts the daemon, which refuses when its
freshly loaded base weights are not the manifest's (:func:`dgrpo.daemon.run_manifest.hold_manifest`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import trio

from dgrpo.daemon.manifest_exchange import fetch_from_address, split_p2p_address
from dgrpo.daemon.run_manifest import MANIFEST_FILE, differences, load_manifest, run_config, settings_from_manifest
from dgrpo.daemon.settings import NodeSettings
from dgrpo.errors import ConfigError
from dgrpo.protocol.manifest import HEX_SHA256, SignedManifest

DEFAULT_STATE_DIR = Path("dgrpo-state")  # NodeSettings' default


def fetch_run_manifest(addr: str, state_dir: Path, sha256: str | None = None, timeout: float = 30.0) -> SignedManifest:
    """The bootstrap's manifest, verified; :class:`ConfigError` naming why it was refused."""
    if not split_p2p_address(addr):
        raise ConfigError(f"bootstrap {addr!r} is not a multiaddr ending in /p2p/<peer id>")
    if sha256 is not None and not _is_sha256(sha256):
        raise ConfigError(f"--manifest-sha256 {sha256!r} is not 64 hexadecimal digits")
    pinned = load_manifest(state_dir / MANIFEST_FILE)
    verdict = trio.run(lambda: fetch_from_address(addr, sha256=sha256, pinned=pinned, timeout=timeout))
    if verdict.manifest is None:
        raise ConfigError(f"cannot join through {addr}: its run manifest was refused ({verdict})")
    return verdict.manifest


def _is_sha256(text: str) -> bool:
    return re.fullmatch(HEX_SHA256, text.lower()) is not None


def join_settings(manifest: SignedManifest, addr: str, overrides: list[str]) -> NodeSettings:
    """The manifest's run with ``addr`` as bootstrap and ``overrides`` (local keys) on top; an override of a
    run-defining key is an error here already, before the model is loaded."""
    settings = settings_from_manifest(manifest.manifest, [f"network.bootstrap={json.dumps([addr])}", *overrides])
    problems = differences(manifest.manifest.config, run_config(settings))
    if problems:
        raise ConfigError(
            f"cannot join run {manifest.manifest.run_id!r}: an override changes the run's settings: "
            + "; ".join(problems)
        )
    return settings
