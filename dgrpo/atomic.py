"""Crash-safe file writes, shared by checkpoints, keys, nonce and replay state."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

# What write_atomically leaves behind when the process dies between mkstemp and the rename: ".<name>.<8
# random characters>.tmp" (tempfile's names draw from [a-z0-9_]).
ORPHAN_RE = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")


def write_atomically(path: Path, data: bytes, *, overwrite: bool = True, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new one, never a mix.

    The temp file is created in the same folder (rename is atomic only within a file system), fsynced,
    then renamed over ``path`` (``overwrite``) or hard-linked to it (fails with :class:`FileExistsError`
    if ``path`` exists, without a race between the check and the write). The folder is fsynced so the
    rename itself survives a power loss.
    """
    path = Path(path)
    folder = path.parent
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, mode)  # before any secret is written: mkstemp already uses 0600, this is for other modes
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp_name, path)
        else:
            os.link(tmp_name, path)
            os.unlink(tmp_name)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_folder(folder)


def remove_orphans(folder: Path) -> list[Path]:
    """Remove the temporary files an interrupted :func:`write_atomically` left in ``folder`` (a SIGKILL during
    a checkpoint write), logging each; returns them. Only the process that owns ``folder`` may call this, at
    start, before it writes anything there: another writer's temp file in progress looks the same."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for path in sorted(folder.iterdir()):
            if ORPHAN_RE.match(path.name) and path.is_file():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed.append(path)
                    log.warning("removed %s, left by an interrupted write", path)
    return removed


def _fsync_folder(folder: Path) -> None:
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders; the rename is still atomic there
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
