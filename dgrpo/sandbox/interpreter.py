"""The Python interpreter programs run under, and what of the host it needs inside the sandbox.

The sandbox binds read-only exactly this: the interpreter binary, its standard library folders (``sys.path``
under ``-S``: no site-packages), the folders of the shared libraries it and its extension modules load, and
the ELF loader it names. They are found by running the candidate interpreter itself (trusted code, outside
the sandbox): it imports every extension module of its standard library and lists what it mapped.

bwrap runs as the unprivileged sandbox user, so every one of those paths must be reachable by that user. A
node's own interpreter often is not (pyenv under ``/root``, mode 0700): then Debian's ``/usr/bin/python3`` is
used, or whatever ``[sandbox] python`` names.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dgrpo.errors import ConfigError

SYSTEM_PYTHON = "/usr/bin/python3"
MIN_VERSION = (3, 11)  # the runner uses -P (3.11) and marshal/os calls of 3.9+

# Run by the candidate interpreter: its stdlib folders, version and every shared object it maps once all its
# extension modules are imported (one JSON line on stdout).
_DESCRIBE = r"""
import json, os, sys
paths = [p for p in sys.path if p and os.path.isdir(p)]
for folder in paths:
    for name in sorted(os.listdir(folder)):
        if name.endswith(".so"):
            try:
                __import__(name.split(".")[0])
            except BaseException:
                pass
libs = set()
with open("/proc/self/maps") as fh:
    for line in fh:
        path = line.split()[-1]
        if path.startswith("/") and ".so" in os.path.basename(path):
            libs.add(path)
print(json.dumps({"executable": os.path.realpath(sys.executable), "paths": paths,
                  "libs": sorted(libs), "version": list(sys.version_info[:2])}))
"""


@dataclass(frozen=True)
class Interpreter:
    executable: str  # resolved path
    version: tuple[int, int]
    paths: tuple[str, ...]  # standard library folders
    library_dirs: tuple[str, ...]  # folders of the shared objects it maps (resolved)
    loader: str | None  # the ELF interpreter the binary names (PT_INTERP), unresolved

    def needed(self) -> tuple[str, ...]:
        """Every host path the sandbox must expose (read-only) for this interpreter to run."""
        return (self.executable, *self.paths, *self.library_dirs, *([self.loader] if self.loader else []))


class InterpreterError(ConfigError):
    """No usable interpreter for the sandbox."""


@functools.lru_cache(maxsize=8)
def describe(executable: str) -> Interpreter:
    """Run ``executable`` to learn what it needs (cached per process). Raises InterpreterError."""
    try:
        proc = subprocess.run(
            [executable, "-S", "-s", "-E", "-c", _DESCRIBE],
            capture_output=True,
            text=True,
            timeout=120,
            env={"LANG": "C.UTF-8"},
            cwd="/",
            check=False,
        )
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise InterpreterError(f"cannot run {executable} to describe it: {exc}") from exc
    version = (int(info["version"][0]), int(info["version"][1]))
    if version < MIN_VERSION:
        raise InterpreterError(f"{executable} is Python {version[0]}.{version[1]}; the sandbox needs 3.11+")
    paths = tuple(str(p) for p in info["paths"])
    lib_dirs = sorted({os.path.dirname(os.path.realpath(p)) for p in info["libs"]})
    # Folders under the standard library (lib-dynload) are bound with it.
    lib_dirs = [d for d in lib_dirs if not any(d == p or d.startswith(p + "/") for p in paths)]
    return Interpreter(str(info["executable"]), version, paths, tuple(lib_dirs), elf_interpreter(info["executable"]))


# ELF layout by class: (word format, offset of e_phoff, of e_phentsize, of p_offset, of p_filesz).
_ELF = {1: ("I", 28, 42, 4, 16), 2: ("Q", 32, 54, 8, 32)}
PT_INTERP = 3


def elf_interpreter(path: str) -> str | None:
    """The PT_INTERP path of an ELF executable (its dynamic loader, as the binary names it), or None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)  # program headers and the loader's name sit at the start
        if head[:4] != b"\x7fELF" or head[4] not in _ELF:
            return None
        word, phoff_at, phentsize_at, offset_at, size_at = _ELF[head[4]]
        order = "<" if head[5] == 1 else ">"
        phoff = struct.unpack_from(order + word, head, phoff_at)[0]
        phentsize, phnum = struct.unpack_from(order + "HH", head, phentsize_at)
        for i in range(phnum):
            entry = phoff + i * phentsize
            if struct.unpack_from(order + "I", head, entry)[0] == PT_INTERP:
                offset = struct.unpack_from(order + word, head, entry + offset_at)[0]
                size = struct.unpack_from(order + word, head, entry + size_at)[0]
                return head[offset : offset + size].rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def unreachable_part(path: str, uid: int, gid: int) -> str | None:
    """The first component of ``path`` that user ``uid``/``gid`` cannot pass (search a folder, read the
    end), or None when the whole path is reachable. Follows symlinks as the kernel would."""
    if uid == 0:
        return None
    current = Path("/")
    for part in Path(os.path.realpath(path)).parts[1:]:
        if not _allows(current, uid, gid, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
            return str(current)
        current = current / part
    if not _allows(current, uid, gid, stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH):
        return str(current)
    return None


def _allows(path: Path, uid: int, gid: int, user_bit: int, group_bit: int, other_bit: int) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_uid == uid:
        return bool(st.st_mode & user_bit)
    if st.st_gid == gid:
        return bool(st.st_mode & group_bit)
    return bool(st.st_mode & other_bit)


def candidates(configured: str | None) -> list[str]:
    """Interpreters to try, best first: the configured one, else the node's own, then Debian's."""
    if configured:
        return [configured]
    own = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return [own] + ([SYSTEM_PYTHON] if os.path.realpath(SYSTEM_PYTHON) != own else [])


def choose(configured: str | None, uid: int, gid: int) -> Interpreter:
    """The first candidate the sandbox user can reach entirely; InterpreterError says why none can."""
    reasons = []
    for executable in candidates(configured):
        if not os.path.exists(executable):
            reasons.append(f"{executable} does not exist")
            continue
        try:
            interp = describe(executable)
        except InterpreterError as exc:
            reasons.append(str(exc))
            continue
        blocked = [(p, part) for p in interp.needed() if (part := unreachable_part(p, uid, gid))]
        if not blocked:
            return interp
        path, part = blocked[0]
        reasons.append(f"{executable}: the sandbox user (uid {uid}) cannot reach {path} (blocked at {part})")
    raise InterpreterError(
        "no Python interpreter the sandbox can run: "
        + "; ".join(reasons)
        + f". Install Debian's python3 ({SYSTEM_PYTHON}) or name one with [sandbox] python"
    )
