"""The sandbox for peers' programs (code rewards): OS-level isolation with bubblewrap, batched.

- :mod:`~dgrpo.sandbox.sandbox`: :class:`Sandbox`, choosing the isolation (refusing to run without one);
- :mod:`~dgrpo.sandbox.bwrap`: what the sandbox is (the bwrap command line);
- :mod:`~dgrpo.sandbox.interpreter`: the interpreter programs run under and what of the host it needs;
- :mod:`~dgrpo.sandbox.launch`: starting a batch's runner, in bwrap or (weak, explicit) on the host;
- :mod:`~dgrpo.sandbox.batch`: one batch, from programs to results;
- :mod:`~dgrpo.sandbox.runner`: inside: per-program namespaces, limits, the audit hook, the completion secret;
- :mod:`~dgrpo.sandbox.cgroup`: the per-batch pids cgroup; :mod:`~dgrpo.sandbox.limits`: limits and results.

README, "Security", says what this guarantees and what it does not.
"""

from dgrpo.sandbox.limits import SandboxLimits, SandboxResult
from dgrpo.sandbox.sandbox import Sandbox, SandboxUnavailableError
from dgrpo.sandbox.site import SANDBOX_SITE, site_paths

__all__ = ["SANDBOX_SITE", "Sandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailableError", "site_paths"]
