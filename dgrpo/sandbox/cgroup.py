"""A per-batch pids cgroup, created and owned outside the sandbox (inside, it is visible read-only).

It bounds the processes and threads of a batch (RLIMIT_NPROC does not bind root, so in the weak direct mode as
root it is the only bound) and lets the parent kill every leftover. It needs root: a writable cgroup v1 pids
hierarchy, or a delegated cgroup v2 subtree with the pids controller. Without one the bwrap sandbox still
bounds processes with RLIMIT_NPROC, which binds its unprivileged user.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


class PidsCgroup:
    """One pids cgroup (v1 ``pids`` hierarchy or a cgroup v2 subtree with the pids controller)."""

    _parent: Path | None = None
    _probed = False
    _lock = threading.Lock()

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def parent_dir(cls) -> Path | None:
        """Where per-batch cgroups can be created, or None; probed once per process."""
        with cls._lock:
            if not cls._probed:
                cls._parent = next((c for c in _candidates() if _usable_parent(c)), None)
                cls._probed = True
            return cls._parent

    @classmethod
    def create(cls, max_pids: int) -> PidsCgroup | None:
        parent = cls.parent_dir()
        if parent is None:
            return None
        path = parent / f"dgrpo-sandbox-{uuid.uuid4().hex}"
        try:
            path.mkdir()
        except OSError as exc:
            log.warning("sandbox: cannot create pids cgroup %s: %s", path, exc)
            return None
        group = cls(path)
        try:
            (path / "pids.max").write_text(str(max_pids))
        except OSError:
            group.destroy()
            raise
        return group

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    @property
    def events(self) -> Path:
        return self.path / "pids.events"

    def add(self, pid: int) -> None:
        """Move ``pid`` into the group (its later children are born there)."""
        self.procs.write_text(str(pid))

    def members(self) -> list[int]:
        with contextlib.suppress(OSError, ValueError):
            return [int(p) for p in self.procs.read_text().split()]
        return []

    def destroy(self) -> None:
        """Kill every process still in the group, then remove it (the kernel refuses while it is populated)."""
        deadline = time.monotonic() + 2.0
        while True:
            members = self.members()
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    log.error("sandbox: cannot remove cgroup %s (%s); members %s", self.path, exc, members)
                    return
            time.sleep(0.002)  # killed processes take a moment to leave the group


def _candidates() -> Iterator[Path]:
    """Directories under which this process may create a pids cgroup: its own v1 pids cgroup, then v2."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return
    v1_mount = v2_mount = None
    for line in mounts:
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup" and "pids" in fields[3].split(","):
            v1_mount = fields[1]
        elif len(fields) >= 3 and fields[2] == "cgroup2" and v2_mount is None:
            v2_mount = fields[1]
    for line in own:
        hierarchy, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if v1_mount and "pids" in controllers.split(","):
            yield Path(v1_mount) / rel.lstrip("/")
        elif v2_mount and hierarchy == "0" and not controllers:
            yield Path(v2_mount) / rel.lstrip("/")


def _usable_parent(parent: Path) -> bool:
    probe = parent / f"dgrpo-sandbox-probe-{uuid.uuid4().hex}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        return (probe / "pids.max").exists()
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
