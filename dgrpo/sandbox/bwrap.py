"""The bubblewrap command line of one sandbox (one batch of programs).

What the sandbox is, as bwrap builds it (run as the unprivileged sandbox user, uid 65534 when the node is
root):

- a new user namespace (nested twice by bwrap: the sandbox user is not root inside it either) in which
  creating further user namespaces is disabled; new mount, PID, network, IPC, UTS and cgroup namespaces;
- a root that is an empty, read-only tmpfs holding only read-only binds of the interpreter, its standard
  library (site-packages masked), the folders of the shared libraries it loads and its loader (symlinks on
  the way replicated, so ``/lib64/ld-linux-x86-64.so.2`` resolves as on the host), plus copies of the runner
  and of the sandbox's site folder (``--ro-bind-data``: the parent reads them, the sandbox user need not
  reach them), and the batch's pids cgroup folder, read-only;
- a minimal read-only ``/dev`` (null, zero, full, random, urandom, tty), a fresh ``/proc`` (the runner mounts
  another per program), an empty environment but for the variables below;
- ``--die-with-parent`` and ``--new-session``; the runner keeps CAP_SYS_ADMIN and CAP_SETPCAP inside the
  user namespace only, to give each program namespaces of its own and to drop every capability before it
  runs a program;
- ``--seccomp``: the sandbox's seccomp filter (:mod:`dgrpo.sandbox.seccomp`) on everything bwrap starts;
  each program process stacks the stricter program filter on it before it runs any code it was given.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import PurePosixPath

from dgrpo.sandbox.interpreter import Interpreter

INNER = "/run/dgrpo"  # the runner, the site folders and the pids cgroup, inside the sandbox
RUNNER = f"{INNER}/runner.py"
SITE = f"{INNER}/site"
PIDS = f"{INNER}/pids"
MIN_BWRAP = (0, 8, 0)  # --disable-userns
MASKED = ("site-packages", "dist-packages")


def find_bwrap() -> str | None:
    return shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap",) if os.access(p, os.X_OK)), None)


@functools.lru_cache(maxsize=4)
def bwrap_version(path: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(g or 0) for g in match.groups()) if match else None


def expose(path: str, args: list[str], bound: set[str], links: set[str]) -> None:
    """Append the bwrap options that make host ``path`` resolve inside exactly as outside: every symlink on
    the way recreated, the object it ends at bound read-only (unless a bound folder already holds it)."""
    parts = PurePosixPath(os.path.normpath(path)).parts[1:]
    current = "/"
    for i, part in enumerate(parts):
        step = os.path.join(current, part)
        if os.path.islink(step):
            target = os.readlink(step)
            if step not in links:
                args += ["--symlink", target, step]
                links.add(step)
            resolved = os.path.normpath(os.path.join(current, target))  # an absolute target replaces current
            expose(os.path.join(resolved, *parts[i + 1 :]), args, bound, links)
            return
        current = step
    if not any(current == b or current.startswith(b.rstrip("/") + "/") for b in bound):
        args += ["--ro-bind", current, current]
        bound.add(current)


def mounts_for(interp: Interpreter) -> list[str]:
    """The read-only view of the host that ``interp`` needs (folders first, so files inside them are
    covered), with site-packages masked by an empty read-only tmpfs."""
    args: list[str] = []
    bound: set[str] = set()
    links: set[str] = set()
    folders = sorted({*interp.paths, *interp.library_dirs}, key=len)
    for path in (*folders, interp.executable, *([interp.loader] if interp.loader else [])):
        expose(path, args, bound, links)
    for folder in interp.paths:
        for name in MASKED:
            masked = os.path.join(folder, name)
            if os.path.isdir(masked):
                args += ["--tmpfs", masked, "--remount-ro", masked]
    return args


def command(
    bwrap: str,
    interp: Interpreter,
    harness: Sequence[tuple[int, str]],
    site_files: Sequence[tuple[int, str]],
    seccomp_fd: int,
    pids_dir: str | None,
    info_fd: int,
    block_fd: int,
) -> list[str]:
    """The full argv: bwrap's options, then the interpreter running the runner.

    ``harness``: (fd, path inside) of the runner's files; ``site_files``: likewise for each site file;
    ``seccomp_fd``: the sandbox's seccomp filter (raw BPF, :func:`dgrpo.sandbox.seccomp.sandbox_filter`),
    applied by bwrap to what it starts; ``info_fd``: where bwrap writes the sandbox's host pid; ``block_fd``:
    bwrap waits for one byte there before it starts anything, so that the parent can first place the sandbox
    in its pids cgroup.
    """
    args = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-add",
        "CAP_SYS_ADMIN",
        "--cap-add",
        "CAP_SETPCAP",
        "--clearenv",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "PYTHONHASHSEED",
        "0",
        "--setenv",
        "PYTHONDONTWRITEBYTECODE",
        "1",
        "--setenv",
        "LD_LIBRARY_PATH",
        ":".join(interp.library_dirs),
        *mounts_for(interp),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--dir",
        "/tmp",
        "--seccomp",
        str(seccomp_fd),
    ]
    for fd, inner in (*harness, *site_files):
        args += ["--ro-bind-data", str(fd), inner]
    if pids_dir:
        args += ["--ro-bind", pids_dir, PIDS]
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp"]
    args += ["--info-fd", str(info_fd), "--block-fd", str(block_fd)]
    return [*args, interp.executable, "-S", "-s", "-P", "-B", RUNNER]
