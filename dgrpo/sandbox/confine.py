"""Inside the sandbox: how a process that will run untrusted or test code confines itself first. Standard
library only; copied into the sandbox beside :mod:`runner`.

In order, before any code it was given: its fds become the ones it is handed (0/1/2 memfds of its own:
stdin, stdout, stderr; 3 the report pipe to its keeper; then the call pipes of a function job), every other
fd is closed; it dies with its keeper; in the sandbox it takes a mount namespace of its own and mounts a
fresh /proc for its PID namespace and private tmpfs /tmp and /dev/shm; it drops every capability and sets
no_new_privs; it is not dumpable; its environment is emptied; its rlimits are set; it loads the program
seccomp filter (:mod:`dgrpo.sandbox.seccomp`, compiled by the node); the audit hook is installed. Then it
writes one ``setup ...`` line on its report pipe: the mechanisms in force, written before any code it was
given runs, so the keeper can trust it.

The audit hook is a diagnostic, not a barrier: code in the same interpreter can reach the hook's closure
and the module's globals through its frames. The barriers are the namespaces, the dropped capabilities and
the seccomp filter, none of which the process can undo from inside.

``try``/``except``/``pass`` rather than ``contextlib.suppress``: a per-run import saved (``noqa: SIM105``).
"""

from __future__ import annotations

import _signal
import ctypes
import fcntl
import math
import os
import resource
import sys

# The framing sits beside this file: in the node a package module, in the sandbox a file.
try:
    from dgrpo.sandbox import frames
except ImportError:  # inside the sandbox: imported by the runner from its own folder
    import frames  # type: ignore[no-redef]

# Typing helpers only for the type checker (importing ``typing`` costs a few ms).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

# Linux <sys/mount.h>, <sys/prctl.h>, <linux/capability.h>, <linux/seccomp.h>, <sched.h>.
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_RDONLY = 2, 4, 8, 1
MS_REC, MS_PRIVATE = 0x4000, 0x40000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CAPABILITY_VERSION_3 = 0x20080522
CLONE_NEWNS = 0x00020000
AF_UNIX = 1  # local socket pairs (asyncio's self-pipe) stay allowed: they reach nothing outside the process
REPORT_FD = 3

# Exit codes of a sandboxed process that name a limit. The process can forge them, which only ever turns its
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
# The object graph, other threads' frames, trace hooks that see every frame.
INTROSPECTION_EVENTS = frozenset(
    {"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames"}
    | {"sys.settrace", "sys.setprofile", "sys.monitoring.register_callback"}
)
# Without a network namespace, process creation by exec is refused too in that mode (direct mode only).
ESCAPE_EVENTS = frozenset({"os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen"})
# When nothing bounds the number of processes (root, whom RLIMIT_NPROC does not bind, without a pids cgroup),
# a fork bomb would exhaust the host's pids: then the program may not create processes at all.
FORK_EVENTS = frozenset({"os.fork", "os.forkpty"})
PROCESS_MEMORY = frozenset({"mem", "pagemap"})


# ---------------------------------------------------------------------------------------------- libc
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def libc_call(name: str, *args: Any) -> None:
    """Call a libc function that returns 0 on success; raise OSError with its errno otherwise."""
    if int(getattr(_LIBC, name)(*args)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if v is None else v.encode() for v in (source, target, fstype)]
    libc_call("mount", enc[0], enc[1], enc[2], flags, None if data is None else data.encode())


def _drop_capabilities() -> bool:
    """Empty the bounding, ambient, effective, permitted and inheritable sets; True when capget then reads
    them back empty. Nothing can add one back: the process runs as a non-root uid with no_new_privs (set
    next), so no exec grants capabilities."""
    last = 63
    try:
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as fh:
            last = int(fh.read())
    except (OSError, ValueError):
        pass
    for cap in range(last + 1):
        libc_call("prctl", PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc_call("prctl", PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable} structs, all zero
    libc_call("capset", header, data)
    check = (ctypes.c_uint32 * 6)(*([0xFFFFFFFF] * 6))
    libc_call("capget", header, check)
    return not any(check)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _load_seccomp(bpf: bytes) -> None:
    """Load a raw classic-BPF seccomp program (an array of 8-byte ``struct sock_filter``). Needs
    no_new_privs, set before; from here on the filter holds for this process and all it starts."""
    if not bpf or len(bpf) % 8:
        raise OSError(0, "seccomp: no valid filter given")
    buffer = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc_call("prctl", PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0)


def _fcntl_dupfd(fd: int, lowest: int = 10) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD, lowest)


# ---------------------------------------------------------------------------------------------- steps
def _private_mounts(tmpfs_bytes: int) -> bool:
    """A mount namespace of its own with a fresh /proc for its PID namespace (True), or an empty one where the
    kernel refuses (False); private tmpfs /tmp and /dev/shm. Nothing written there outlives the process, and
    no other process of the job (a function job's other half) sees them."""
    libc_call("unshare", CLONE_NEWNS)
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
    # SIGKILLs a process that catches or blocks SIGXCPU.
    hard = cpu + 1 if cpu_hard == resource.RLIM_INFINITY else min(cpu + 1, cpu_hard)
    resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, hard), hard))
    _set_limit(resource.RLIMIT_AS, int(limits["memory_bytes"]))
    _set_limit(resource.RLIMIT_FSIZE, int(limits["max_file_bytes"]))
    # RLIMIT_NPROC counts the sandbox user's processes in its user namespace: the runner's own come first.
    _set_limit(resource.RLIMIT_NPROC, int(limits["max_processes"]) + nproc_base)
    _set_limit(resource.RLIMIT_CORE, 0)


def audit_hook(refuse_exec: bool, refuse_fork: bool) -> Callable[[str, tuple[Any, ...]], None]:
    """The audit hook (a diagnostic: it makes the usual routes fail loudly). Always refused: network use,
    ctypes, introspection of other frames and threads, opening process memory; with ``refuse_exec`` (no
    network namespace) also new programs, with ``refuse_fork`` (no bound on processes) also fork."""
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


def confine(
    config: dict[str, Any],
    fds: tuple[int, ...],
    mask: Iterable[int],
    mechanisms: dict[str, bool],
    workdir: str,
    nproc_extra: int = 0,
    own_mounts: bool = True,
) -> dict[str, bool]:
    """Confine this (freshly forked) process; ``fds`` become 0, 1, 2, ... in order, fd 3 being the report
    pipe; ``nproc_extra`` more processes of the job (a function job's other half) count against
    RLIMIT_NPROC; without ``own_mounts`` (a function job's tests' process: trusted code, in the sandbox's PID
    namespace, for which it may not mount a /proc) it keeps the sandbox's mounts, read-only, instead of
    :func:`_private_mounts`. Returns what is in force, after writing it as the ``setup`` line on fd 3. Raises
    on any failure: the caller exits with :data:`EXIT_SETUP` and runs nothing."""
    high = [_fcntl_dupfd(fd) for fd in fds]  # above every target first: no dup2 below clobbers a source
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(len(fds), 1 << 16)  # the batch, the record pipe, the other half's pipes, all else
    _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)
    os.setpgid(0, 0)
    libc_call("prctl", PR_SET_PDEATHSIG, _signal.SIGKILL, 0, 0, 0)  # die with the keeper
    setup = {"fresh_proc": False, "no_capabilities": False, "no_new_privs": False, "seccomp": False}
    if mechanisms["mount_namespace"] and own_mounts:
        setup["fresh_proc"] = _private_mounts(int(config["limits"]["tmpfs_bytes"]))
    os.chdir(workdir or "/tmp")
    if config["mode"] == "bwrap":
        setup["no_capabilities"] = _drop_capabilities()
    libc_call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    setup["no_new_privs"] = True
    # Not dumpable: a process it starts cannot read this one's memory through /proc.
    libc_call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
    home = os.getcwd()
    keep = {k: os.environ[k] for k in ("LD_LIBRARY_PATH",) if k in os.environ}
    os.environ.clear()  # a fixed environment: nothing of the node's, nothing per run
    os.environ.update(keep, HOME=home, TMPDIR=home, LANG="C.UTF-8", PYTHONHASHSEED="0")
    _set_limits(config["limits"], int(config["nproc_base"]) + nproc_extra)
    _signal.signal(_signal.SIGXCPU, _on_cpu_limit)
    sys.path[:] = [p for p in sys.path if p] + list(config["paths"])
    sys.argv[:] = ["solution.py"]
    sys.dont_write_bytecode = True
    if config["seccomp"]:
        _load_seccomp(config["seccomp"])
        setup["seccomp"] = True
    unbounded = not config["pids_cgroup"] and os.geteuid() == 0
    sys.addaudithook(audit_hook(refuse_exec=not mechanisms["net_namespace"], refuse_fork=unbounded))
    line = " ".join(f"{k}={int(v)}" for k, v in setup.items())
    os.write(REPORT_FD, f"setup {line}\n".encode())
    return setup


def enter(
    config: dict[str, Any],
    spans: Iterable[tuple[int, int]],
    fds: tuple[int, ...],
    mask: Iterable[int],
    mechanisms: dict[str, bool],
    workdir: str,
    *,
    nproc_extra: int = 0,
    own_mounts: bool = True,
    keep_report: bool = False,
    stdin_span: tuple[int, int] | None = None,
) -> list[str]:
    """The start of every process that runs given code: read its own texts (``spans`` of the batch's memfd,
    which :func:`confine` then closes; ``stdin_span`` goes into its stdin memfd, before the file size limit
    is set), confine, and close the report pipe unless ``keep_report`` (the tests' process writes its verdict
    there). Returns the texts; on any failure it reports on stderr and exits with :data:`EXIT_SETUP`, having
    run nothing."""
    try:
        texts = [frames.read_span(config["jobs_fd"], span) for span in spans]
        stdin = b"" if stdin_span is None else frames.read_span(config["jobs_fd"], stdin_span).encode("utf-8")
        if stdin:
            os.write(fds[0], stdin)
            os.lseek(fds[0], 0, os.SEEK_SET)
        confine(config, fds, mask, mechanisms, workdir, nproc_extra, own_mounts)
        if not keep_report:
            os.close(REPORT_FD)
    except BaseException as exc:
        try:  # noqa: SIM105
            os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
        except BaseException:
            pass
        os._exit(EXIT_SETUP)
    return texts
