"""What one sandboxed run may use, and how it ended."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dgrpo.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
MIN_MEMORY_BYTES = 64 * MiB  # below this the interpreter itself cannot start: every run would fail


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. ``max_processes`` counts the program's processes and threads, itself included;
    ``tmpfs_bytes`` bounds each of its private ``/tmp`` and ``/dev/shm`` (memory, gone when it ends)."""

    cpu_seconds: float = 2.0
    wall_seconds: float = 5.0
    memory_bytes: int = 512 * MiB
    max_processes: int = 16
    max_output_bytes: int = 64 * KiB
    max_file_bytes: int = 1 * MiB
    tmpfs_bytes: int = 16 * MiB

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigError(f"sandbox {name} must be a finite number, got {value!r}")
            if value <= 0:
                raise ConfigError(f"sandbox {name} must be positive, got {value!r}")
        for name in ("memory_bytes", "max_processes", "max_output_bytes", "max_file_bytes", "tmpfs_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"sandbox {name} must be a positive integer, got {value!r}")
        if self.memory_bytes < MIN_MEMORY_BYTES:
            raise ConfigError(f"sandbox memory_bytes must be at least {MIN_MEMORY_BYTES} (the interpreter's own)")
        if self.max_output_bytes > self.max_file_bytes:
            raise ConfigError("sandbox max_output_bytes cannot exceed max_file_bytes (output goes to files)")


@dataclass(frozen=True)
class SandboxResult:
    """How a job ended.

    ``ok``: it exited 0, hit no limit and confirmed its confinement; for a function job, also the tests'
    process reported that ``check`` returned (an early exit of the solution fails its calls, so its tests).
    A program job is judged by what it printed: an early ``exit(0)`` after printing is a clean end.
    ``limit`` names the limit that was hit (``wall``, ``cpu``, ``memory``, ``processes``, ``output``), or
    ``setup`` when the sandbox itself failed. ``stdout``/``stderr`` hold at most ``max_output_bytes`` each
    (a function job's: the candidate's, then the tests' report after ``[tests]``).
    """

    ok: bool
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    limit: str | None
    wall_seconds: float
