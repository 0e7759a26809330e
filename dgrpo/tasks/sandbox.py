"""A subprocess sandbox for untrusted Python programs (code rewards run completions written by peers).

Each run gets a fresh temporary working directory (removed afterwards), a scrubbed environment and a new
session, and starts ``python -S -s -P -B`` on :mod:`dgrpo.tasks.sandbox_runner`, which confines itself before
it runs the program. Mechanisms, and what they need:

==========================  ======================================================  ===========================
mechanism                   what it does                                            needs
==========================  ======================================================  ===========================
rlimits                     CPU seconds, address space (memory), file size (so a    nothing
                            flood of output stops at ``max_file_bytes``), process
                            count, no core dumps
wall-clock limit            the supervisor SIGKILLs the program after               nothing
                            ``wall_seconds``; if the supervisor itself does not
                            report within a further second, the parent kills it
                            and the program's process group
pids cgroup                 a per-run cgroup with ``pids.max``: bounds processes    root (a writable cgroup v1
                            and threads (RLIMIT_NPROC does not bind root) and       pids hierarchy, or a
                            lets the parent kill every leftover                     delegated cgroup v2 subtree)
PID namespace               the program is pid 1 of its own namespace: it cannot    root, or an unprivileged
                            signal host processes, and when it exits the kernel     user namespace
                            kills and reaps everything it started
network namespace           no interfaces but a down loopback: no network at all    root, or an unprivileged
                                                                                    user namespace
audit hook                  refuses socket creation and connects (defence in        nothing
                            depth); without a network namespace also refuses
                            exec/spawn and ctypes, which would bypass it; when
                            nothing bounds processes (root without the pids
                            cgroup) also refuses fork: no fork bomb can then
                            exhaust the host's pids
isolated interpreter        ``-S -s -P``: no site-packages, no user site, no        nothing
                            script directory on ``sys.path``; only the stdlib and
                            ``extra_paths`` are importable
==========================  ======================================================  ===========================

The interpreter is not started with ``-I``/``-E``: the environment is built here from scratch, so honouring it
costs nothing, and it is how ``PYTHONHASHSEED=0`` makes programs deterministic.

Process accounting: RLIMIT_NPROC counts all processes of the user, and the kernel exempts root from it. As
root the pids cgroup is the bound; unprivileged, RLIMIT_NPROC is (so a program may fail to fork when the
user already runs many processes).

This contains accidents and hostile resource use (loops, fork bombs, memory, output floods, network). It is
not a boundary against a deliberate escape by code running as root: a root program can still read and write
the host's files (keys included) and its cgroup settings. Run nodes that score code completions as an
unprivileged user (the namespaces then come from a user namespace where the kernel allows one) or inside a
container.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from dgrpo.errors import ConfigError
from dgrpo.tasks import sandbox_runner
from dgrpo.tasks.sandbox_runner import EXIT_CPU, EXIT_MEMORY, EXIT_PROCESSES, EXIT_SETUP, parse_pairs

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB
RUNNER = Path(sandbox_runner.__file__).resolve()
PYTHON_FLAGS = ("-S", "-s", "-P", "-B")
BACKSTOP_SECONDS = 1.0  # extra wall time before the parent kills a supervisor that failed to report
STATUS_LIMIT = 1 << 20
MIN_MEMORY_BYTES = 64 * MiB  # below this the interpreter itself cannot start: every run would fail


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. ``max_processes`` counts the program's processes and threads, itself included."""

    cpu_seconds: float = 2.0
    wall_seconds: float = 5.0
    memory_bytes: int = 512 * MiB
    max_processes: int = 16
    max_output_bytes: int = 64 * KiB
    max_file_bytes: int = 1 * MiB

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigError(f"sandbox {name} must be a finite number, got {value!r}")
            if value <= 0:
                raise ConfigError(f"sandbox {name} must be positive, got {value!r}")
        for name in ("memory_bytes", "max_processes", "max_output_bytes", "max_file_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"sandbox {name} must be a positive integer, got {value!r}")
        if self.memory_bytes < MIN_MEMORY_BYTES:
            raise ConfigError(f"sandbox memory_bytes must be at least {MIN_MEMORY_BYTES} (the interpreter's own)")
        if self.max_output_bytes > self.max_file_bytes:
            raise ConfigError("sandbox max_output_bytes cannot exceed max_file_bytes (output goes to files)")


@dataclass(frozen=True)
class SandboxResult:
    """How a program ended. ``ok``: exit code 0 and no limit hit. ``limit`` names the limit that was hit
    (``wall``, ``cpu``, ``memory``, ``processes``, ``output``), or ``setup`` when the sandbox itself failed."""

    ok: bool
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    limit: str | None
    wall_seconds: float


class _PidsCgroup:
    """A per-run pids cgroup (v1 ``pids`` hierarchy or a cgroup v2 subtree with the pids controller)."""

    _parent: Path | None = None
    _probed = False
    _lock = threading.Lock()

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def parent_dir(cls) -> Path | None:
        """Where per-run cgroups can be created, or None; probed once per process."""
        with cls._lock:
            if not cls._probed:
                cls._parent = next((c for c in _cgroup_candidates() if _usable_cgroup_parent(c)), None)
                cls._probed = True
            return cls._parent

    @classmethod
    def create(cls, max_pids: int) -> _PidsCgroup | None:
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

    def limit_events(self) -> int:
        """How often a fork was refused because the group was full."""
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / "pids.events").read_text().splitlines():
                key, _, count = line.partition(" ")
                if key == "max":
                    return int(count)
        return 0

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


def _cgroup_candidates() -> Iterator[Path]:
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


def _usable_cgroup_parent(parent: Path) -> bool:
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


@dataclass
class _Outcome:
    """What the parent learned from one run: the result plus the supervisor's report of its mechanisms."""

    result: SandboxResult
    mechanisms: dict[str, bool]


class Sandbox:
    """Runs untrusted Python source under :class:`SandboxLimits`. ``run`` never raises for program faults."""

    def __init__(self, limits: SandboxLimits | None = None, extra_paths: Sequence[Path] = ()) -> None:
        self.limits = limits or SandboxLimits()
        self.extra_paths = [Path(p).resolve() for p in extra_paths]
        for path in self.extra_paths:
            if not path.is_dir():
                raise ConfigError(f"sandbox extra path {path} is not a directory")

    def run(self, source: str, stdin: str = "") -> SandboxResult:
        """Run ``source`` as ``__main__`` with ``stdin`` on standard input."""
        return self._run(source, stdin).result

    def run_many(self, sources: Sequence[str], max_workers: int | None = None) -> list[SandboxResult]:
        """Run several programs concurrently; results in the order of ``sources``."""
        if max_workers is not None and max_workers < 1:
            raise ConfigError(f"max_workers must be at least 1, got {max_workers}")
        if not sources:
            return []
        workers = max_workers or min(len(sources), os.cpu_count() or 1)
        if workers == 1:
            return [self.run(s) for s in sources]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
            return list(pool.map(self.run, sources))

    def capabilities(self) -> dict[str, bool | str]:
        """Which isolation mechanisms are active here (probed by running a trivial program)."""
        outcome = self._run("pass", "")
        cgroup = _PidsCgroup.parent_dir()
        caps: dict[str, bool | str] = {
            "rlimits": True,
            "wall_limit": True,
            "fresh_tempdir": True,
            "scrubbed_env": True,
            "isolated_interpreter": True,
            "audit_hook": True,
            "pids_cgroup": False,
            "pid_namespace": False,
            "net_namespace": False,
            "user_namespace": False,
            "rlimit_nproc_enforced": os.geteuid() != 0,  # the kernel exempts root from RLIMIT_NPROC
            "runs_as_root": os.geteuid() == 0,
            "cgroup_dir": str(cgroup) if cgroup else "",
            "probe_ok": outcome.result.ok,
        }
        caps.update(outcome.mechanisms)
        # Without a bound on processes the program may not fork at all (see sandbox_runner.FORK_EVENTS).
        caps["processes_bounded"] = bool(caps["pids_cgroup"]) or not caps["runs_as_root"]
        return caps

    def _run(self, source: str, stdin: str) -> _Outcome:
        started = time.monotonic()
        try:
            return self._run_in_tempdir(source, stdin, started)
        except Exception as exc:  # the environment failed (no temp dir, no interpreter): a verdict, logged
            log.exception("sandbox: run failed")
            return _Outcome(_setup_failure(f"sandbox failed: {exc!r}", started), {})

    def _run_in_tempdir(self, source: str, stdin: str, started: float) -> _Outcome:
        with tempfile.TemporaryDirectory(prefix="dgrpo-sandbox-", ignore_cleanup_errors=True) as tmp:
            work = Path(tmp)
            # Hostile text may hold lone surrogates: replace rather than fail to encode.
            (work / "solution.py").write_bytes(source.encode("utf-8", "replace"))
            cgroup = _PidsCgroup.create(self.limits.max_processes + 1)  # +1: the supervisor
            try:
                return self._spawn(work, stdin, cgroup, started)
            finally:
                if cgroup is not None:
                    cgroup.destroy()

    def _spawn(self, work: Path, stdin: str, cgroup: _PidsCgroup | None, started: float) -> _Outcome:
        limits = self.limits
        with contextlib.ExitStack() as stack:
            # The parent keeps these open and reads them through its own descriptors: the program may replace
            # the names in its directory (say, by a symlink to a secret file) but not what the parent reads.
            out = stack.enter_context(open(work / "stdout", "w+b"))
            err = stack.enter_context(open(work / "stderr", "w+b"))
            stdin_file: IO[bytes] | int = subprocess.DEVNULL
            if stdin:
                (work / "stdin").write_bytes(stdin.encode("utf-8", "replace"))
                stdin_file = stack.enter_context(open(work / "stdin", "rb"))
            read_fd, write_fd = os.pipe()
            stack.callback(_close_quietly, read_fd)
            go_read, go_write = os.pipe()
            stack.callback(_close_quietly, go_write)
            args = [
                f"source_path={work / 'solution.py'}",
                *(f"extra_path={p}" for p in self.extra_paths),
                f"cpu_seconds={limits.cpu_seconds}",
                f"wall_seconds={limits.wall_seconds}",
                f"memory_bytes={limits.memory_bytes}",
                f"file_bytes={limits.max_file_bytes}",
                f"max_processes={limits.max_processes}",
                f"cgroup={int(cgroup is not None)}",
                f"status_fd={write_fd}",
                f"go_fd={go_read}",
            ]
            env = {
                "PATH": "/usr/bin:/bin",
                "HOME": str(work),
                "TMPDIR": str(work),  # the program's temporary files go where cleanup reaches them
                "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONHASHSEED": "0",
            }
            try:
                proc = subprocess.Popen(
                    [sys.executable, *PYTHON_FLAGS, str(RUNNER), *args],
                    stdin=stdin_file,
                    stdout=out,
                    stderr=err,
                    cwd=work,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(write_fd, go_read),
                )
            finally:
                os.close(write_fd)  # only the supervisor may hold the write end: EOF means it is done
                os.close(go_read)
            try:
                # Moving a process between cgroups waits for an RCU grace period (~10 ms here): doing it from
                # the parent overlaps that wait with the interpreter's start-up instead of adding to it.
                if cgroup is not None:
                    cgroup.procs.write_text(str(proc.pid))
                os.write(go_write, b"1")
                status, backstop = _read_status(read_fd, limits.wall_seconds + BACKSTOP_SECONDS)
            except BaseException:
                _finish(proc, kill=True)  # never leave a running supervisor behind
                raise
            _finish(proc, kill=backstop)
            if backstop and status and "child" in status:
                # The supervisor did not finish: kill the program's group too. Its members keep the group id
                # reserved, so this cannot hit another process group (only an empty group could be reused).
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.killpg(int(status["child"][0]), signal.SIGKILL)
            events = cgroup.limit_events() if cgroup else 0
            stdout, stdout_size = _read_capped(out, limits.max_output_bytes)
            stderr, stderr_size = _read_capped(err, limits.max_output_bytes)
        wall = time.monotonic() - started
        if backstop or not status:
            return _Outcome(
                SandboxResult(False, -signal.SIGKILL, stdout, stderr, True, "wall", wall)
                if backstop
                else _setup_failure("sandbox supervisor sent no status", started, stderr),
                {},
            )
        if "error" in status:
            return _Outcome(_setup_failure(status["error"][0], started, stderr), {})
        try:
            returncode = int(status["exit"][0])
            timed_out = status["timed_out"][0] == "1"
            cpu = float(status["cpu_seconds"][0])
        except (KeyError, ValueError):
            return _Outcome(_setup_failure("sandbox supervisor sent a malformed status", started, stderr), {})
        output_bytes = max(stdout_size, stderr_size)
        limit = _classify(limits, returncode, timed_out, cpu, events, output_bytes)
        ok = returncode == 0 and limit is None
        mechanisms = {
            key.removeprefix("mechanism."): values[0] == "1"
            for key, values in status.items()
            if key.startswith("mechanism.")
        }
        return _Outcome(SandboxResult(ok, returncode, stdout, stderr, timed_out, limit, wall), mechanisms)


def _classify(
    limits: SandboxLimits, returncode: int, timed_out: bool, cpu: float, events: int, output_bytes: int
) -> str | None:
    """The limit a run hit, by the most trustworthy evidence first (supervisor and kernel, then exit codes)."""
    if timed_out:
        return "wall"
    if returncode in (-signal.SIGXCPU, EXIT_CPU) or (
        returncode == -signal.SIGKILL and cpu >= math.ceil(limits.cpu_seconds)
    ):
        return "cpu"
    if returncode == EXIT_MEMORY:
        return "memory"
    if events > 0 or returncode == EXIT_PROCESSES:
        return "processes"
    if output_bytes > limits.max_output_bytes:
        return "output"
    if returncode == EXIT_SETUP:
        return "setup"
    return None


def _setup_failure(message: str, started: float, stderr: str = "") -> SandboxResult:
    log.warning("sandbox: %s", message)
    text = f"{message}\n{stderr}" if stderr else message
    return SandboxResult(False, -1, "", text, False, "setup", time.monotonic() - started)


def _read_status(fd: int, timeout: float) -> tuple[dict[str, list[str]] | None, bool]:
    """Read the supervisor's ``key=value`` report until EOF. Returns (report or None, whether the deadline passed)."""
    deadline = time.monotonic() + timeout
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    chunks: list[bytes] = []
    size = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return _parse_status(chunks), True
        if not poller.poll(max(1, math.ceil(remaining * 1000))):
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        size += len(chunk)
        if size > STATUS_LIMIT:
            return None, False
        chunks.append(chunk)
    return _parse_status(chunks), False


def _parse_status(chunks: list[bytes]) -> dict[str, list[str]]:
    return parse_pairs(b"".join(chunks).decode("utf-8", errors="replace").splitlines())


def _finish(proc: subprocess.Popen[bytes], kill: bool) -> None:
    """Reap the supervisor; with ``kill``, first SIGKILL its whole session (it is still unreaped, so the
    process group id cannot have been reused)."""
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    _, status = os.waitpid(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)


def _read_capped(fh: IO[bytes], cap: int) -> tuple[str, int]:
    size = os.fstat(fh.fileno()).st_size
    fh.seek(0)
    return fh.read(cap).decode("utf-8", errors="replace"), size


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
