"""The sandbox for peers' programs (code rewards): OS-level isolation with bubblewrap, batched.

- :mod:`~dgrpo.sandbox.sandbox`: :class:`Sandbox`, choosing the isolation (refusing to run without one);
- :mod:`~dgrpo.sandbox.bwrap`: what the sandbox is (the bwrap command line);
- :mod:`~dgrpo.sandbox.interpreter`: the interpreter programs run under and what of the host it needs;
- :mod:`~dgrpo.sandbox.launch`: starting a batch's runner, in bwrap or (weak, explicit) on the host;
- :mod:`~dgrpo.sandbox.seccomp`: the seccomp filters (libseccomp), for the sandbox and for each program;
- :mod:`~dgrpo.sandbox.batch`: one batch, from jobs (programs, :class:`FunctionJob`) to results;
- inside the sandbox (standard library only, copied in): :mod:`~dgrpo.sandbox.runner` (the fork server and
  the keepers: per-job namespaces, limits, what decides a result), :mod:`~dgrpo.sandbox.confine` (how each
  process confines itself), :mod:`~dgrpo.sandbox.program` (a program job), :mod:`~dgrpo.sandbox.function`
  (a function job's tests' and candidate's processes), :mod:`~dgrpo.sandbox.plain` (the strict codec of
  what crosses between them), :mod:`~dgrpo.sandbox.frames` (framing on pipes);
- :mod:`~dgrpo.sandbox.cgroup`: the per-batch pids cgroup; :mod:`~dgrpo.sandbox.limits`: limits and results.

README, "Security", says what this guarantees and what it does not; docs/sandbox.md gives the threat model.
"""

from dgrpo.sandbox.batch import FunctionJob
from dgrpo.sandbox.limits import SandboxLimits, SandboxResult
from dgrpo.sandbox.sandbox import Sandbox, SandboxUnavailableError
from dgrpo.sandbox.site import SANDBOX_SITE, site_paths

__all__ = [
    "SANDBOX_SITE",
    "FunctionJob",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "site_paths",
]
