"""The sandbox code rewards run peers' programs in: choose the isolation once, then run batches.

Isolation is chosen when a sandbox is made, and a code task makes its sandbox when it is built, so a node or a
simulation that cannot isolate programs stops before its first round with an error naming the cause:

- ``bwrap`` (always, unless refused): :mod:`dgrpo.sandbox.bwrap`, probed by running one program;
- ``direct`` only when the operator passes ``unsafe_weak_sandbox`` (CLI ``--unsafe-weak-sandbox``): the
  runner on the host with rlimits, the pids cgroup, the audit hook and the namespaces this process may create.
  It does not isolate the filesystem, /proc or the node's user: a hostile program may read what the node's
  user can read and write where it can write. A loud warning says so at start.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dgrpo.errors import ConfigError
from dgrpo.sandbox import seccomp
from dgrpo.sandbox.batch import AnyJob, FunctionJob, run_batch
from dgrpo.sandbox.bwrap import MIN_BWRAP, bwrap_version, find_bwrap
from dgrpo.sandbox.cgroup import PidsCgroup
from dgrpo.sandbox.interpreter import InterpreterError, choose
from dgrpo.sandbox.launch import BwrapLauncher, DirectLauncher, Launcher
from dgrpo.sandbox.limits import SandboxLimits, SandboxResult

log = logging.getLogger(__name__)

SANDBOX_UID = 65534  # nobody: who runs the sandbox when the node is root
WEAK_FLAG = "--unsafe-weak-sandbox (task option unsafe_weak_sandbox = true)"
PROBE = "print(6 * 7)"
# What a working bwrap sandbox must report for its probe program.
REQUIRED = (
    *("mount_namespace", "pid_namespace", "net_namespace", "ipc_namespace"),
    *("no_capabilities", "no_new_privs", "seccomp"),
)


class SandboxUnavailableError(ConfigError):
    """Programs cannot be isolated here; the message names the cause and the flag that accepts less."""


def _refuse(cause: str) -> SandboxUnavailableError:
    return SandboxUnavailableError(
        f"cannot isolate peers' programs: {cause}. Code tasks refuse to run without OS-level isolation "
        f"(bubblewrap: apt-get install bubblewrap, as scripts/install.sh does). To accept the weaker sandbox "
        f"anyway (rlimits, audit hook and namespaces only; no filesystem isolation) pass {WEAK_FLAG}"
    )


_lock = threading.Lock()


@functools.lru_cache(maxsize=8)
def _bwrap_launcher(python: str | None) -> BwrapLauncher:
    """The probed bwrap launcher for this process (cached: probing costs one sandbox start)."""
    path = find_bwrap()
    if path is None:
        raise _refuse("bubblewrap (bwrap) is not installed")
    version = bwrap_version(path)
    if version is None or version < MIN_BWRAP:
        found = ".".join(map(str, version)) if version else "unknown"
        needed = ".".join(map(str, MIN_BWRAP))
        raise _refuse(f"{path} is version {found}; the sandbox needs {needed}+ (--disable-userns)")
    no_seccomp = seccomp.available()
    if no_seccomp is not None:
        raise _refuse(f"the seccomp filter cannot be compiled: {no_seccomp} (apt-get install libseccomp2)")
    root = os.geteuid() == 0
    uid, gid = (SANDBOX_UID, SANDBOX_UID) if root else (os.getuid(), os.getgid())
    try:
        interpreter = choose(python, uid, gid)
    except InterpreterError as exc:
        raise _refuse(str(exc)) from exc
    launcher = BwrapLauncher(path, interpreter, uid if root else None, gid if root else None)
    results, mechanisms = run_batch(launcher, SandboxLimits(), [], [(PROBE, "")])
    probe = results[0]
    missing = [m for m in REQUIRED if not mechanisms.get(m)]
    if not probe.ok or probe.stdout.strip() != "42" or missing:
        detail = probe.stderr.strip().splitlines()[-1:] or [f"missing {', '.join(missing)}"]
        raise _refuse(
            f"bwrap could not run a sandboxed program ({detail[0]}); user namespaces may be disabled "
            "(sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone, or an AppArmor policy)"
        )
    return launcher


def choose_launcher(unsafe_weak: bool, python: str | None) -> Launcher:
    """The bwrap sandbox, or, when it is unavailable and the operator said so explicitly, the weak one."""
    with _lock:
        try:
            return _bwrap_launcher(python)
        except SandboxUnavailableError as exc:
            if not unsafe_weak:
                raise
            log.warning("UNSAFE: running peers' programs WITHOUT OS-level isolation (%s was given): %s", WEAK_FLAG, exc)
            return DirectLauncher()


def outcome(result: SandboxResult) -> str:
    """One word for how a run ended, for counters."""
    if result.ok:
        return "ok"
    if result.limit is not None:
        return result.limit
    return "incomplete" if result.returncode == 0 else "failed"


class Sandbox:
    """Runs untrusted Python source under :class:`SandboxLimits`. ``run`` and ``run_many`` never raise for
    program faults; making a sandbox raises :class:`SandboxUnavailableError` when it cannot isolate."""

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        extra_paths: Sequence[Path] = (),
        *,
        unsafe_weak: bool = False,
        python: str | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.extra_paths = [Path(p).resolve() for p in extra_paths]
        for path in self.extra_paths:
            if not path.is_dir():
                raise ConfigError(f"sandbox extra path {path} is not a directory")
        self.launcher = choose_launcher(unsafe_weak, python)
        self._mechanisms: dict[str, bool] = {}
        self._outcomes: Counter[str] = Counter()
        self._stats_lock = threading.Lock()

    @property
    def isolated(self) -> bool:
        """Whether programs run in the bwrap sandbox (False: the operator's weak direct mode)."""
        return self.launcher.name == "bwrap"

    def run(self, source: str, stdin: str = "") -> SandboxResult:
        """Run ``source`` as ``__main__`` with ``stdin`` on standard input."""
        return self.run_jobs([(source, stdin)])[0]

    def run_many(self, sources: Sequence[str], max_workers: int | None = None) -> list[SandboxResult]:
        """Run several programs; results in the order of ``sources``."""
        return self.run_jobs([(s, "") for s in sources], max_workers)

    def run_functions(self, jobs: Sequence[FunctionJob], max_workers: int | None = None) -> list[SandboxResult]:
        """Run function jobs (an untrusted solution called by trusted tests from another process); a result
        is ``ok`` only when the tests' ``check`` returned."""
        return self.run_jobs(jobs, max_workers)

    def run_jobs(self, jobs: Sequence[AnyJob], max_workers: int | None = None) -> list[SandboxResult]:
        """Run jobs (``(source, stdin)`` programs or :class:`FunctionJob`) in batches: one sandbox per worker,
        its jobs one after another, each in namespaces of its own (so no job sees another's processes, files
        or output)."""
        if max_workers is not None and max_workers < 1:
            raise ConfigError(f"max_workers must be at least 1, got {max_workers}")
        if not jobs:
            return []
        workers = min(len(jobs), max_workers or os.cpu_count() or 1)
        chunks = [list(range(w, len(jobs), workers)) for w in range(workers)]

        def one(indices: list[int]) -> list[SandboxResult]:
            results, mechanisms = run_batch(self.launcher, self.limits, self.extra_paths, [jobs[i] for i in indices])
            if mechanisms:
                self._mechanisms = mechanisms
            return results

        if workers == 1:
            batches = [one(chunks[0])]
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
                batches = list(pool.map(one, chunks))
        out: list[SandboxResult | None] = [None] * len(jobs)
        for indices, results in zip(chunks, batches, strict=True):
            for i, result in zip(indices, results, strict=True):
                out[i] = result
        done = [r for r in out if r is not None]
        with self._stats_lock:
            self._outcomes.update(outcome(r) for r in done)
            self._outcomes["batches"] += len(chunks)
        return done

    def statistics(self) -> dict[str, int]:
        """Runs so far by outcome (``ok``, a limit's name, ``incomplete``: ended before its end,
        ``failed``: raised or exited non-zero) and ``batches`` (sandboxes started)."""
        with self._stats_lock:
            return dict(self._outcomes)

    def capabilities(self) -> dict[str, bool | str | int]:
        """Which isolation mechanisms are active here (a trivial program is run to read them)."""
        probe = self.run("pass")
        caps: dict[str, bool | str | int] = {**self.launcher.describe(), **self._mechanisms, "probe_ok": probe.ok}  # type: ignore[dict-item]
        caps["runs_as_root"] = os.geteuid() == 0
        cgroup = PidsCgroup.parent_dir()
        caps["pids_cgroup"] = cgroup is not None
        caps["cgroup_dir"] = str(cgroup) if cgroup else ""
        return caps
