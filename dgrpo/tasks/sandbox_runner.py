"""The child side of :mod:`dgrpo.tasks.sandbox`: confine, then run one untrusted program. Stdlib only.

Launched as ``python -S -s -P -B sandbox_runner.py key=value ...`` in a fresh session, with a scrubbed
environment, a temporary working directory and stdout/stderr redirected to files. It runs as two processes:

- the *supervisor* (this script's own process) enters new PID and network namespaces (``unshare`` applies to
  the children it creates next), waits until the parent has moved it into the per-run pids cgroup, forks the
  program process, enforces the wall-clock limit and reports how the program ended over the status pipe. It
  never runs untrusted code, so its report can be trusted: the program process closes the pipe first thing.
- the *program* process: pid 1 of the new PID namespace, so when it exits the kernel kills and reaps every
  process it left behind (nothing is left for the host's init to reap, or to fail to). It sets its resource
  limits, installs an audit hook refusing network use, then runs the program.

Confining ourselves here, rather than through ``subprocess``'s ``preexec_fn``, keeps the parent safe: the
daemon runs threads, and running Python code between ``fork`` and ``exec`` in a threaded parent can deadlock.

Start-up time matters (hundreds of programs per training round), hence the plain ``key=value`` formats instead
of ``json``, ``_signal`` instead of ``signal`` (those pull in ``re`` and ``enum``, about 10 ms per run) and
``try``/``except``/``pass`` instead of ``contextlib.suppress`` (another ~2.5 ms): hence the ``noqa: SIM105``.
"""

from __future__ import annotations

import _signal
import atexit
import builtins
import ctypes
import math
import os
import resource
import sys
import time

# Typing helpers only for the type checker: importing ``typing`` at run time costs ~4 ms per run. (mypy
# recognises a ``TYPE_CHECKING`` guard by its name.)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, NoReturn

# Linux ``<sched.h>`` / ``<sys/prctl.h>`` constants (``os.unshare`` only exists from Python 3.12 on).
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
AF_UNIX = 1  # local socket pairs (asyncio's self-pipe) stay allowed; they reach no network

# Exit codes of the program process that name a limit. The program can forge them, which only ever turns its
# own result into a failure, so the parent may use them to label a failure but never to grant success.
EXIT_MEMORY = 113
EXIT_PROCESSES = 114
EXIT_SETUP = 115
EXIT_CPU = 152  # 128 + SIGXCPU, as a shell reports a CPU-limit kill
EXIT_FLUSH = 120  # what CPython itself returns when flushing stdout fails at exit

NETWORK_EVENTS = frozenset(
    {
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
    }
)
# Without a network namespace the audit hook is the only network barrier, and a child process or a raw libc
# call would step around it, so those are refused too in that mode.
ESCAPE_EVENTS = frozenset(
    {"os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen", "ctypes.dlopen", "ctypes.dlsym"}
)
# When nothing bounds the number of processes (root, whom RLIMIT_NPROC does not bind, without a pids cgroup),
# a fork bomb would exhaust the host's pids: then the program may not create processes at all.
FORK_EVENTS = frozenset({"os.fork", "os.forkpty"})
STATUS_KEYS = ("exit", "timed_out", "cpu_seconds", "max_rss_kib")


def parse_pairs(items: Iterable[str]) -> dict[str, list[str]]:
    """``key=value`` items (the runner's argv and status lines) as key -> values, in order."""
    out: dict[str, list[str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if sep:
            out.setdefault(key, []).append(value)
    return out


def _libc_call(name: str, *args: int) -> None:
    """Call a libc function that returns 0 on success; raise OSError with its errno otherwise."""
    function = getattr(ctypes.CDLL(None, use_errno=True), name)
    if int(function(*args)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(text)


def _enter_namespaces() -> dict[str, bool]:
    """New PID + network namespaces for the children, as root or through a user namespace when unprivileged."""
    flags = CLONE_NEWPID | CLONE_NEWNET
    try:
        _libc_call("unshare", flags)
        return {"pid_namespace": True, "net_namespace": True, "user_namespace": False}
    except OSError:
        pass
    uid, gid = os.getuid(), os.getgid()
    try:
        _libc_call("unshare", CLONE_NEWUSER | flags)
    except OSError:
        return {"pid_namespace": False, "net_namespace": False, "user_namespace": False}
    # Map our own ids so files the program writes keep their owner; a failure here leaves the process unable
    # to create files, so it propagates and fails the run (setup error) rather than running half-confined.
    _write_text("/proc/self/setgroups", "deny")
    _write_text("/proc/self/uid_map", f"{uid} {uid} 1")
    _write_text("/proc/self/gid_map", f"{gid} {gid} 1")
    return {"pid_namespace": True, "net_namespace": True, "user_namespace": True}


def _send_status(fd: int, status: dict[str, object]) -> None:
    data = "".join(f"{k}={int(v) if isinstance(v, bool) else v}\n" for k, v in status.items()).encode()
    while data:
        data = data[os.write(fd, data) :]
    os.close(fd)


def _kill_all(pids: Iterable[int]) -> None:
    for pid in pids:
        try:  # noqa: SIM105
            os.kill(pid, _signal.SIGKILL)
        except ProcessLookupError:
            pass


def _adopted_children() -> set[int]:
    """Our children: as a subreaper we inherit the orphans of the program's descendants."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", encoding="ascii") as fh:
            return {int(p) for p in fh.read().split()}
    except OSError:
        return set()


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
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        _kill_all(_adopted_children())
        _signal.sigtimedwait({_signal.SIGCHLD}, 0.05)


def _set_limit(which: int, value: int) -> None:
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)  # an unprivileged process cannot raise its hard limit
    resource.setrlimit(which, (value, value))


def _set_limits(config: dict[str, list[str]]) -> None:
    cpu = max(1, math.ceil(float(config["cpu_seconds"][0])))
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    # The soft limit sends SIGXCPU (handled: a quick, labelled exit); the hard limit one second later
    # SIGKILLs a program that catches or blocks SIGXCPU.
    hard = cpu + 1 if cpu_hard == resource.RLIM_INFINITY else min(cpu + 1, cpu_hard)
    resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, hard), hard))
    _set_limit(resource.RLIMIT_AS, int(config["memory_bytes"][0]))
    _set_limit(resource.RLIMIT_FSIZE, int(config["file_bytes"][0]))
    _set_limit(resource.RLIMIT_NPROC, int(config["max_processes"][0]))
    _set_limit(resource.RLIMIT_CORE, 0)


def audit_hook(no_netns: bool, unbounded_processes: bool) -> Callable[[str, tuple[Any, ...]], None]:
    """The program's audit hook: network use is always refused; process creation and ctypes too when the
    namespaces or the process bound that would otherwise contain them are missing."""
    refused = set(NETWORK_EVENTS)
    if no_netns or unbounded_processes:
        refused |= ESCAPE_EVENTS
    if unbounded_processes:
        refused |= FORK_EVENTS

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "socket.__new__":
            if len(args) < 2 or args[1] != AF_UNIX:
                raise PermissionError("network access is disabled in the sandbox")
        elif event in refused:
            raise PermissionError(f"{event} is disabled in the sandbox")

    return hook


def _on_cpu_limit(signum: int, frame: object) -> None:
    os._exit(EXIT_CPU)


def _report_exception(exc: BaseException) -> None:
    """Print a traceback as an uncaught exception would, without this runner's own frame."""
    try:
        tb = exc.__traceback__
        if tb is not None:
            exc = exc.with_traceback(tb.tb_next)
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except BaseException:  # e.g. MemoryError while formatting: the exit code still says what happened
        pass


def _exit_code(code: object) -> int:
    """The process exit status ``raise SystemExit(code)`` would give."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:  # noqa: SIM105
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _exit_program(code: int) -> NoReturn:
    """End the program process as interpreter shutdown would, minus tearing down every object.

    Finalising the forked interpreter touches every object and so copies most of its pages: several
    milliseconds per run for nothing. Non-daemon threads and ``atexit`` handlers still run, output is flushed.
    """
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException as exc:
        _report_exception(exc)
        code = code or 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            code = code or EXIT_FLUSH
    os._exit(code)


def _program_process(
    config: dict[str, list[str]], status_fd: int, mask: Iterable[int], mechanisms: dict[str, bool]
) -> NoReturn:
    """The forked program process: confine, then run the program. Always ends the process."""
    try:
        os.close(status_fd)  # first: untrusted code must not be able to forge the supervisor's report
        _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)
        os.setpgid(0, 0)
        _libc_call("prctl", PR_SET_PDEATHSIG, _signal.SIGKILL, 0, 0, 0)  # die with the supervisor
        _set_limits(config)
        _signal.signal(_signal.SIGXCPU, _on_cpu_limit)
        with open(config["source_path"][0], encoding="utf-8", errors="replace") as fh:
            source = fh.read()
        sys.path[:] = [p for p in sys.path if p] + config.get("extra_path", [])
        sys.argv[:] = ["solution.py"]
        sys.dont_write_bytecode = True
        unbounded = not mechanisms["pids_cgroup"] and os.geteuid() == 0
        sys.addaudithook(audit_hook(no_netns=not mechanisms["net_namespace"], unbounded_processes=unbounded))
    except BaseException as exc:
        print(f"sandbox setup failed: {exc!r}", file=sys.stderr, flush=True)
        os._exit(EXIT_SETUP)
    code = 0
    try:
        exec(compile(source, "solution.py", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except MemoryError as exc:
        _report_exception(exc)
        code = EXIT_MEMORY
    except BlockingIOError as exc:  # fork or thread creation refused: the process limit
        _report_exception(exc)
        code = EXIT_PROCESSES
    except BaseException as exc:
        _report_exception(exc)
        code = 1
    _exit_program(code)


def main(argv: list[str]) -> int:
    config = parse_pairs(argv[1:])
    status_fd = int(config["status_fd"][0])
    try:
        mechanisms = _enter_namespaces()
        _libc_call("prctl", PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        # The parent moves us into the pids cgroup while we start up, then says go (b"1"); anything else means
        # it could not, and we must not run the program unconfined.
        go = os.read(int(config["go_fd"][0]), 1)
        if go != b"1":
            raise OSError("the parent did not place the sandbox in its cgroup")
        mechanisms["pids_cgroup"] = config["cgroup"][0] == "1"
        mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGCHLD})
        child = os.fork()
    except OSError as exc:
        _send_status(status_fd, {"error": f"sandbox setup failed: {exc}"})
        return EXIT_SETUP
    if child == 0:
        _program_process(config, status_fd, mask, mechanisms)
    try:  # noqa: SIM105
        os.setpgid(child, child)  # also set here: whichever of the two runs first wins the race
    except OSError:
        pass  # the child already did it, or has already exited
    # Tell the parent the program's process group now: should this supervisor be starved or hung and the
    # parent have to kill it, the parent can still kill what the program started.
    os.write(status_fd, f"child={child}\n".encode())
    timed_out = _wait_for_exit(child, float(config["wall_seconds"][0]))
    try:  # noqa: SIM105
        os.killpg(child, _signal.SIGKILL)  # the child is still unreaped, so its group id cannot be reused
    except ProcessLookupError:
        pass
    _, wait_status, usage = os.wait4(child, 0)
    if not mechanisms["pid_namespace"]:
        _reap_leftovers()
    status: dict[str, object] = {
        "exit": os.waitstatus_to_exitcode(wait_status),
        "timed_out": timed_out,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "max_rss_kib": usage.ru_maxrss,
    }
    status.update({f"mechanism.{k}": v for k, v in mechanisms.items()})
    _send_status(status_fd, status)
    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv))  # nothing to flush or finalise: skip interpreter teardown
