"""The seccomp filters under the sandbox: a barrier below Python, compiled by libseccomp.

Two classic-BPF programs, built here in the node (trusted) with libseccomp's Python API (Debian's
``python3-seccomp`` where importable, else ``pyseccomp``, the same API over ``libseccomp.so.2`` by ctypes),
and exported as the raw ``struct sock_filter`` array the kernel loads:

- :func:`sandbox_filter`, given to bubblewrap (``--seccomp FD``): everything in the sandbox, the runner and
  keepers included, runs under it. It denies what nothing in the sandbox needs: sockets of any family but
  AF_UNIX, ``ptrace`` and ``process_vm_readv``/``writev`` (reading or writing another process), the kernel
  keyring, ``bpf``, ``perf_event_open``, ``io_uring`` (its operations are not seen by seccomp at all),
  ``userfaultfd``, loading modules or kernels, and the host administration calls (time, swap, reboot, quota,
  ``open_by_handle_at``, ``pivot_root``, ``chroot``, ``setns``).
- :func:`program_filter`, loaded by each program process itself (``prctl(PR_SET_SECCOMP)``) after its own
  mounts and before any untrusted code: all of the above, plus ``mount`` and the new mount API, ``umount2``,
  ``unshare``, ``clone`` with any namespace flag, and ``clone3`` (its flags live in memory, where seccomp
  cannot read them, so it answers ENOSYS and glibc falls back to ``clone``). Filters stack: a program runs
  under both, and in the weak direct mode (no bwrap) under this one alone.

Every denied call fails with EPERM (ENOSYS for ``clone3``); a syscall of another ABI (x32, i386 on x86_64)
kills the process. This is a deny list, not an allow list: it removes the kernel interfaces an escape or a
forgery needs (docs/sandbox.md, "Threat model"), not every interface a kernel exploit might use.
"""

from __future__ import annotations

import errno
import functools
import logging
import socket
import tempfile
from types import ModuleType

log = logging.getLogger(__name__)

# Denied for every process in the sandbox.
SANDBOX_DENIED = (
    *("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"),
    *("keyctl", "add_key", "request_key"),
    *("bpf", "perf_event_open", "userfaultfd", "fanotify_init", "lookup_dcookie"),
    *("io_uring_setup", "io_uring_enter", "io_uring_register"),
    *("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module"),
    *("reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup"),
    *("settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm"),
    *("open_by_handle_at", "name_to_handle_at", "pivot_root", "chroot", "setns"),
)
# Denied to programs on top: the runner needs these to give each program namespaces and mounts of its own.
PROGRAM_DENIED = (
    *("mount", "umount2", "unshare", "mount_setattr", "move_mount", "open_tree"),
    *("fsopen", "fsconfig", "fsmount", "fspick"),
)
# clone(2) flags that make a namespace (<linux/sched.h>); a plain fork or thread uses none of them.
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)


class SeccompUnavailableError(RuntimeError):
    """libseccomp (or its Python API) is not available here."""


def _library() -> ModuleType:
    try:
        import seccomp  # Debian's python3-seccomp (libseccomp's own)
    except ImportError:
        try:
            import pyseccomp as seccomp
        except (ImportError, OSError, AttributeError) as exc:  # no package, or no libseccomp.so.2
            raise SeccompUnavailableError(f"libseccomp is not available ({exc})") from exc
    return seccomp  # type: ignore[no-any-return]


def _compile(program: bool) -> bytes:
    sc = _library()
    flt = sc.SyscallFilter(sc.ALLOW)
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    deny = sc.ERRNO(errno.EPERM)
    skipped = []
    for name in (*SANDBOX_DENIED, *(PROGRAM_DENIED if program else ())):
        try:
            flt.add_rule(deny, name)
        except (OSError, RuntimeError, ValueError):  # not a syscall of this architecture
            skipped.append(name)
    unix = socket.AF_UNIX
    flt.add_rule(deny, "socket", sc.Arg(0, sc.NE, unix))
    flt.add_rule(deny, "socketpair", sc.Arg(0, sc.NE, unix))
    if program:
        for flag in NAMESPACE_FLAGS:
            flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    if skipped:
        log.debug("seccomp: not syscalls here, not filtered: %s", ", ".join(skipped))
    with tempfile.TemporaryFile() as fh:
        flt.export_bpf(fh)
        fh.seek(0)
        return fh.read()


@functools.cache
def sandbox_filter() -> bytes:
    """The filter bubblewrap applies to the whole sandbox (raw BPF); :class:`SeccompUnavailableError`."""
    return _compile(program=False)


@functools.cache
def program_filter() -> bytes:
    """The stricter filter each program process loads before untrusted code (raw BPF)."""
    return _compile(program=True)


def available() -> str | None:
    """None when both filters compile here, else why not."""
    try:
        sandbox_filter()
        program_filter()
    except (SeccompUnavailableError, OSError) as exc:
        return str(exc)
    return None
