"""A daemon's run manifest (``docs/protocol.md``, "Run manifest"): which settings define the run, the manifest
a node holds, and the check that its own settings and base weights are the manifest's.

At start a daemon holds exactly one manifest, kept in ``<state_dir>/manifest.json``:

* joining (``dgrpo node join``, through :func:`joining`): the creator's manifest the bootstrap served, if this
  node's settings and freshly loaded weights are exactly the run's; otherwise the daemon refuses to start,
  naming every difference;
* a manifest already in the state folder (a joined node restarted, or this node's own from before): kept
  when it still describes this node's run; another creator's manifest that no longer does is an error (the
  state folder belongs to that run); this node's own is replaced (its operator changed the run);
* otherwise this node creates and signs one from its own settings (it is the creator of its run).

It serves the one it holds unchanged, so a joiner of a joiner gets the creator's signed bytes.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import json
import logging
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dgrpo.atomic import write_atomically
from dgrpo.daemon.settings import LEGACY_MODES, NodeSettings
from dgrpo.errors import ConfigError
from dgrpo.overrides import apply_overrides, explain_validation_error
from dgrpo.protocol.envelope import PROTOCOL_VERSION
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.manifest import (
    MANIFEST_VERSION,
    BaseWeights,
    ManifestVerdict,
    RunManifest,
    SignedManifest,
    canonical_json,
    check_signed,
    sign_manifest,
    verify_document,
)

log = logging.getLogger("dgrpo.daemon")

MANIFEST_FILE = "manifest.json"
# The run-defining settings: every node of a run must hold the same values. The rest is the node's own: its
# state folder, identity, network, status and checkpoints, how long it waits for peers, its threads, whether
# it attacks (research), which federated client it is, and its device.
RUN_SECTIONS = ("task", "model", "learner", "sampling", "rollout", "defense", "limits", "federated", "mode")
RUN_KEYS = {
    "rounds": ("deadline_seconds", "heartbeat_seconds", "max_rounds"),
    "federation": ("aggregator", "chunk_bytes"),
}
LOCAL_MODEL_KEYS = ("device",)

_JOINED: contextvars.ContextVar[SignedManifest | None] = contextvars.ContextVar("dgrpo_joined", default=None)
# What the bootstrap peers a node joined through served and it refused (peer id -> verdict): counted in /status
# from the start, as the manifest checks of running peers are.
_REFUSED: contextvars.ContextVar[Mapping[str, ManifestVerdict] | None] = contextvars.ContextVar(
    "dgrpo_refused", default=None
)


def run_config(settings: NodeSettings) -> dict[str, Any]:
    """The run-defining part of ``settings`` as JSON (what a manifest's ``config`` holds)."""
    dump = settings.model_dump(mode="json")
    out = {key: dump[key] for key in RUN_SECTIONS}
    out["model"] = {k: v for k, v in dump["model"].items() if k not in LOCAL_MODEL_KEYS}
    for section, keys in RUN_KEYS.items():
        out[section] = {k: dump[section][k] for k in keys}
    return out


def base_weights(learner: Any) -> BaseWeights:
    """The freshly built learner's weights: its digest (the ``weights`` of its round-1 rollouts) and dtype."""
    dtype = str(next(iter(learner.model.parameters())).dtype).removeprefix("torch.")
    return BaseWeights.model_validate({"sha256": learner.weights_digest(), "dtype": dtype})


def create_manifest(settings: NodeSettings, identity: Identity, base: BaseWeights) -> SignedManifest:
    manifest = RunManifest(
        v=MANIFEST_VERSION,
        protocol=PROTOCOL_VERSION,
        run_id=settings.run_id,
        creator=identity.public_bytes.hex(),
        model_id=settings.model.name,
        base_weights=base,
        config=run_config(settings),
    )
    return sign_manifest(identity, manifest)


def current_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A manifest's ``config`` in today's names, to compare with local settings: a manifest signed before the
    completion exchange's mode was renamed says ``"httt"``, which the settings read as ``"completions"``; the
    signed document itself is never changed (its SHA-256 names the run)."""
    out = dict(config)
    mode = out.get("mode")
    if isinstance(mode, str) and mode in LEGACY_MODES:
        out["mode"] = LEGACY_MODES[mode]
    return out


def differences(manifest: Any, local: Any, path: str = "") -> list[str]:
    """``key: manifest X, local Y`` for every leaf where the two JSON values differ."""
    if isinstance(manifest, dict) and isinstance(local, dict):
        out = []
        for key in sorted(set(manifest) | set(local)):
            sub = f"{path}.{key}" if path else key
            if key not in manifest or key not in local:
                out.append(f"{sub}: {'missing' if key not in manifest else 'set'} in the manifest")
            else:
                out += differences(manifest[key], local[key], sub)
        return out
    # canonical_json, not ==: 1 == 1.0 == True in Python, yet they are three different settings here
    if canonical_json(manifest) == canonical_json(local):
        return []
    return [f"{path}: manifest {json.dumps(manifest)}, local {json.dumps(local)}"]


def mismatches(manifest: RunManifest, settings: NodeSettings, base: BaseWeights) -> list[str]:
    """Everything that keeps this node from playing ``manifest``'s run; empty when it can."""
    out = []
    if manifest.run_id != settings.run_id:
        out.append(f"run id: manifest {manifest.run_id!r}, local {settings.run_id!r}")
    out += differences(current_config(manifest.config), run_config(settings))
    mine = manifest.base_weights
    if mine.dtype != base.dtype:
        out.append(
            f"base model dtype differs: manifest {mine.dtype}, local {base.dtype} (model.dtype "
            f"{settings.model.dtype!r} on device {settings.model.device!r}; the run's weights are {mine.dtype})"
        )
    elif mine.sha256 != base.sha256:
        out.append(f"base model weights differ: manifest sha256 {mine.sha256[:16]}…, local {base.sha256[:16]}…")
    return out


def settings_from_manifest(manifest: RunManifest, overrides: list[str]) -> NodeSettings:
    """A joiner's settings: the manifest's run, then ``overrides`` (``key=value``: state folder, listen
    address, status port, ...). An override of a run-defining key makes the node refuse to join at start."""
    data = copy.deepcopy(manifest.config)
    data["run_id"] = manifest.run_id
    try:
        return NodeSettings(**apply_overrides(data, overrides))
    except ValidationError as exc:
        raise explain_validation_error(exc, NodeSettings, "node setting") from None


@contextlib.contextmanager
def joining(manifest: SignedManifest, refused: Mapping[str, ManifestVerdict] | None = None) -> Iterator[None]:
    """Daemons constructed inside join ``manifest``'s run (or refuse to start); ``refused``: what bootstrap peers
    served that the joiner refused, by peer id."""
    token, refused_token = _JOINED.set(manifest), _REFUSED.set(dict(refused or {}))
    try:
        yield
    finally:
        _JOINED.reset(token)
        _REFUSED.reset(refused_token)


def refused_at_join() -> Mapping[str, ManifestVerdict]:
    return _REFUSED.get() or {}


def load_manifest(path: Path) -> SignedManifest | None:
    """The manifest saved in ``path`` (None: none saved); :class:`ConfigError` when it does not verify."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read the run manifest {path}: {exc}") from None
    try:  # saved indented for people to read; verified in its canonical form
        document = canonical_json(json.loads(text))
    except ValueError as exc:
        raise ConfigError(f"the run manifest {path} is not JSON ({exc}); remove it to start afresh") from None
    verdict = verify_document(document)
    if verdict.manifest is None:
        raise ConfigError(f"the run manifest {path} does not verify ({verdict}); remove it to start afresh")
    return verdict.manifest


def save_manifest(path: Path, signed: SignedManifest) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(signed.model_dump(mode="json"), indent=2, sort_keys=True).encode() + b"\n")


def hold_manifest(settings: NodeSettings, identity: Identity, base: BaseWeights) -> tuple[SignedManifest, str]:
    """The manifest this node holds and serves, and how it came by it (``joined``, ``created``, ``kept``);
    saved in the state folder. :class:`ConfigError` when the node cannot play the run it is bound to."""
    path = settings.state_dir / MANIFEST_FILE
    stored = load_manifest(path)
    joined = _JOINED.get()
    mine = identity.public_bytes.hex()
    if joined is not None:
        if stored is not None and stored.sha256 != joined.sha256:
            verdict = check_signed(joined, pinned=stored)
            raise ConfigError(
                f"cannot join: {path} pins run {stored.manifest.run_id!r} to manifest {stored.sha256[:16]}…, the "
                f"bootstrap serves {joined.sha256[:16]}… ({verdict.reason}); use another --state-dir"
            )
        problems = mismatches(joined.manifest, settings, base)
        if problems:
            raise ConfigError(f"cannot join run {joined.manifest.run_id!r}: " + "; ".join(problems))
        chosen, origin = joined, "joined"
    elif stored is not None and not mismatches(stored.manifest, settings, base):
        chosen, origin = stored, "kept"
    elif stored is not None and stored.manifest.creator != mine:
        differ = "; ".join(mismatches(stored.manifest, settings, base))
        raise ConfigError(
            f"{path} holds the manifest of run {stored.manifest.run_id!r} by {stored.manifest.creator_peer_id}, "
            f"which this node joined; its settings differ from it: {differ}. Rejoin with `dgrpo node join`, "
            f"or remove {path} to start a run of its own"
        )
    else:
        if stored is not None:
            log.warning(
                "the run's settings changed since %s was signed: a new manifest replaces it (peers holding the "
                "old one refuse the new as conflicting_manifest)",
                path,
            )
        chosen, origin = create_manifest(settings, identity, base), "created"
    if stored is None or stored.sha256 != chosen.sha256:
        save_manifest(path, chosen)
    return chosen, origin


def manifest_summary(signed: SignedManifest) -> Mapping[str, Any]:
    m = signed.manifest
    return {"run_id": m.run_id, "sha256": signed.sha256, "creator": m.creator_peer_id, "model": m.model_id}


def share_manifest(creator: Path, state: Path) -> None:
    """One run, one creator: node 0 signs the run's manifest, the others hold it (their settings are node 0's
    but for local keys), as joiners would, instead of each signing its own and seeing the others' as
    ``wrong_creator``. Not in a heterogeneous testnet: its nodes run different models, each its own run manifest."""
    state.mkdir(parents=True, exist_ok=True)
    if not (state / MANIFEST_FILE).exists() and (creator / MANIFEST_FILE).exists():
        shutil.copyfile(creator / MANIFEST_FILE, state / MANIFEST_FILE)
