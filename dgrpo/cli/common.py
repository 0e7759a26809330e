"""What every ``dgrpo`` command shares: the app, the console, error handling in one place, option types."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, ConsoleDimensions

from dgrpo.errors import ConfigError, DgrpoError

# An unexpected exception is a bug and keeps its traceback, but a short one without local variables: those hold
# settings and key objects, and pages of them bury the error (the `--debug` callback turns them back on).
app = typer.Typer(
    help="dgrpo: decentralised GRPO nodes, attacks and defenses.\n\nExample: dgrpo scenarios, then dgrpo simulate "
    "text-horizontal --defense logit (each command's --help has its own examples)",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    pretty_exceptions_short=True,
)


class _Console(Console):
    """Rich's console, but where output is not a terminal (a pipe, a file, CI's log) it does not pretend to be
    80 columns wide: tables keep every column and every row on one line, whatever their width, so that output
    read by a program or grepped is never wrapped or cut with an ellipsis."""

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)  # type: ignore[attr-defined]
        return size if self.is_terminal else ConsoleDimensions(PLAIN_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


PLAIN_WIDTH = 10_000
console = _Console()
F = TypeVar("F", bound=Callable[..., Any])


def command(group: typer.Typer, name: str | None = None) -> Callable[[F], F]:
    """Register a command of ``group`` whose dgrpo errors become one line and exit status 2."""

    def register(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except DgrpoError as exc:
                console.print(f"[red]error:[/] {exc}")
                raise typer.Exit(2) from None

        group.command(name)(wrapper)
        return fn

    return register


def defense_chain(spec: str) -> list[str]:
    """``--defense a,b``: the chain's names, each a registered defense (else an error listing them)."""
    from dgrpo.config import parse_defense_spec
    from dgrpo.defense import DEFENSES

    chain = parse_defense_spec(spec)
    unknown = [d for d in chain if d not in DEFENSES]
    if unknown:
        raise ConfigError(f"unknown defense {unknown[0]!r}; valid: {', '.join(DEFENSES.names())}")
    return chain


WEAK_SANDBOX = "task.options.unsafe_weak_sandbox=true"
WeakSandboxOption = Annotated[
    bool,
    typer.Option(
        "--unsafe-weak-sandbox",
        help="UNSAFE: where bubblewrap is unavailable, run peers' programs (code tasks) without OS-level "
        "isolation instead of refusing to start",
    ),
]


SetOption = Annotated[list[str] | None, typer.Option("--set", "-s", help="override a setting, e.g. -s learner.lr=1e-4")]


def daemon_logging() -> None:
    """A daemon's logging: dgrpo's INFO lines, in the format the command line chose (human or JSON), with
    py-libp2p's warnings about peers that hung up at DEBUG (:mod:`dgrpo.daemon.log_setup`)."""
    from dgrpo.daemon.log_setup import configure

    configure(daemon=True)
