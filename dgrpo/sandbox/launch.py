"""Starting the runner for one batch: inside bwrap (the sandbox), or directly on the host (the operator's
explicit, weaker choice). Either way the runner is placed in the batch's pids cgroup before it can fork."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from dgrpo.sandbox import bwrap, seccomp
from dgrpo.sandbox.cgroup import PidsCgroup
from dgrpo.sandbox.interpreter import Interpreter

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "runner.py"
# The runner and what it imports from its own folder (standard library only), copied into every sandbox.
HARNESS = ("runner.py", "confine.py", "frames.py", "function.py", "plain.py", "program.py")
PYTHON_FLAGS = ("-S", "-s", "-P", "-B")
INFO_TIMEOUT = 30.0  # bwrap reports the sandbox's pid within milliseconds; a stuck start-up is a failure
MAX_SITE_BYTES = 4 << 20  # the site folders are copied into every sandbox


class LaunchError(Exception):
    """The sandbox could not be started (the batch's programs then fail with ``limit='setup'``)."""


@dataclass
class Started:
    """A running runner: the process, the pipe its records arrive on, and what the batch config must say."""

    proc: subprocess.Popen[bytes]
    records: int  # read end of the runner's record pipe
    config: dict[str, object] = field(default_factory=dict)
    cleanup: list[Path] = field(default_factory=list)


class Launcher(ABC):
    name: str
    nproc_base: int  # the sandbox user's own processes RLIMIT_NPROC must leave room for
    overhead_pids: int  # processes of the batch's cgroup that are not the program's

    @abstractmethod
    def start(self, extra_paths: Sequence[Path], cgroup: PidsCgroup | None, stderr: IO[bytes], jobs_fd: int) -> Started:
        """Start the runner, holding ``jobs_fd`` (the batch's texts, same number inside); it waits for its
        batch's index on stdin."""

    @abstractmethod
    def describe(self) -> dict[str, object]:
        """What this launcher isolates with, for ``Sandbox.capabilities``."""


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)  # inheritable: bwrap reads it (--ro-bind-data)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def site_files(extra_paths: Sequence[Path]) -> list[tuple[bytes, str]]:
    """(content, path inside) of every file under the extra paths, as copied into the sandbox."""
    out: list[tuple[bytes, str]] = []
    total = 0
    for i, root in enumerate(extra_paths):
        for path in sorted(root.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            data = path.read_bytes()
            total += len(data)
            if total > MAX_SITE_BYTES:
                raise LaunchError(f"sandbox site folders exceed {MAX_SITE_BYTES} bytes")
            out.append((data, f"{bwrap.SITE}/{i}/{path.relative_to(root)}"))
    return out


def _read_info(fd: int, proc: subprocess.Popen[bytes]) -> int:
    """bwrap's --info-fd JSON (written once the sandbox exists, then closed): the sandbox's host pid."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    chunks: list[bytes] = []
    while True:
        if not poller.poll(int(INFO_TIMEOUT * 1000)):
            raise LaunchError("bwrap did not report the sandbox's pid")
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    try:
        return int(json.loads(b"".join(chunks))["child-pid"])
    except (ValueError, KeyError, TypeError) as exc:
        raise LaunchError(f"bwrap failed to start the sandbox (exit {proc.poll()})") from exc


@dataclass(frozen=True)
class BwrapLauncher(Launcher):
    """The sandbox: bwrap run as ``uid``/``gid`` (None: as this process's own user)."""

    bwrap_path: str
    interpreter: Interpreter
    uid: int | None
    gid: int | None
    name = "bwrap"
    nproc_base = 3  # bwrap's init, the runner, the keeper
    overhead_pids = 4  # those and bwrap's monitor outside

    def start(self, extra_paths: Sequence[Path], cgroup: PidsCgroup | None, stderr: IO[bytes], jobs_fd: int) -> Started:
        files = site_files(extra_paths)
        harness = [(_memfd(name, (HERE / name).read_bytes()), f"{bwrap.INNER}/{name}") for name in HARNESS]
        site = [(_memfd("site", d), inner) for d, inner in files]
        filter_fd = _memfd("seccomp", seccomp.sandbox_filter())
        data_fds = [fd for fd, _ in (*harness, *site)] + [filter_fd]
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        records_r, records_w = os.pipe()
        argv = bwrap.command(
            self.bwrap_path,
            self.interpreter,
            harness,
            site,
            filter_fd,
            str(cgroup.path) if cgroup else None,
            info_w,
            block_r,
        )
        root = self.uid is not None  # then bwrap runs as the sandbox user, with no supplementary groups
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=records_w,
                stderr=stderr,
                pass_fds=(*data_fds, info_w, block_r, jobs_fd),  # bwrap hands jobs_fd on to the runner
                cwd="/",
                env={},
                start_new_session=True,
                close_fds=True,
                user=self.uid,
                group=self.gid,
                extra_groups=[] if root else None,
            )
        except BaseException:
            for fd in (records_r, info_r, block_w):
                os.close(fd)
            raise
        finally:
            for fd in (*data_fds, info_w, block_r, records_w):
                os.close(fd)
        try:
            child = _read_info(info_r, proc)
            if cgroup is not None:
                cgroup.add(proc.pid)  # bwrap's monitor, then the sandbox's init: still blocked, nothing forked
                cgroup.add(child)
            os.write(block_w, b"1")
        except BaseException:
            os.close(records_r)
            _kill(proc)
            raise
        finally:
            os.close(info_r)
            os.close(block_w)
        config: dict[str, object] = {
            "mode": "bwrap",
            "paths": [f"{bwrap.SITE}/{i}" for i in range(len(extra_paths))],
            "pids_events": f"{bwrap.PIDS}/pids.events" if cgroup else "",
            "seccomp": seccomp.program_filter(),
        }
        return Started(
            proc,
            records_r,
            config,
        )

    def describe(self) -> dict[str, object]:
        return {
            "isolation": "bwrap",
            "bwrap": self.bwrap_path,
            "bwrap_version": ".".join(map(str, bwrap.bwrap_version(self.bwrap_path) or ())),
            "sandbox_seccomp": True,
            "python": self.interpreter.executable,
            "sandbox_uid": self.uid if self.uid is not None else os.getuid(),
            "user_namespace": True,
            "read_only_root": True,
        }


@dataclass(frozen=True)
class DirectLauncher(Launcher):
    """The weak sandbox: the runner on the host, under the node's own interpreter. No filesystem isolation;
    namespaces only where this process may create them."""

    name = "direct"
    nproc_base = 0
    overhead_pids = 2  # the runner and the keeper

    def start(self, extra_paths: Sequence[Path], cgroup: PidsCgroup | None, stderr: IO[bytes], jobs_fd: int) -> Started:
        workdir = Path(tempfile.mkdtemp(prefix="dgrpo-sandbox-"))
        records_r, records_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, *PYTHON_FLAGS, str(RUNNER)],
                stdin=subprocess.PIPE,
                stdout=records_w,
                stderr=stderr,
                cwd=workdir,
                env={"LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"},
                start_new_session=True,
                close_fds=True,
                pass_fds=(jobs_fd,),
            )
        except BaseException:
            os.close(records_r)
            raise
        finally:
            os.close(records_w)
        if cgroup is not None:
            try:
                cgroup.add(proc.pid)  # the runner forks nothing before it has read its batch
            except BaseException:
                os.close(records_r)
                _kill(proc)
                raise
        config: dict[str, object] = {
            "mode": "direct",
            "paths": [str(p) for p in extra_paths],
            "pids_events": str(cgroup.events) if cgroup else "",
            "workdir": str(workdir),
            "seccomp": seccomp.program_filter() if seccomp.available() is None else b"",
        }
        return Started(proc, records_r, config, cleanup=[workdir])

    def describe(self) -> dict[str, object]:
        return {"isolation": "direct (unsafe: no filesystem isolation)", "python": sys.executable}


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the runner's whole session and reap it (still unreaped: its group id cannot be reused)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
