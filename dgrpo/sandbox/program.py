"""Inside the sandbox: the program process. It confines itself, runs one untrusted program, and writes the
run's secret only if the program ran to its end. Standard library only; copied into the sandbox beside
:mod:`runner` (``dgrpo.sandbox.runner``), which forks it through a keeper.

Confinement, in order, before any untrusted code: fds 0/1/2 become its own memfds (stdin, stdout, stderr) and
fd 3 the pipe to its keeper, every other fd is closed; it dies with its keeper; it mounts a fresh /proc for its
PID namespace and private tmpfs /tmp and /dev/shm; it drops every capability and sets no_new_privs; it is not
dumpable; its environment is emptied; its rlimits are set; the audit hook is installed. Then it writes one
``setup ...`` line on fd 3 (the mechanisms in force) and runs the program as ``__main__``.

The completion secret: once the program has run to its end (``exec`` returned; no exception, no
``SystemExit``; threads joined, ``atexit`` run, output flushed) the harness writes the run's secret on fd 3.
An early exit of any kind, a crash or a limit leaves it unwritten, so the run fails whatever its exit status
says. The secret is not in the program's environment, files, argv or module globals; a program that walks its
own interpreter's frames can find it (README, "Security").

``try``/``except``/``pass`` rather than ``contextlib.suppress``: a per-run import saved (``noqa: SIM105``).
"""

from __future__ import annotations

import _signal
import atexit
import builtins
import ctypes
import fcntl
import math
import os
import resource
import sys

# Typing helpers only for the type checker (importing ``typing`` costs a few ms).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, NoReturn

# Linux <sys/mount.h>, <sys/prctl.h>, <linux/capability.h>.
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_RDONLY = 2, 4, 8, 1
MS_REC, MS_PRIVATE = 0x4000, 0x40000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CAPABILITY_VERSION_3 = 0x20080522
AF_UNIX = 1  # local socket pairs (asyncio's self-pipe) stay allowed: they reach nothing outside the process
MARKER_FD = 3

# Exit codes of the program process that name a limit. The program can forge them, which only ever turns its
# own result into a failure, so the parent may use them to label a failure but never to grant success.
EXIT_MEMORY = 113
EXIT_PROCESSES = 114
EXIT_SETUP = 115
EXIT_CPU = 152  # 128 + SIGXCPU, as a shell reports a CPU-limit kill
EXIT_FLUSH = 120  # what CPython itself returns when flushing stdout fails at exit

NETWORK_EVENTS = frozenset(
    {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}
    | {"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr"}
)
# Routes to the harness's own state (where the run's secret lives): the object graph, other threads' frames,
# trace hooks that see every frame, raw memory. Refused in every mode (README, "Security").
INTROSPECTION_EVENTS = frozenset(
    {"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames"}
    | {"sys.settrace", "sys.setprofile", "sys.monitoring.register_callback"}
)
# Without a network namespace the audit hook is the only network barrier, and a child process would step
# around it, so process creation by exec is refused too in that mode (direct mode only).
ESCAPE_EVENTS = frozenset({"os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen"})
# When nothing bounds the number of processes (root, whom RLIMIT_NPROC does not bind, without a pids cgroup),
# a fork bomb would exhaust the host's pids: then the program may not create processes at all.
FORK_EVENTS = frozenset({"os.fork", "os.forkpty"})
PROCESS_MEMORY = frozenset({"mem", "pagemap"})


# ---------------------------------------------------------------------------------------------- libc
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _libc_call(name: str, *args: Any) -> None:
    """Call a libc function that returns 0 on success; raise OSError with its errno otherwise."""
    if int(getattr(_LIBC, name)(*args)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if v is None else v.encode() for v in (source, target, fstype)]
    _libc_call("mount", enc[0], enc[1], enc[2], flags, None if data is None else data.encode())


def _drop_capabilities() -> bool:
    """Empty the bounding, ambient, effective, permitted and inheritable sets; True when capget then reads
    them back empty. Nothing can add one back: the program runs as a non-root uid with no_new_privs (set
    next), so no exec grants capabilities."""
    last = 63
    try:
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as fh:
            last = int(fh.read())
    except (OSError, ValueError):
        pass
    for cap in range(last + 1):
        _libc_call("prctl", PR_CAPBSET_DROP, cap, 0, 0, 0)
    _libc_call("prctl", PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable} structs, all zero
    _libc_call("capset", header, data)
    check = (ctypes.c_uint32 * 6)(*([0xFFFFFFFF] * 6))
    _libc_call("capget", header, check)
    return not any(check)


def _fcntl_dupfd(fd: int, lowest: int = 10) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD, lowest)


# ---------------------------------------------------------------------------------------------- program
def _private_mounts(tmpfs_bytes: int) -> bool:
    """A fresh /proc for this PID namespace (True), or an empty one where the kernel refuses (False); private
    tmpfs /tmp and /dev/shm. Nothing written there outlives the program."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        fresh = True
    except OSError:
        _mount("tmpfs", "/proc", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=0555")
        fresh = False
    size = f"size={max(4096, tmpfs_bytes)}"
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=0700")
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
    return fresh


def _set_limit(which: int, value: int) -> None:
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)  # an unprivileged process cannot raise its hard limit
    resource.setrlimit(which, (value, value))


def _set_limits(limits: dict[str, Any], nproc_base: int) -> None:
    cpu = max(1, math.ceil(float(limits["cpu_seconds"])))
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    # The soft limit sends SIGXCPU (handled: a quick, labelled exit); the hard limit one second later
    # SIGKILLs a program that catches or blocks SIGXCPU.
    hard = cpu + 1 if cpu_hard == resource.RLIM_INFINITY else min(cpu + 1, cpu_hard)
    resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, hard), hard))
    _set_limit(resource.RLIMIT_AS, int(limits["memory_bytes"]))
    _set_limit(resource.RLIMIT_FSIZE, int(limits["max_file_bytes"]))
    # RLIMIT_NPROC counts the sandbox user's processes in its user namespace: the runner's own come first.
    _set_limit(resource.RLIMIT_NPROC, int(limits["max_processes"]) + nproc_base)
    _set_limit(resource.RLIMIT_CORE, 0)


def audit_hook(refuse_exec: bool, refuse_fork: bool) -> Callable[[str, tuple[Any, ...]], None]:
    """The program's audit hook. Always refused: network use, ctypes, and the introspection routes to the
    harness's state; with ``refuse_exec`` (no network namespace) also new programs, with ``refuse_fork`` (no
    bound on processes) also fork."""
    refused = set(NETWORK_EVENTS | INTROSPECTION_EVENTS)
    if refuse_exec:
        refused |= ESCAPE_EVENTS
    if refuse_fork:
        refused |= FORK_EVENTS
    realpath, basename = os.path.realpath, os.path.basename

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "socket.__new__":
            if len(args) < 2 or args[1] != AF_UNIX:
                raise PermissionError("network access is disabled in the sandbox")
        elif event in refused or event.startswith("ctypes."):
            raise PermissionError(f"{event} is disabled in the sandbox")
        elif event == "open" and args and isinstance(args[0], str | bytes):
            path = os.fsdecode(args[0])
            if basename(path) in PROCESS_MEMORY or basename(realpath(path)) in PROCESS_MEMORY:
                raise PermissionError("process memory is not readable in the sandbox")

    return hook


def _on_cpu_limit(signum: int, frame: object) -> None:
    os._exit(EXIT_CPU)


def _report_exception(exc: BaseException) -> None:
    """Print a traceback as an uncaught exception would, without this runner's own frames."""
    try:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "solution.py":
            tb = tb.tb_next
        sys.excepthook(type(exc), exc, tb)
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


def _exit_program(code: int, secret: bytes | None) -> NoReturn:
    """End the program process as interpreter shutdown would (non-daemon threads joined, ``atexit`` run,
    output flushed), then, only if all of that went cleanly after a complete run, write the secret."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException as exc:
        _report_exception(exc)
        code = code or 1
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            code = code or EXIT_FLUSH
    if code == 0 and secret is not None:
        try:
            os.write(MARKER_FD, secret)
        except OSError:
            code = EXIT_FLUSH
    os._exit(code)


def run(
    config: dict[str, Any],
    source: str,
    secret: bytes,
    fds: tuple[int, int, int, int],
    mask: Iterable[int],
    mechanisms: dict[str, bool],
    workdir: str,
) -> NoReturn:
    """The forked program process: confine, then run the program. Always ends the process."""
    try:
        high = [_fcntl_dupfd(fd) for fd in fds]  # above every target first: no dup2 below clobbers a source
        for target, fd in enumerate(high):  # 0 stdin, 1 stdout, 2 stderr, 3 the keeper's marker pipe
            os.dup2(fd, target)
        os.closerange(MARKER_FD + 1, 1 << 16)  # the batch, the record pipe, everything else the runner held
        _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)
        os.setpgid(0, 0)
        _libc_call("prctl", PR_SET_PDEATHSIG, _signal.SIGKILL, 0, 0, 0)  # die with the keeper
        mode = config["mode"]
        setup = {"fresh_proc": False, "no_capabilities": False, "no_new_privs": False}
        if mechanisms["mount_namespace"]:
            setup["fresh_proc"] = _private_mounts(int(config["limits"]["tmpfs_bytes"]))
            os.chdir("/tmp")
        else:
            os.chdir(workdir)
        if mode == "bwrap":
            setup["no_capabilities"] = _drop_capabilities()
        _libc_call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        setup["no_new_privs"] = True
        # Not dumpable: a process the program starts cannot read this one's memory through /proc.
        _libc_call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
        home = os.getcwd()
        keep = {k: os.environ[k] for k in ("LD_LIBRARY_PATH",) if k in os.environ}
        os.environ.clear()  # a fixed environment: nothing of the node's, nothing per run
        os.environ.update(keep, HOME=home, TMPDIR=home, LANG="C.UTF-8", PYTHONHASHSEED="0")
        _set_limits(config["limits"], int(config["nproc_base"]))
        _signal.signal(_signal.SIGXCPU, _on_cpu_limit)
        sys.path[:] = [p for p in sys.path if p] + list(config["paths"])
        sys.argv[:] = ["solution.py"]
        sys.dont_write_bytecode = True
        unbounded = not config["pids_cgroup"] and os.geteuid() == 0
        sys.addaudithook(audit_hook(refuse_exec=not mechanisms["net_namespace"], refuse_fork=unbounded))
        line = " ".join(f"{k}={int(v)}" for k, v in setup.items())
        os.write(MARKER_FD, f"setup {line}\n".encode())
    except BaseException as exc:
        try:  # noqa: SIM105
            os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
        except BaseException:
            pass
        os._exit(EXIT_SETUP)
    main = type(sys)("__main__")  # the program's own __main__, not this runner's
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(source, "solution.py", "exec"), main.__dict__)
    except SystemExit as exc:
        _exit_program(_exit_code(exc.code), None)  # an early exit never counts as a complete run
    except MemoryError as exc:
        _report_exception(exc)
        code = EXIT_MEMORY
    except BlockingIOError as exc:  # fork or thread creation refused: the process limit
        _report_exception(exc)
        code = EXIT_PROCESSES
    except BaseException as exc:
        _report_exception(exc)
        code = 1
    _exit_program(code, secret if code == 0 else None)
