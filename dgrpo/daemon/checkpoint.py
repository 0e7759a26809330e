"""Atomic, hash-checked checkpoints of a node: model, optimizer, round, own nonce and replay state.

A checkpoint is one file ``round-<NNNNNNNN>.ckpt``: a 64-byte ASCII SHA-256 of the payload, a newline, then
the payload (``torch.save`` of a dict of tensors and plain values, read back with ``weights_only=True``). It is
written to a temporary file, fsynced, renamed into place and the folder fsynced, so a crash leaves either
the old set of checkpoints or the new one, never a torn file under a checkpoint name. ``load_latest`` walks
from the newest checkpoint back and skips any whose hash does not match (a corrupted disk, a truncated copy).
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dgrpo.atomic import write_atomically

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^round-(\d{8})\.ckpt$")


@dataclass
class CheckpointState:
    """What a node needs to continue: training state plus the protocol state that must never go back."""

    round: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    nonce: int
    replay: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


class CheckpointManager:
    def __init__(self, folder: Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.folder = folder
        self.keep = keep
        folder.mkdir(parents=True, exist_ok=True)

    def path_for(self, round_idx: int) -> Path:
        return self.folder / f"round-{round_idx:08d}.ckpt"

    def checkpoints(self) -> list[Path]:
        """Checkpoint files, newest round first."""
        found = [p for p in self.folder.iterdir() if NAME_RE.match(p.name)]
        return sorted(found, key=lambda p: p.name, reverse=True)

    def save(self, state: CheckpointState) -> Path:
        buffer = io.BytesIO()
        torch.save(
            {
                "round": state.round,
                "model": {k: v.detach().cpu() for k, v in state.model.items()},
                "optimizer": state.optimizer,
                "nonce": state.nonce,
                "replay": state.replay,
                "meta": state.meta,
            },
            buffer,
        )
        payload = buffer.getvalue()
        digest = hashlib.sha256(payload).hexdigest().encode()
        path = self.path_for(state.round)
        write_atomically(path, digest + b"\n" + payload)
        for old in self.checkpoints()[self.keep :]:
            old.unlink(missing_ok=True)
        return path

    @staticmethod
    def read(path: Path) -> CheckpointState | None:
        """The checkpoint in ``path``, or None (logged) when it is unreadable or its hash does not match."""
        try:
            raw = path.read_bytes()
            digest, sep, payload = raw.partition(b"\n")
            if not sep or hashlib.sha256(payload).hexdigest().encode() != digest:
                log.warning("checkpoint %s is corrupted (hash mismatch); skipping it", path)
                return None
            data = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
            return CheckpointState(
                round=int(data["round"]),
                model=data["model"],
                optimizer=data["optimizer"],
                nonce=int(data["nonce"]),
                replay=data["replay"],
                meta=data.get("meta", {}),
            )
        except Exception as exc:  # a bad file must not stop a node from resuming from an older one
            log.warning("checkpoint %s is unreadable (%s); skipping it", path, exc)
            return None

    def load_latest(self) -> CheckpointState | None:
        for path in self.checkpoints():
            state = self.read(path)
            if state is not None:
                log.info("resuming from %s (round %d)", path, state.round)
                return state
        return None
