"""Libraries that code completions may import inside the sandbox, beyond the standard library.

The sandbox runs an isolated interpreter (no site-packages); the folder :data:`SANDBOX_SITE` is added to its
``sys.path``. It holds ``calc``, the attacker-owned library of the paper's CODE attack, modelling a package
the victim already has installed (the attack only works when the import succeeds and the program still
prints the right answer). A task option ``site=False`` runs programs without it.
"""

from __future__ import annotations

from pathlib import Path

SANDBOX_SITE = Path(__file__).resolve().parent.parent / "assets" / "sandbox_site"


def site_paths(enabled: bool) -> list[Path]:
    return [SANDBOX_SITE] if enabled else []
