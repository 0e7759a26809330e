"""The task registry. Look tasks up by name with :func:`get_task`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dgrpo.registry import Registry

if TYPE_CHECKING:
    from dgrpo.tasks.base import Task

TASKS: Registry[type[Task]] = Registry("task")


def get_task(name: str, **options: Any) -> Task:
    """Instantiate the task registered as ``name`` (e.g. ``arith``, ``gsm8k``, ``arith-code``, ``humaneval``)."""
    import dgrpo.tasks  # noqa: F401  (registers the built-in tasks)

    return TASKS.get(name)(**options)
