"""Inside the sandbox: the program process of a program job. It confines itself (:mod:`confine`), runs one
untrusted program as ``__main__``, and ends as the interpreter would. Standard library only; copied into the
sandbox beside :mod:`runner`, which forks it through a keeper.

Nothing this process holds decides its reward. What the keeper takes from it is what it observes from
outside: the exit status (``wait4``), the limits hit, and the program's stdout and stderr (memfds the keeper
reads after the process is gone). A program that exits early after printing its answer has printed that
answer: for a stdout task that is a correct program (docs/sandbox.md, "Threat model"). Tests of a function
run in another process (:mod:`function`), never in this one.

The report pipe (fd 3) carries only the ``setup`` line, written before the program runs, and is closed
before the program runs: the program holds its stdin, stdout and stderr, nothing else.

``try``/``except``/``pass`` rather than ``contextlib.suppress``: a per-run import saved (``noqa: SIM105``).
"""

from __future__ import annotations

import atexit
import builtins
import os
import sys

# The confinement sits beside this file: in the node a package module, in the sandbox a file.
try:
    from dgrpo.sandbox import confine
except ImportError:  # inside the sandbox: imported by the runner from its own folder
    import confine  # type: ignore[no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, NoReturn

EXIT_MEMORY, EXIT_PROCESSES, EXIT_SETUP = confine.EXIT_MEMORY, confine.EXIT_PROCESSES, confine.EXIT_SETUP
EXIT_CPU, EXIT_FLUSH = confine.EXIT_CPU, confine.EXIT_FLUSH


def report_exception(exc: BaseException) -> None:
    """Print a traceback as an uncaught exception would, without the harness's own frames."""
    try:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "solution.py":
            tb = tb.tb_next
        sys.excepthook(type(exc), exc, tb)
    except BaseException:  # e.g. MemoryError while formatting: the exit code still says what happened
        pass


def exit_code(code: object) -> int:
    """The process exit status ``raise SystemExit(code)`` would give."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:  # noqa: SIM105
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def exit_process(code: int) -> NoReturn:
    """End the process as interpreter shutdown would: non-daemon threads joined, ``atexit`` run, output
    flushed (a failure there makes a clean exit a failed one), then ``os._exit``."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException as exc:
        report_exception(exc)
        code = code or 1
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            code = code or EXIT_FLUSH
    os._exit(code)


def fresh_main() -> Any:
    """A ``__main__`` module of the program's own (not the runner's), installed in ``sys.modules``."""
    main = type(sys)("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    return main


def execute(source: str, namespace: dict[str, Any], must_finish: bool = False) -> int:
    """Run ``source`` in ``namespace``; the exit status it asks for (0 when it ran to its end). With
    ``must_finish`` (a function job's solution, which must load before it is called) leaving early is a
    failure whatever status it asks for."""
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
    except SystemExit as exc:
        return exit_code(exc.code) or int(must_finish)
    except MemoryError as exc:
        report_exception(exc)
        return EXIT_MEMORY
    except BlockingIOError as exc:  # fork or thread creation refused: the process limit
        report_exception(exc)
        return EXIT_PROCESSES
    except BaseException as exc:
        report_exception(exc)
        return 1
    return 0


def run(
    config: dict[str, Any],
    source_span: tuple[int, int],
    stdin_span: tuple[int, int],
    fds: tuple[int, int, int, int],
    mask: Iterable[int],
    mechanisms: dict[str, bool],
    workdir: str,
) -> NoReturn:
    """The forked program process: read its own source and stdin from the batch's memfd, confine (which
    closes that memfd), then run the program. Always ends the process."""
    [source] = confine.enter(config, (source_span,), fds, mask, mechanisms, workdir, stdin_span=stdin_span)
    main = fresh_main()
    exit_process(execute(source, main.__dict__))
