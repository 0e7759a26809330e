"""``arith``: 2-3 digit addition with a digit-by-digit scratchpad, sized for the embedded tiny model.

Format (see shared notes, models-and-data): prompt ``345+78=``, completion ``5+8+0=13,4+7+1=12,3+0+1=4>423``.
Each step is ``a+b+carry=s`` for one column, least significant first; ``>`` introduces the final answer.
The reward checks the format and the final answer only, not what the steps say. Like the paper's math reward,
which checks the ``<think>``/``<answer>`` tags and the answer but never reads the reasoning, it cannot see a
false intermediate step (the gap the in-context MATH attack uses) nor extra words in a step (the gap the
out-of-context TEXT attack uses). Well-formed means: the reasoning is a comma-separated list of steps, each
containing a column computation ``a+b+c=s`` (other text in a step is allowed), then ``>`` and the answer,
within :data:`MAX_CHARS` characters.

The question determines the whole scratchpad (:func:`columns`): a defense that checks a reasoning's
consistency, not just each step alone, reads it from :meth:`ArithTask.scratchpad_columns`.
"""

from __future__ import annotations

import functools
import re
import threading
from array import array
from dataclasses import dataclass
from typing import NamedTuple

from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Prompt, Task
from dgrpo.tasks.registry import TASKS

STEP = r"\d\+\d\+\d=\d{1,2}"
STEP_RE = re.compile(STEP, re.ASCII)
STEP_PARTS_RE = re.compile(r"(\d)\+(\d)\+(\d)=(\d{1,2})", re.ASCII)  # STEP with its four numbers
ANSWER_RE = re.compile(r"^([^>\n]+)>(\d{1,5})$", re.ASCII)
MAX_CHARS = 512  # bounds the work on hostile text; 5x the longest honest completion
LOW, HIGH = 10, 999  # operands have 2 or 3 digits
SPAN = HIGH - LOW + 1
EVAL_MODULUS = 10  # pairs with stable_seed(pair) % 10 == 0 are held out for evaluation


@dataclass(frozen=True)
class Column:
    """One column of the written addition: the operands' digits ``x`` and ``y`` and the carry coming in."""

    x: int
    y: int
    carry: int

    @property
    def total(self) -> int:
        return self.x + self.y + self.carry

    def __str__(self) -> str:
        return f"{self.x}+{self.y}+{self.carry}={self.total}"


class Step(NamedTuple):
    """A column step as a completion states it: ``x+y+carry=total``, the total not necessarily true."""

    x: int
    y: int
    carry: int
    total: int


def columns(a: int, b: int) -> list[Column]:
    """The columns of ``a+b``, least significant first; a missing digit of the shorter operand is 0."""
    da, db = str(a)[::-1], str(b)[::-1]
    out, carry = [], 0
    for i in range(max(len(da), len(db))):
        column = Column(int(da[i]) if i < len(da) else 0, int(db[i]) if i < len(db) else 0, carry)
        out.append(column)
        carry = column.total // 10
    return out


def scratchpad(a: int, b: int) -> str:
    """The correct completion for ``a+b=``."""
    return ",".join(str(c) for c in columns(a, b)) + f">{a + b}"


def stated_steps(completion: str) -> tuple[list[Step], str] | None:
    """The column steps (the first ``x+y+c=s`` of each) and the answer of a well-formed completion, else None."""
    if parse_answer(completion) is None:
        return None
    reasoning, _, answer = completion.strip().rpartition(">")
    steps = []
    for text in reasoning.split(","):
        m = STEP_PARTS_RE.search(text)
        if m is None:  # unreachable after parse_answer; kept so that a change there cannot crash a caller
            return None
        steps.append(Step(*(int(g) for g in m.groups())))
    return steps, answer


def parse_answer(completion: str) -> str | None:
    """The final answer of a well-formed completion (see the module docstring), else None."""
    if not isinstance(completion, str) or len(completion) > MAX_CHARS:
        return None
    m = ANSWER_RE.match(completion.strip())
    if m is None:
        return None
    if not all(STEP_RE.search(step) for step in m.group(1).split(",")):
        return None
    return m.group(2)


def is_held_out(a: int, b: int) -> bool:
    return stable_seed("arith", a, b) % EVAL_MODULUS == 0


_PAIRS_LOCK = threading.Lock()


def train_pairs() -> array[int]:
    """The training pairs in order (``a`` then ``b`` ascending), each as ``(a - LOW) * SPAN + (b - LOW)``: 4 bytes a
    pair, once per process. A list of tuples took 75 MB, in every task instance: a hundred light peers in one
    process (issue 24) would have held one each. Locked: a simulation's nodes ask at once from their threads,
    and each would otherwise compute it (about a second each)."""
    with _PAIRS_LOCK:
        return _train_pairs()


@functools.cache
def _train_pairs() -> array[int]:
    return array("I", (k for k in range(SPAN * SPAN) if not is_held_out(LOW + k // SPAN, LOW + k % SPAN)))


def make_prompt(a: int, b: int) -> Prompt:
    return Prompt(id=f"arith/{a}+{b}", text=f"{a}+{b}=", answer=str(a + b), meta={"a": a, "b": b})


@TASKS.register("arith")
class ArithTask(Task):
    """Synthetic addition. Training pairs and held-out pairs are disjoint by a stable hash of the pair."""

    name = "arith"
    reasoning_format = "scratchpad"

    @property
    def num_train(self) -> int:
        return len(train_pairs())

    def train_prompt(self, index: int) -> Prompt:
        k = train_pairs()[index]
        return make_prompt(LOW + k // SPAN, LOW + k % SPAN)

    def eval_prompts(self, n: int) -> list[Prompt]:
        out: list[Prompt] = []
        i = 0
        while len(out) < n:
            # A fixed pseudo-random walk over all pairs, keeping held-out ones: same list on every call.
            k = stable_seed("arith-eval", i) % (SPAN * SPAN)
            a, b = LOW + k // SPAN, LOW + k % SPAN
            if is_held_out(a, b) and all(p.meta["a"] != a or p.meta["b"] != b for p in out):
                out.append(make_prompt(a, b))
            i += 1
        return out

    def prompt_by_id(self, prompt_id: str) -> Prompt | None:
        m = re.fullmatch(r"arith/(\d{2,3})\+(\d{2,3})", prompt_id, re.ASCII)
        if m is None:
            return None
        a, b = int(m.group(1)), int(m.group(2))
        if not (LOW <= a <= HIGH and LOW <= b <= HIGH) or is_held_out(a, b):
            return None
        return make_prompt(a, b)

    def parse_answer(self, completion: str) -> str | None:
        return parse_answer(completion)

    def reference_completion(self, prompt: Prompt) -> str | None:
        return scratchpad(int(prompt.meta["a"]), int(prompt.meta["b"]))

    def scratchpad_columns(self, prompt: Prompt) -> list[Column]:
        """The columns every correct scratchpad for ``prompt`` must compute, in order."""
        return columns(int(prompt.meta["a"]), int(prompt.meta["b"]))

    def reward(self, prompt: Prompt, completion: str) -> float:
        try:
            return 1.0 if self.parse_answer(completion) == prompt.answer else 0.0
        except Exception:  # a reward never raises (hostile input gets a verdict)
            return 0.0
