"""Inside the sandbox: the two halves of a function job (HumanEval and any task whose reward is a test suite
calling one function). Standard library only; copied into the sandbox beside :mod:`runner`.

The tests and the candidate never share an interpreter. The keeper forks:

- **the tests' process** (:func:`run_tests`): trusted code only. It runs the task's own test source (the
  prompt's helpers and ``def check(candidate)``) and calls ``check`` with a stand-in for the candidate's
  function that sends each call's arguments across a pipe and decodes the answer with the strict plain-data
  codec (:mod:`plain`). Every comparison the tests make is between exact builtin values, so nothing of the
  candidate's (an ``__eq__``, ``__hash__``, ``__repr__``, ``__del__``, a patched builtin) runs here. When
  ``check`` returns, and only then, it writes ``passed`` on its report pipe, which only it holds: that is
  the verdict the keeper reads;
- **the candidate's process** (:func:`run_candidate`), in a PID namespace of its own: it runs the untrusted
  solution as ``__main__``, says ``ready``, then answers calls until the tests' process closes the pipe.
  Whatever it does to its own interpreter (walk its frames, patch builtins, exit, write on its fds) changes
  only the values it sends back, which is what any program may do: answer.

Calls (frames of :mod:`frames`, values of :mod:`plain`): the tests send ``("call", seq, args, kwargs)``; the
candidate answers ``("return", seq, value)``, ``("raise", seq, builtin_name, message)`` or
``("refused", seq, why)`` (its value is not plain data). Anything else, a sequence number out of turn, an
oversized frame or the pipe closing fails the call: the stand-in raises :class:`CandidateError`, which no
test expects, so ``check`` fails. A raised builtin error of :data:`RAISABLE` is re-raised as a subclass of
both that class and :class:`CandidateError` (a test expecting ``ValueError`` still sees one); never
``StopIteration`` or ``GeneratorExit``, which would silently end a test's loop.

``try``/``except``/``pass`` rather than ``contextlib.suppress``: a per-run import saved (``noqa: SIM105``).
"""

from __future__ import annotations

import builtins
import os
import sys

# The other harness files sit beside this one: in the node package modules, in the sandbox files.
try:
    from dgrpo.sandbox import confine, frames, plain, program
except ImportError:  # inside the sandbox: imported by the runner from its own folder
    import confine  # type: ignore[no-redef]
    import frames  # type: ignore[no-redef]
    import plain  # type: ignore[no-redef]
    import program  # type: ignore[no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, NoReturn

CALL_FD = 4  # tests -> candidate (the tests write, the candidate reads)
RESULT_FD = 5  # candidate -> tests
PASSED = b"passed\n"
MAX_MESSAGE = 200
# Builtin errors a candidate's raise is carried as (by name; the tests' side looks the class up itself).
RAISABLE = frozenset(
    {"ArithmeticError", "AssertionError", "AttributeError", "IndexError", "KeyError", "LookupError"}
    | {"NotImplementedError", "OverflowError", "RecursionError", "RuntimeError", "TypeError", "ValueError"}
    | {"ZeroDivisionError"}
)


class CandidateError(Exception):
    """A call to the candidate failed: it raised, answered with something that is not plain data or out of
    turn, or its process is gone."""


# ---------------------------------------------------------------------------------------------- tests' side
_raised_classes: dict[str, type[CandidateError]] = {}


def _raised(name: object, message: object) -> CandidateError:
    """The exception a candidate's raise becomes on the tests' side (decoded values only)."""
    text = message[:MAX_MESSAGE] if type(message) is str else ""
    if type(name) is not str or name not in RAISABLE:
        return CandidateError(f"the candidate raised: {text}")
    cls = _raised_classes.get(name)
    if cls is None:
        cls = _raised_classes[name] = type(f"Candidate{name}", (CandidateError, getattr(builtins, name)), {})
    return cls(text)


class Calls:
    """The tests' end of the call pipes: one call at a time, each answer decoded strictly."""

    def __init__(self, call_fd: int = CALL_FD, result_fd: int = RESULT_FD) -> None:
        self.call_fd = call_fd
        self.results = frames.FrameReader(result_fd, plain.MAX_BYTES)
        self.seq = 0

    def _read(self) -> Any:
        try:
            frame = self.results.read()
        except (EOFError, OSError) as exc:
            raise CandidateError(f"the candidate's answer was cut short or too large: {exc}") from None
        if frame is None:
            raise CandidateError("the candidate's process is gone")
        try:
            return plain.decode(frame)
        except plain.PlainDataError as exc:
            raise CandidateError(f"the candidate's answer is not plain data: {exc}") from None

    def wait_ready(self) -> None:
        """Return once the candidate's solution has loaded; :class:`CandidateError` if it never does."""
        if self._read() != ("ready",):
            raise CandidateError("the candidate's solution did not load")

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.seq += 1
        try:
            request = plain.encode(("call", self.seq, args, kwargs))
        except plain.PlainDataError as exc:
            raise CandidateError(f"the tests passed a value that is not plain data: {exc}") from None
        try:
            frames.write_frame(self.call_fd, request)
        except OSError:
            raise CandidateError("the candidate's process is gone") from None
        reply = self._read()
        if type(reply) is not tuple or len(reply) < 2 or type(reply[1]) is not int or reply[1] != self.seq:
            raise CandidateError("the candidate answered out of turn")
        kind = reply[0]
        if kind == "return" and len(reply) == 3:
            return reply[2]
        if kind == "raise" and len(reply) == 4:
            raise _raised(reply[2], reply[3])
        if kind == "refused" and len(reply) == 3:
            why = reply[2][:MAX_MESSAGE] if type(reply[2]) is str else ""
            raise CandidateError(f"the candidate's value crossed no boundary: {why}")
        raise CandidateError("the candidate's answer is malformed")

    def stand_in(self, name: str) -> Any:
        """The function the tests call in place of the candidate's."""

        def candidate(*args: Any, **kwargs: Any) -> Any:
            return self.call(args, kwargs)

        candidate.__name__ = candidate.__qualname__ = name
        return candidate


def run_tests(
    config: dict[str, Any],
    tests_span: tuple[int, int],
    entry_point: str,
    fds: tuple[int, ...],
    mask: Iterable[int],
    mechanisms: dict[str, bool],
    workdir: str,
) -> NoReturn:
    """The tests' process: read the tests (from the batch's memfd: no other process of the job holds them),
    confine, load them, wait for the candidate, run ``check``; ``passed`` on the report pipe only if
    ``check`` returned. Always ends the process."""
    [tests] = confine.enter(
        config, (tests_span,), fds, mask, mechanisms, workdir, nproc_extra=1, own_mounts=False, keep_report=True
    )
    code = 1
    try:
        namespace: dict[str, Any] = {"__name__": "__tests__", "__builtins__": builtins}
        exec(compile(tests, "tests.py", "exec", optimize=0), namespace)  # optimize=0: asserts are the tests
        calls = Calls()
        calls.wait_ready()
        candidate = namespace[entry_point] = calls.stand_in(entry_point)  # tests that name it, not candidate
        namespace["check"](candidate)
        os.write(confine.REPORT_FD, PASSED)
        code = 0
    except BaseException as exc:
        try:  # the interpreter's own display: no traceback module to import per failed job
            sys.excepthook(type(exc), exc, exc.__traceback__)
            sys.stderr.flush()
        except BaseException:
            pass
    os._exit(code)


# ---------------------------------------------------------------------------------------------- candidate
def _builtin_error(exc: BaseException) -> str:
    """The nearest builtin error class of ``exc`` that crosses (a ValueError subclass goes as ValueError)."""
    for cls in type(exc).__mro__:
        name = type.__dict__["__name__"].__get__(cls)
        if name in RAISABLE and getattr(builtins, name, None) is cls:
            return str(name)
    return ""


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException:
        return ""
    return text[:MAX_MESSAGE] if type(text) is str else ""


def serve(namespace: dict[str, Any], entry_point: str) -> None:
    """Answer the tests' calls with ``namespace[entry_point]`` until they close the pipe."""
    frames.write_frame(RESULT_FD, plain.encode(("ready",)))
    requests = frames.FrameReader(CALL_FD, plain.MAX_BYTES)
    while True:
        frame = requests.read()
        if frame is None:
            return
        _, seq, args, kwargs = plain.decode(frame)  # from the trusted tests' process
        try:
            value = namespace[entry_point](*args, **kwargs)
        except Exception as exc:
            reply = plain.encode(("raise", seq, _builtin_error(exc), _message(exc)))
        else:
            try:
                reply = plain.encode(("return", seq, value))
            except plain.PlainDataError as exc:
                reply = plain.encode(("refused", seq, str(exc)))
            del value  # its __del__, if any, runs here, in this process
        frames.write_frame(RESULT_FD, reply)


def run_candidate(
    config: dict[str, Any],
    solution_span: tuple[int, int],
    entry_point: str,
    fds: tuple[int, ...],
    mask: Iterable[int],
    mechanisms: dict[str, bool],
    workdir: str,
) -> NoReturn:
    """The candidate's process: read its solution, confine, run it as ``__main__``, then serve calls.
    Always ends the process."""
    [solution] = confine.enter(config, (solution_span,), fds, mask, mechanisms, workdir, nproc_extra=1)
    main = program.fresh_main()
    code = program.execute(solution, main.__dict__, must_finish=True)
    if code == 0:
        try:
            serve(main.__dict__, entry_point)
        except BaseException as exc:  # the solution's own doing (SystemExit from the function included)
            code = program.exit_code(exc.code) if isinstance(exc, SystemExit) else 1
    program.exit_process(code)
