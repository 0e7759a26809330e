"""The seccomp filters (issue 22: a barrier below Python). Each filter is loaded in a forked child of this
test process, on the host, as root where CI runs: there every call below would succeed without the filter,
so each check can fail. Then the same calls from inside the sandbox, by a child interpreter that no audit
hook watches, and by a program that first disarms the audit hook through its frames."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import tempfile
import threading

import pyseccomp
import pytest

from dgrpo.sandbox import Sandbox, seccomp
from dgrpo.sandbox.confine import PR_SET_NO_NEW_PRIVS, _load_seccomp
from dgrpo.tasks.arith_code import ArithCodeTask, make_prompt

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
CLONE_NEWNS, CLONE_NEWUTS, SIGCHLD = 0x00020000, 0x04000000, 17
ROOT = os.geteuid() == 0


def nr(name: str) -> int:
    return int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name))


def raw(name: str, *args: int) -> int:
    """The errno of a raw syscall (0 when it succeeded)."""
    ctypes.set_errno(0)
    result = LIBC.syscall(nr(name), *[ctypes.c_long(a) for a in args])
    return ctypes.get_errno() if result == -1 else 0


def probe_calls() -> dict[str, object]:
    """What each call gives in this process: an errno (0: it worked)."""
    out: dict[str, object] = {}
    for family in ("AF_INET", "AF_INET6", "AF_NETLINK", "AF_PACKET", "AF_UNIX"):
        try:
            socket.socket(getattr(socket, family), socket.SOCK_DGRAM if family != "AF_UNIX" else socket.SOCK_STREAM)
            out[family] = 0
        except OSError as exc:
            out[family] = exc.errno
    try:
        socket.socketpair(socket.AF_UNIX)
        out["socketpair AF_UNIX"] = 0
    except OSError as exc:
        out["socketpair AF_UNIX"] = exc.errno
    out["keyctl"] = raw("keyctl", 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of the session keyring
    out["io_uring_setup"] = raw("io_uring_setup", 1, 0)  # NULL params: EFAULT when not filtered
    out["process_vm_readv"] = raw("process_vm_readv", os.getpid(), 0, 0, 0, 0, 0)  # zero iovecs: 0 unfiltered
    out["clone3"] = raw("clone3", 0, 0)  # NULL args: EFAULT unfiltered, ENOSYS filtered
    out["unshare CLONE_NEWNS"] = raw("unshare", CLONE_NEWNS)
    folder = tempfile.mkdtemp()
    out["mount"] = 0 if LIBC.mount(b"none", folder.encode(), b"tmpfs", 0, None) == 0 else ctypes.get_errno()
    LIBC.umount2(folder.encode(), 0)
    os.rmdir(folder)
    child = LIBC.syscall(nr("clone"), ctypes.c_long(CLONE_NEWUTS | SIGCHLD), *[ctypes.c_long(0)] * 4)
    if child == 0:
        os._exit(0)  # an unfiltered clone made a child: it leaves at once
    out["clone CLONE_NEWUTS"] = ctypes.get_errno() if child == -1 else 0
    if child > 0:
        os.waitpid(child, 0)
    ran = []
    thread = threading.Thread(target=lambda: ran.append(1))
    thread.start()
    thread.join()
    out["thread"] = ran == [1]
    # PTRACE_TRACEME last: it succeeds unfiltered and makes this process traced
    out["ptrace"] = raw("ptrace", 0, 0, 0, 0)
    return out


def under_filter(bpf: bytes) -> dict[str, object]:
    """``probe_calls`` in a forked child that loaded ``bpf`` first."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            if LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "no_new_privs")
            if bpf:
                _load_seccomp(bpf)
            os.write(write_end, json.dumps(probe_calls()).encode())
        except BaseException as exc:
            os.write(write_end, json.dumps({"error": repr(exc)}).encode())
        os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    return json.loads(data)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def unfiltered() -> dict[str, object]:
    return under_filter(b"")


def test_both_filters_compile_to_classic_bpf() -> None:
    assert seccomp.available() is None
    outer, inner = seccomp.sandbox_filter(), seccomp.program_filter()
    assert len(outer) % 8 == 0 and len(inner) % 8 == 0
    assert len(inner) > len(outer)  # the program filter adds rules


def test_without_a_filter_every_probed_call_works(unfiltered: dict[str, object]) -> None:
    # The control: each call below is refused only because of the filter (the namespace and mount calls
    # work unfiltered only as root, which CI is).
    assert unfiltered["AF_INET"] == 0 and unfiltered["AF_NETLINK"] == 0 and unfiltered["keyctl"] == 0
    assert unfiltered["process_vm_readv"] == 0 and unfiltered["ptrace"] == 0
    assert unfiltered["clone3"] in (errno.EINVAL, errno.EFAULT)  # it exists; only the filter says ENOSYS
    assert unfiltered["io_uring_setup"] == errno.EFAULT
    if ROOT:
        assert unfiltered["unshare CLONE_NEWNS"] == 0 and unfiltered["mount"] == 0
        assert unfiltered["clone CLONE_NEWUTS"] == 0


def test_the_program_filter_refuses_what_a_forgery_or_escape_needs() -> None:
    got = under_filter(seccomp.program_filter())
    eperm = errno.EPERM
    for family in ("AF_INET", "AF_INET6", "AF_NETLINK", "AF_PACKET"):
        assert got[family] == eperm, family
    assert got["AF_UNIX"] == 0 and got["socketpair AF_UNIX"] == 0
    for call in ("keyctl", "io_uring_setup", "process_vm_readv", "ptrace", "unshare CLONE_NEWNS", "mount"):
        assert got[call] == eperm, call
    assert got["clone CLONE_NEWUTS"] == eperm
    assert got["clone3"] == errno.ENOSYS  # so glibc falls back to clone: threads still start
    assert got["thread"] is True


def test_the_sandbox_filter_leaves_the_runner_its_namespaces_and_mounts() -> None:
    got = under_filter(seccomp.sandbox_filter())
    assert got["AF_INET"] == errno.EPERM and got["ptrace"] == errno.EPERM and got["keyctl"] == errno.EPERM
    if ROOT:
        assert got["unshare CLONE_NEWNS"] == 0 and got["mount"] == 0 and got["clone CLONE_NEWUTS"] == 0


# ---------------------------------------------------------------------------------------------- in the sandbox
CHILD_PROBE = """
import ctypes, json, os, socket, subprocess, sys
code = '''
import json, socket
out = {}
with open("/proc/self/status") as fh:
    out.update(l.split(":\\\\t", 1) for l in fh.read().splitlines() if l.startswith("Seccomp"))
for family in ("AF_INET", "AF_INET6", "AF_NETLINK"):
    try:
        socket.socket(getattr(socket, family), socket.SOCK_DGRAM)
        out[family] = 0
    except OSError as exc:
        out[family] = exc.errno
print(json.dumps(out))
'''
print(subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True).stdout)
"""


def test_a_child_interpreter_in_the_sandbox_runs_under_both_filters() -> None:
    result = Sandbox().run(CHILD_PROBE)
    assert result.ok, result.stderr
    got = json.loads(result.stdout)
    assert got["Seccomp"].strip() == "2"  # filter mode
    assert got["Seccomp_filters"].strip() == "2"  # bwrap's and the program's
    assert got["AF_INET"] == got["AF_INET6"] == got["AF_NETLINK"] == errno.EPERM


def test_a_program_that_disarms_the_audit_hook_still_gets_no_socket() -> None:
    # The route: up the frames to the harness's module globals, overwrite what the hook reads, then
    # ask for an AF_INET socket. The hook no longer refuses; seccomp does. The answer is printed only if a
    # socket was made.
    program = """
import socket, sys
frame = sys._getframe()
while frame is not None:
    for scope in [frame.f_globals] + [vars(m) for m in frame.f_globals.values() if type(m) is type(sys)]:
        if "AF_UNIX" in scope:
            scope["AF_UNIX"] = socket.AF_INET
            scope["PROCESS_MEMORY"] = frozenset()
    frame = frame.f_back
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    print(423)
except PermissionError as exc:
    print("refused", exc.errno)
"""
    task = ArithCodeTask()
    assert task.reward(make_prompt("sum", 345, 78), program) == 0.0
    result = task.sandbox.run(program)
    assert result.stdout.strip() == f"refused {errno.EPERM}"


def test_a_syscall_of_another_abi_kills_the_process() -> None:
    # x32 system calls (nr | 0x40000000) on x86_64 would bypass rules written for the native numbers: the
    # filter's architecture check kills the process instead (SIGSYS). On other machines there is no x32 ABI:
    # the same call is only an unknown syscall number there, and the check is that it does not kill.
    import platform
    import signal

    x86_64 = platform.machine() == "x86_64"
    for bpf, kills in ((seccomp.program_filter(), x86_64), (seccomp.sandbox_filter(), x86_64), (b"", False)):
        pid = os.fork()
        if pid == 0:
            LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            if bpf:
                _load_seccomp(bpf)
            LIBC.syscall(ctypes.c_long(0x40000000 | nr("getpid")))
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if kills:
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSYS, status
        else:
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_a_bwrap_sandbox_refuses_to_exist_without_seccomp(monkeypatch: pytest.MonkeyPatch) -> None:
    from dgrpo.sandbox import SandboxUnavailableError
    from dgrpo.sandbox import sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module.seccomp, "available", lambda: "libseccomp is not available (test)")
    sandbox_module._bwrap_launcher.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError, match="seccomp"):
            Sandbox()
    finally:
        sandbox_module._bwrap_launcher.cache_clear()
