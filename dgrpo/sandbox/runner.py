"""Inside the sandbox: a fork server that runs a batch of untrusted programs one after another, each in
namespaces of its own. Standard library only: the parent copies this file and :mod:`program` (the program
process's half) into the sandbox, where they run under the sandbox's interpreter (which need not be the
node's).

For each program of the batch (``dgrpo.sandbox`` explains where the runner itself lives)::

    runner    reads the batch, then for each program forks
     keeper   new mount, PID, network, IPC and UTS namespaces; enforces the wall limit and writes the
              program's record. Never runs untrusted code.
      program pid 1 of its PID namespace (:mod:`program`): confines itself, runs the program, writes the
              completion secret only after a complete run; when it exits the kernel kills all it started.

Channels. The batch arrives on fd 0 as one frame; each program's record leaves on fd 1 as one frame, written
by its keeper. The program process holds neither (its fds are 0/1/2, memfds of its own, and 3, the pipe on
which its setup and harness report to the keeper). Keeper and runner live in an outer PID namespace the
program cannot see, and are not dumpable.

``mode=direct`` (the operator's explicit weak sandbox, no bwrap): the same processes, started on the host;
the keeper enters what namespaces it can (as root; or through a user namespace), the program works in a fresh
host folder, and the audit hook also refuses what those missing namespaces would have contained.

Formats: the batch is ``marshal`` (it comes from the trusted parent); records are JSON (the parent parses
them with a parser that is safe on any input), output bytes carried as latin-1 text. ``_signal`` rather than
``signal`` and ``try``/``except``/``pass`` rather than ``contextlib.suppress`` save imports (``noqa: SIM105``).
"""

from __future__ import annotations

import _signal
import json
import marshal
import os
import struct
import sys
import time

# The program process's half sits beside this file: in the node a package module, in the sandbox a file.
try:
    from dgrpo.sandbox import program
except ImportError:  # inside the sandbox (or the weak direct mode): the two files side by side
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import program  # type: ignore[no-redef]

    del sys.path[0]

# Typing helpers only for the type checker (importing ``typing`` costs a few ms per batch).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

# Linux <sched.h>, <sys/prctl.h> (os.unshare only exists from 3.12 on).
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
FRAME = struct.Struct(">Q")
EXIT_SETUP = program.EXIT_SETUP
_libc_call = program._libc_call


# ---------------------------------------------------------------------------------------------- framing
def read_frame(fd: int) -> bytes | None:
    """One length-prefixed frame from ``fd``, or None at a clean end of stream."""
    head = _read_exactly(fd, FRAME.size)
    if head is None:
        return None
    body = _read_exactly(fd, FRAME.unpack(head)[0])
    if body is None:
        raise EOFError("truncated frame")
    return body


def write_frame(fd: int, payload: bytes) -> None:
    data = memoryview(FRAME.pack(len(payload)) + payload)
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            if left == size and size:
                return None
            raise EOFError("truncated frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------------------------------------- keeper
def _enter_namespaces(mode: str) -> dict[str, bool]:
    """The keeper's new namespaces (the PID namespace applies to the program it forks next)."""
    full = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    if mode == "bwrap":
        _libc_call("unshare", full)  # no fallback: a sandbox that cannot isolate a program must not run it
        return dict.fromkeys(("mount_namespace", "pid_namespace", "net_namespace", "ipc_namespace"), True)
    flags = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
    got = {"mount_namespace": False, "pid_namespace": True, "net_namespace": True, "ipc_namespace": True}
    try:
        _libc_call("unshare", flags)
        return got
    except OSError:
        pass
    uid, gid = os.getuid(), os.getgid()
    try:
        _libc_call("unshare", CLONE_NEWUSER | flags)
    except OSError:
        return dict.fromkeys(got, False)
    for path, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{path}", "w", encoding="ascii") as fh:
            fh.write(text)
    return got


def _pids_events(path: str) -> int:
    """How often a fork was refused because the batch's pids cgroup was full (0 without one)."""
    if not path:
        return 0
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                key, _, count = line.partition(" ")
                if key == "max":
                    return int(count)
    except (OSError, ValueError):
        pass
    return 0


def _wait_for_exit(child: int, wall_seconds: float) -> bool:
    """Wait until ``child`` exits (left unreaped) or the wall limit passes; kill it then. True on timeout.

    SIGCHLD is blocked before the fork, so ``sigtimedwait`` cannot miss the exit and no timer signal can race
    with reaping: the child is only killed while it is certainly still unreaped, so its pid cannot be reused.
    """
    deadline = time.monotonic() + wall_seconds
    while True:
        if os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            os.kill(child, _signal.SIGKILL)
            return True
        _signal.sigtimedwait({_signal.SIGCHLD}, remaining)


def _reap_leftovers() -> None:
    """Kill and reap what the program left behind (needed only without a PID namespace)."""
    deadline = time.monotonic() + 2.0
    me = os.getpid()
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        try:
            with open(f"/proc/{me}/task/{me}/children", encoding="ascii") as fh:
                adopted = [int(p) for p in fh.read().split()]
        except OSError:
            adopted = []
        for orphan in adopted:
            try:  # noqa: SIM105
                os.kill(orphan, _signal.SIGKILL)
            except ProcessLookupError:
                pass
        _signal.sigtimedwait({_signal.SIGCHLD}, 0.05)


def _memfd(name: str, content: bytes = b"") -> int:
    fd = os.memfd_create(name, 0)
    if content:
        os.write(fd, content)
        os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _captured(fd: int, cap: int) -> tuple[bytes, int]:
    size = os.fstat(fd).st_size
    return os.pread(fd, min(size, cap), 0), size


def _drain(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        if sum(map(len, chunks)) > 1 << 16:
            break
    return b"".join(chunks)


def _keeper(config: dict[str, Any], index: int, job: tuple[str, str], secret: bytes, out_fd: int) -> NoReturn:
    """Run one program in new namespaces and write its record to ``out_fd``. Always ends the process."""
    started = time.monotonic()
    record: dict[str, Any] = {"index": index}
    try:
        _libc_call("prctl", PR_SET_PDEATHSIG, _signal.SIGKILL, 0, 0, 0)  # die with the runner
        mode = config["mode"]
        mechanisms = _enter_namespaces(mode)
        workdir = ""
        if not mechanisms["mount_namespace"]:
            workdir = os.path.join(config["workdir"], f"run-{index}")
            os.mkdir(workdir, 0o700)
        source, stdin = job
        fds = (
            _memfd("stdin", stdin.encode("utf-8", "replace")),
            _memfd("stdout"),
            _memfd("stderr"),
        )
        marker_read, marker_write = os.pipe()
        os.set_blocking(marker_read, False)
        events_before = _pids_events(config["pids_events"])
        mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGCHLD})
        child = os.fork()
        if child == 0:
            os.close(marker_read)
            program.run(config, source, secret, (*fds, marker_write), mask, mechanisms, workdir)
        try:  # noqa: SIM105
            os.setpgid(child, child)  # also done by the child: whichever runs first wins the race
        except OSError:
            pass
        os.close(marker_write)
        timed_out = _wait_for_exit(child, float(config["limits"]["wall_seconds"]))
        try:  # noqa: SIM105
            os.killpg(child, _signal.SIGKILL)  # still unreaped, so the group id cannot have been reused
        except ProcessLookupError:
            pass
        _, status, usage = os.wait4(child, 0)
        if not mechanisms["pid_namespace"]:
            _reap_leftovers()
        report = _drain(marker_read)
        setup, _, rest = report.partition(b"\n")
        cap = int(config["limits"]["max_output_bytes"])
        stdout, stdout_size = _captured(fds[1], cap)
        stderr, stderr_size = _captured(fds[2], cap)
        record.update(
            exit=os.waitstatus_to_exitcode(status),
            timed_out=timed_out,
            cpu=usage.ru_utime + usage.ru_stime,
            max_rss_kib=usage.ru_maxrss,
            events=_pids_events(config["pids_events"]) - events_before,
            setup=setup.startswith(b"setup "),
            completed=setup.startswith(b"setup ") and rest == secret,
            mechanisms={**mechanisms, **_parse_setup(setup)},
            stdout=stdout.decode("latin-1"),
            stdout_size=stdout_size,
            stderr=stderr.decode("latin-1"),
            stderr_size=stderr_size,
        )
        if workdir:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    except BaseException as exc:
        record = {"index": index, "error": f"sandbox keeper failed: {exc!r}"}
    record["wall"] = time.monotonic() - started
    try:
        write_frame(out_fd, json.dumps(record).encode())
    except BaseException:
        os._exit(EXIT_SETUP)
    os._exit(0)


def _parse_setup(line: bytes) -> dict[str, bool]:
    """``setup key=0|1 ...``, the program process's own account of its setup, written before it runs
    untrusted code."""
    out = {}
    for item in line.decode("ascii", "replace").split()[1:]:
        key, _, value = item.partition("=")
        out[key] = value == "1"
    return out


# ---------------------------------------------------------------------------------------------- runner
def main() -> int:
    _libc_call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
    frame = read_frame(0)
    if frame is None:
        return EXIT_SETUP
    config = marshal.loads(frame)
    os.close(0)
    if config["mode"] == "direct":
        _libc_call("prctl", PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for index, job in enumerate(config.pop("programs")):
        secret = os.urandom(16).hex().encode()
        keeper = os.fork()
        if keeper == 0:
            _keeper(config, index, job, secret, 1)
        _, status = os.waitpid(keeper, 0)
        if status != 0:
            error = {"index": index, "error": f"sandbox keeper exited with status {status}"}
            write_frame(1, json.dumps(error).encode())
    return 0


if __name__ == "__main__":
    os._exit(main())  # nothing to flush or finalise: skip interpreter teardown
