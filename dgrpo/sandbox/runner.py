"""Inside the sandbox: a fork server that runs a batch of jobs one after another, each in namespaces of its
own. Standard library only: the parent copies this file and the harness beside it (:mod:`confine`,
:mod:`program`, :mod:`function`, :mod:`plain`, :mod:`frames`) into the sandbox, where they run under the
sandbox's interpreter (which need not be the node's).

For each job of the batch (``dgrpo.sandbox`` explains where the runner itself lives)::

    runner      reads the batch's index, then for each job forks
     keeper     a new IPC namespace (the batch shares bwrap's empty network namespace); enforces the wall
                limit and writes the job's record. Never runs code it was given, never reads a job's texts.
      program   a program job: pid 1 of a PID namespace of its own (:mod:`program`): confines itself and
                runs the program; when it exits the kernel kills all it started.
      tests     a function job: the tests' process (:mod:`function`), trusted code; forked before the
                keeper makes the PID namespace below, so the candidate cannot see it
      candidate a function job: pid 1 of a PID namespace of its own, runs the solution and answers calls

Channels. The batch's index arrives on fd 0 as one frame (per job its kind and the spans of its texts); the
texts are in a sealed memfd (``jobs_fd``) that the runner and the keepers never read: each process reads its
own spans and closes it before running code (:func:`dgrpo.sandbox.batch.pack_jobs` says why). Each job's
record leaves on fd 1 as one frame, written by its keeper. No process that runs given code holds either: a
program or candidate holds its stdin, stdout and stderr (memfds of its own) and, for a candidate, its ends of
the call pipes; the tests' process also holds its report pipe, on which it writes the verdict. Keeper and
runner live in an outer PID namespace the program and the candidate cannot see, and are not dumpable.

What the keeper records is what it observes itself: exit statuses and resource use (``wait4``), whether the
wall limit passed, the pids cgroup's refusals, the captured output, and for a function job the tests'
process's verdict. No secret, key or flag that a program could read or write decides a result.

``mode=direct`` (the operator's explicit weak sandbox, no bwrap): the same processes, started on the host;
the keeper enters what namespaces it can (as root; or through a user namespace), each process works in a
fresh host folder, and the audit hook also refuses what those missing namespaces would have contained.

Formats: the index is ``marshal`` (it comes from the trusted parent); records are JSON (the parent parses
them with a parser that is safe on any input), output bytes carried as latin-1 text. ``_signal`` rather than
``signal`` and ``try``/``except``/``pass`` rather than ``contextlib.suppress`` save imports (``noqa: SIM105``).
"""

from __future__ import annotations

import _signal
import gc
import json
import marshal
import os
import sys
import time

# The harness sits beside this file: in the node package modules, in the sandbox files.
try:
    from dgrpo.sandbox import confine, frames, function, program
except ImportError:  # inside the sandbox (or the weak direct mode): the files side by side
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import confine  # type: ignore[no-redef]
    import frames  # type: ignore[no-redef]
    import function  # type: ignore[no-redef]
    import program  # type: ignore[no-redef]

    del sys.path[0]

# Typing helpers only for the type checker (importing ``typing`` costs a few ms per batch).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

# Linux <sched.h>, <sys/prctl.h> (os.unshare only exists from 3.12 on).
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
FRAME = frames.FRAME
EXIT_SETUP = confine.EXIT_SETUP
_libc_call = confine.libc_call
read_frame, write_frame = frames.read_frame, frames.write_frame


# ---------------------------------------------------------------------------------------------- keeper
def _enter_namespaces(mode: str, pid: bool) -> dict[str, bool]:
    """The keeper's new namespaces; with ``pid`` also a PID namespace for the process it forks next. In the
    sandbox each process it forks then takes a mount namespace of its own (:func:`confine.confine`).

    In the sandbox a job gets a new IPC namespace (SysV objects outlive their processes) but shares the
    sandbox's network namespace, made by bwrap for the batch: it has no interface but a loopback that is
    down, the seccomp filter refuses every socket family but AF_UNIX, and an abstract AF_UNIX socket dies
    with the last process holding it, which is before the next job starts (a job's PID namespace is emptied
    when its first process is reaped). A network namespace per job cost 1.5 ms and isolated nothing more.
    In the weak direct mode (the host's network otherwise) every job gets its own network namespace."""
    if mode == "bwrap":
        _libc_call("unshare", CLONE_NEWIPC | (CLONE_NEWPID if pid else 0))  # no fallback
        return dict.fromkeys(("mount_namespace", "pid_namespace", "net_namespace", "ipc_namespace"), True)
    flags = CLONE_NEWNET | CLONE_NEWIPC | (CLONE_NEWPID if pid else 0)
    got = {"mount_namespace": False, "pid_namespace": pid, "net_namespace": True, "ipc_namespace": True}
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


def _new_pid_namespace(mode: str) -> bool:
    """A PID namespace for the process forked next (a function job's candidate); False where the weak direct
    mode may not make one."""
    try:
        _libc_call("unshare", CLONE_NEWPID)
    except OSError:
        if mode == "bwrap":
            raise
        return False
    return True


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


def _exited(pid: int) -> bool:
    """Whether ``pid`` (a child, unreaped) has exited; it stays unreaped."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


class _Child:
    """One process a keeper forks: its stdin, stdout and stderr memfds, its report pipe and its pid."""

    def __init__(self) -> None:
        self.fds = (_memfd("stdin"), _memfd("stdout"), _memfd("stderr"))
        self.report_r, self.report_w = os.pipe()
        os.set_blocking(self.report_r, False)
        self.pid = 0

    def start(self, target: Any, extra_fds: tuple[int, ...] = ()) -> None:
        """Fork; the child calls ``target(fds)`` (which never returns) with its fds 0, 1, 2, 3, ..."""
        pid = os.fork()
        if pid == 0:
            os.close(self.report_r)
            target((*self.fds, self.report_w, *extra_fds))
            os._exit(EXIT_SETUP)  # a target always ends the process; never reached
        try:  # noqa: SIM105
            os.setpgid(pid, pid)  # also done by the child: whichever runs first wins the race
        except OSError:
            pass
        os.close(self.report_w)
        self.pid = pid

    def finish(self, cap: int) -> dict[str, Any]:
        """Kill what is left of its process group, reap it, and read what it left: exit status, resource
        use, its report (the setup line, then whatever it wrote after) and its output."""
        try:  # noqa: SIM105
            os.killpg(self.pid, _signal.SIGKILL)  # still unreaped, so the group id cannot have been reused
        except ProcessLookupError:
            pass
        _, status, usage = os.wait4(self.pid, 0)
        setup, _, rest = _drain(self.report_r).partition(b"\n")
        stdout, stdout_size = _captured(self.fds[1], cap)
        stderr, stderr_size = _captured(self.fds[2], cap)
        return {
            "exit": os.waitstatus_to_exitcode(status),
            "cpu": usage.ru_utime + usage.ru_stime,
            "max_rss_kib": usage.ru_maxrss,
            "setup": setup.startswith(b"setup "),
            "mechanisms": _parse_setup(setup),
            "report": rest,
            "stdout": stdout,
            "stdout_size": stdout_size,
            "stderr": stderr,
            "stderr_size": stderr_size,
        }


def _workdir(config: dict[str, Any], mechanisms: dict[str, bool], name: str) -> str:
    """A fresh host folder for one process where it has no mount namespace (direct mode), else ""."""
    if mechanisms["mount_namespace"]:
        return ""
    path = os.path.join(config["workdir"], name)
    os.mkdir(path, 0o700)
    return path


def _program_job(config: dict[str, Any], index: int, job: tuple[Any, ...]) -> dict[str, Any]:
    """Run one program; what the keeper observed of it."""
    _, source, stdin = job  # spans of the batch's memfd: the program process reads them, the keeper never
    mechanisms = _enter_namespaces(config["mode"], pid=True)
    workdir = _workdir(config, mechanisms, f"run-{index}")
    events_before = _pids_events(config["pids_events"])
    mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGCHLD})
    child = _Child()
    child.start(lambda fds: program.run(config, source, stdin, fds, mask, mechanisms, workdir))
    timed_out = _wait_for_exit(child.pid, float(config["limits"]["wall_seconds"]))
    seen = child.finish(int(config["limits"]["max_output_bytes"]))
    if not mechanisms["pid_namespace"]:
        _reap_leftovers()
    return {
        "kind": "program",
        "exit": seen["exit"],
        "timed_out": timed_out,
        "cpu": seen["cpu"],
        "max_rss_kib": seen["max_rss_kib"],
        "events": _pids_events(config["pids_events"]) - events_before,
        "setup": seen["setup"],
        "mechanisms": {**mechanisms, **seen["mechanisms"]},
        "stdout": seen["stdout"].decode("latin-1"),
        "stdout_size": seen["stdout_size"],
        "stderr": seen["stderr"].decode("latin-1"),
        "stderr_size": seen["stderr_size"],
        "workdirs": [workdir] if workdir else [],
    }


def _function_job(config: dict[str, Any], index: int, job: tuple[Any, ...]) -> dict[str, Any]:
    """Run one function job: the tests' process and the candidate's, joined only by the call pipes; the
    verdict is what the tests' process wrote on its own report pipe."""
    _, solution, tests, entry_point = job  # spans: the candidate reads only its solution, the tests' process
    # only the tests; the keeper reads neither, so the candidate, forked from it, never holds the tests
    mechanisms = _enter_namespaces(config["mode"], pid=False)
    tests_dir = _workdir(config, mechanisms, f"tests-{index}")
    candidate_dir = _workdir(config, mechanisms, f"candidate-{index}")
    events_before = _pids_events(config["pids_events"])
    calls_r, calls_w = os.pipe()  # tests -> candidate
    results_r, results_w = os.pipe()  # candidate -> tests
    mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGCHLD})
    tests_process = _Child()
    tests_process.start(
        lambda fds: function.run_tests(config, tests, entry_point, fds, mask, mechanisms, tests_dir),
        (calls_w, results_r),
    )
    os.close(calls_w)
    os.close(results_r)
    # Made after the tests' process was forked: the candidate is pid 1 of a namespace that holds only it.
    own = {**mechanisms, "pid_namespace": _new_pid_namespace(config["mode"])}
    candidate = _Child()
    candidate.start(
        lambda fds: function.run_candidate(config, solution, entry_point, fds, mask, own, candidate_dir),
        (calls_r, results_w),
    )
    os.close(calls_r)
    os.close(results_w)
    timed_out = _wait_for_exit(tests_process.pid, float(config["limits"]["wall_seconds"]))
    candidate_ended = _exited(candidate.pid)  # before the keeper kills it: did it end by itself?
    cap = int(config["limits"]["max_output_bytes"])
    seen_tests, seen_candidate = tests_process.finish(cap), candidate.finish(cap)
    if not own["pid_namespace"]:
        _reap_leftovers()
    stderr = seen_candidate["stderr"]
    if seen_tests["stderr"]:
        stderr += b"\n[tests] " + seen_tests["stderr"]
    return {
        "kind": "function",
        "exit": seen_tests["exit"],
        "timed_out": timed_out,
        "cpu": seen_tests["cpu"],
        "candidate_exit": seen_candidate["exit"] if candidate_ended else None,
        "candidate_cpu": seen_candidate["cpu"],
        "max_rss_kib": max(seen_tests["max_rss_kib"], seen_candidate["max_rss_kib"]),
        "events": _pids_events(config["pids_events"]) - events_before,
        "setup": seen_tests["setup"] and seen_candidate["setup"],
        "passed": seen_tests["report"] == function.PASSED,
        "mechanisms": {**own, **seen_candidate["mechanisms"]},
        "stdout": seen_candidate["stdout"].decode("latin-1"),
        "stdout_size": max(seen_candidate["stdout_size"], seen_tests["stdout_size"]),
        "stderr": stderr.decode("latin-1"),
        "stderr_size": max(seen_candidate["stderr_size"], seen_tests["stderr_size"]),
        "workdirs": [d for d in (tests_dir, candidate_dir) if d],
    }


JOBS = {"program": _program_job, "function": _function_job}


def _keeper(config: dict[str, Any], index: int, job: tuple[Any, ...], out_fd: int) -> NoReturn:
    """Run one job in new namespaces and write its record to ``out_fd``. Always ends the process."""
    started = time.monotonic()
    record: dict[str, Any] = {"index": index}
    try:
        _libc_call("prctl", PR_SET_PDEATHSIG, _signal.SIGKILL, 0, 0, 0)  # die with the runner
        record.update(JOBS[job[0]](config, index, job))
        workdirs = record.pop("workdirs")
        if workdirs:
            import shutil

            for path in workdirs:
                shutil.rmtree(path, ignore_errors=True)
    except BaseException as exc:
        record = {"index": index, "error": f"sandbox keeper failed: {exc!r}"}
    record["wall"] = time.monotonic() - started
    try:
        write_frame(out_fd, json.dumps(record).encode())
    except BaseException:
        os._exit(EXIT_SETUP)
    os._exit(0)


def _parse_setup(line: bytes) -> dict[str, bool]:
    """``setup key=0|1 ...``, a process's own account of its setup, written before it runs code it was
    given."""
    out = {}
    for item in line.decode("ascii", "replace").split()[1:]:
        key, _, value = item.partition("=")
        out[key] = value == "1"
    return out


# ---------------------------------------------------------------------------------------------- runner
def _preload(config: dict[str, Any]) -> None:
    """Import, once per batch, the modules the batch's trusted tests import (names the node read from the
    tests; the runner never sees the tests themselves), so that each job's two interpreters do not both
    import, say, ``typing``; then freeze the heap, so that the garbage collector of a forked job does not
    write to every page it inherited. Each job still starts from a fresh fork: nothing reaches another."""
    stdout, sys.stdout = sys.stdout, sys.stderr  # fd 1 carries records: nothing an import prints goes there
    try:
        for name in config.pop("preload", ()):
            try:  # noqa: SIM105
                __import__(name)
            except Exception:
                pass
    finally:
        sys.stdout = stdout
    gc.freeze()


def main() -> int:
    _libc_call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
    frame = read_frame(0)
    if frame is None:
        return EXIT_SETUP
    config = marshal.loads(frame)
    os.close(0)
    _preload(config)
    if config["mode"] == "direct":
        _libc_call("prctl", PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for index, job in enumerate(config.pop("jobs")):
        keeper = os.fork()
        if keeper == 0:
            _keeper(config, index, job, 1)
        _, status = os.waitpid(keeper, 0)
        if status != 0:
            error = {"index": index, "error": f"sandbox keeper exited with status {status}"}
            write_frame(1, json.dumps(error).encode())
    return 0


if __name__ == "__main__":
    os._exit(main())  # nothing to flush or finalise: skip interpreter teardown
