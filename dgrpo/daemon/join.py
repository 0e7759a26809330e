"""``dgrpo node join <multiaddr>...`` (and ``node run --bootstrap`` with no run flags): learn the run from the
network, then run a daemon of it.

The joiner asks every bootstrap address it was given for the manifest it serves (concurrently, each bounded),
checks each (signature, schema, and against the manifest its state folder already pins, or a
``--manifest-sha256`` given out of band), and takes the run only when the valid answers agree: one hostile
bootstrap among honest ones cannot hand it another run; when they disagree and nothing pins the run, it
refuses, naming which address serves what. It then builds its settings from the manifest (the bootstrap list
and its own local overrides added) and starts the daemon, which refuses when its freshly loaded base weights
are not the manifest's (:func:`dgrpo.daemon.run_manifest.hold_manifest`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from dgrpo.daemon.manifest_exchange import fetch_from_address, split_p2p_address
from dgrpo.daemon.run_manifest import (
    MANIFEST_FILE,
    RUN_KEYS,
    RUN_SECTIONS,
    current_config,
    differences,
    load_manifest,
    run_config,
    settings_from_manifest,
)
from dgrpo.daemon.settings import NodeSettings
from dgrpo.errors import ConfigError
from dgrpo.protocol.manifest import HEX_SHA256, ManifestVerdict, SignedManifest

log = logging.getLogger("dgrpo.daemon")

DEFAULT_STATE_DIR = Path("dgrpo-state")  # NodeSettings' default
# Keys of the run (RUN_SECTIONS, RUN_KEYS) plus the run id: an override of one of them on `node run` means the
# operator configures the run out of band, so the node does not learn it from its bootstrap.
RUN_ID_KEYS = ("run_id",)


@dataclass(frozen=True)
class Answer:
    addr: str
    verdict: ManifestVerdict


@dataclass(frozen=True)
class Learnt:
    """The run's manifest, and what the bootstrap peers that served another one were refused for (peer id ->
    verdict; not those that could not answer)."""

    manifest: SignedManifest
    refused: dict[str, ManifestVerdict]


def fetch_run_manifest(
    addrs: str | Sequence[str], state_dir: Path, sha256: str | None = None, timeout: float = 30.0
) -> Learnt:
    """The run's manifest as the bootstrap addresses serve it, verified; :class:`ConfigError` naming why
    it was refused (every address's verdict) or which addresses disagree."""
    addrs = [addrs] if isinstance(addrs, str) else list(addrs)
    if not addrs:
        raise ConfigError("no bootstrap address to learn the run from")
    for addr in addrs:
        if not split_p2p_address(addr):
            raise ConfigError(f"bootstrap {addr!r} is not a multiaddr ending in /p2p/<peer id>")
    if sha256 is not None and not _is_sha256(sha256):
        raise ConfigError(f"--manifest-sha256 {sha256!r} is not 64 hexadecimal digits")
    pinned = load_manifest(state_dir / MANIFEST_FILE)
    answers = trio.run(_ask_all, addrs, sha256, pinned, timeout)
    refused = {
        split_p2p_address(a.addr): a.verdict
        for a in answers
        if a.verdict.manifest is None and a.verdict.reason not in ("unavailable", "timeout")
    }
    return Learnt(choose(answers), refused)


async def _ask_all(addrs: list[str], sha256: str | None, pinned: SignedManifest | None, timeout: float) -> list[Answer]:
    out: dict[str, ManifestVerdict] = {}

    async def ask(addr: str) -> None:
        out[addr] = await fetch_from_address(addr, sha256=sha256, pinned=pinned, timeout=timeout)

    async with trio.open_nursery() as nursery:
        for addr in dict.fromkeys(addrs):
            nursery.start_soon(ask, addr)
    return [Answer(addr, out[addr]) for addr in dict.fromkeys(addrs)]


def choose(answers: Sequence[Answer]) -> SignedManifest:
    """The manifest every valid answer agrees on. A verdict already applied any pin (state folder, sha256),
    so a pinned joiner's valid answers are the pinned manifest; addresses that served another are logged."""
    valid = {a.addr: a.verdict.manifest for a in answers if a.verdict.manifest is not None}
    refused = [a for a in answers if a.verdict.manifest is None]
    for a in refused:
        log.warning("bootstrap %s: run manifest refused (%s)", a.addr, a.verdict)
    if not valid:
        why = "; ".join(f"{a.addr}: {a.verdict}" for a in answers)
        raise ConfigError(f"cannot join: no bootstrap served an acceptable run manifest ({why})")
    names = {m.sha256 for m in valid.values()}
    if len(names) > 1:
        served = "; ".join(
            f"{addr} serves {m.sha256[:16]}… (run {m.manifest.run_id!r} by {m.manifest.creator_peer_id})"
            for addr, m in valid.items()
        )
        raise ConfigError(
            f"cannot join: the bootstrap addresses serve different run manifests ({served}); one of them is not "
            "the run you meant: pass --manifest-sha256 with the run creator's manifest name to choose"
        )
    return next(iter(valid.values()))


def _is_sha256(text: str) -> bool:
    return re.fullmatch(HEX_SHA256, text.lower()) is not None


def join_settings(manifest: SignedManifest, addrs: str | Sequence[str], overrides: list[str]) -> NodeSettings:
    """The manifest's run with ``addrs`` as bootstrap list and ``overrides`` (local keys) on top; an override of
    a run-defining key is an error here already, before the model is loaded."""
    addrs = [addrs] if isinstance(addrs, str) else list(addrs)
    settings = settings_from_manifest(manifest.manifest, [f"network.bootstrap={json.dumps(addrs)}", *overrides])
    problems = differences(current_config(manifest.manifest.config), run_config(settings))
    if problems:
        raise ConfigError(
            f"cannot join run {manifest.manifest.run_id!r}: an override changes the run's settings: "
            + "; ".join(problems)
        )
    return settings


def overrides_run(overrides: Sequence[str]) -> list[str]:
    """The ``key=value`` overrides that set a run-defining key (run id, or a key of the manifest's config)."""
    out = []
    for item in overrides:
        key = item.partition("=")[0].strip()
        head, _, rest = key.partition(".")
        sub = rest.partition(".")[0]
        if key in RUN_ID_KEYS or head in RUN_SECTIONS or (head in RUN_KEYS and (not sub or sub in RUN_KEYS[head])):
            out.append(key)
    return out
