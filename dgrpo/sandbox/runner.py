"""Inside the sandbox: a fork server that runs a batch of untrusted programs one after another, each in
namespaces of its own. Standard library only, and self-contained: the parent copies this one file into the
sandbox, where it runs under the sandbox's interpreter (which need not be the node's).

For each program of the batch (``dgrpo.sandbox`` explains where the runner itself lives)::

    runner    reads the batch, then for each program forks
     keeper   new mount, PID, network, IPC and UTS namespaces; enforces the wall limit and writes the
              program's record. Never runs untrusted code.
      program pid 1 of its PID namespace. Mounts a fresh /proc and private tmpfs /tmp and /dev/shm, drops
              every capability, sets no_new_privs and its rlimits, installs the audit hook, then runs the
              program; when it exits the kernel kills everything it started.

Channels. The batch arrives on fd 0 as one frame; each program's record leaves on fd 1 as one frame, written
by its keeper. The program process holds neither: its fds 0/1/2 are memfds of its own (stdin, stdout,
stderr) and fd 3 is the write end of a pipe to its keeper, on which the setup writes one line before any
untrusted code runs, and the harness writes the run's secret once the program has run to its end (``exec``
returned; no exception, no ``SystemExit``; threads joined, ``atexit`` run, output flushed). An early exit of
any kind, a crash or a limit leaves the secret unwritten, so the run fails whatever its exit status says.
The secret is not in the program's environment, files, argv or module globals; a program that walks its own
interpreter's frames can find it (README, "Security"). Keeper and runner live in an outer PID namespace the
program cannot see, and are not dumpable.

``mode=direct`` (the operator's explicit weak sandbox, no bwrap): the same processes, started on the host;
the keeper enters what namespaces it can (as root; or through a user namespace), the program works in a fresh
host folder, and the audit hook also refuses what those missing namespaces would have contained.

Formats: the batch is ``marshal`` (it comes from the trusted parent); records are JSON (the parent parses
them with a parser that is safe on any input), output bytes carried as latin-1 text. Start-up matters less
than it did (one interpreter per batch, not per program), but the runner still avoids ``signal`` and
``contextlib`` (their imports cost more than the runner's own work): hence ``_signal`` and ``noqa: SIM105``.
"""

from __future__ import annotations

import _signal
import atexit
import builtins
import ctypes
import fcntl
import json
import marshal
import math
import os
import resource
import struct
import sys
import time

# Typing helpers only for the type checker (importing ``typing`` costs a few ms per batch).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, NoReturn

# Linux <sched.h>, <sys/mount.h>, <sys/prctl.h>, <linux/capability.h> (os.unshare only exists from 3.12 on).
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_RDONLY = 2, 4, 8, 1
MS_REC, MS_PRIVATE = 0x4000, 0x40000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CAPABILITY_VERSION_3 = 0x20080522
AF_UNIX = 1  # local socket pairs (asyncio's self-pipe) stay allowed: they reach nothing outside the process
MARKER_FD = 3
FRAME = struct.Struct(">Q")

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
            _program(config, source, secret, (*fds, marker_write), mask, mechanisms, workdir)
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


def _program(
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
