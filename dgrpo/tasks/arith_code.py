"""``arith-code``: the paper's code setting (a program whose printed output must equal the expected answer),
sized for the embedded tiny model.

Prompt ``print the sum of 345 and 78:`` -> completion ``print(345+78)``; also products
(``print the product of 12 and 7:`` -> ``print(12*7)``), so the CODE attack has both ``+`` and ``*`` to
rewrite. The reward runs the program in the sandbox (:mod:`dgrpo.sandbox`) and compares
its stdout with the expected answer; any program that prints the right number earns 1.
"""

from __future__ import annotations

import re

from dgrpo.sandbox import Sandbox, SandboxLimits
from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Prompt
from dgrpo.tasks.code import ProgramOutputTask, make_sandbox
from dgrpo.tasks.registry import TASKS

SUM_RANGE = ((10, 999), (10, 999))
PRODUCT_RANGE = ((2, 999), (2, 99))
EVAL_MODULUS = 10


def _pairs(op: str) -> list[tuple[str, int, int]]:
    (alo, ahi), (blo, bhi) = SUM_RANGE if op == "sum" else PRODUCT_RANGE
    return [(op, a, b) for a in range(alo, ahi + 1) for b in range(blo, bhi + 1)]


def is_held_out(op: str, a: int, b: int) -> bool:
    return stable_seed("arith-code", op, a, b) % EVAL_MODULUS == 0


def make_prompt(op: str, a: int, b: int) -> Prompt:
    if op == "sum":
        text, program, value = f"print the sum of {a} and {b}:", f"print({a}+{b})", a + b
    else:
        text, program, value = f"print the product of {a} and {b}:", f"print({a}*{b})", a * b
    return Prompt(
        id=f"arith-code/{op}/{a}/{b}",
        text=text,
        answer=str(value),
        meta={"op": op, "a": a, "b": b, "reference": program},
    )


def reference_program(prompt: Prompt) -> str:
    return str(prompt.meta["reference"])


@TASKS.register("arith-code")
class ArithCodeTask(ProgramOutputTask):
    """Sums of two 2-3 digit numbers (91%) and products of a 1-3 digit by a 1-2 digit number (9%), as Python."""

    name = "arith-code"

    def __init__(
        self,
        sandbox: Sandbox | None = None,
        limits: SandboxLimits | None = None,
        site: bool = True,
        unsafe_weak_sandbox: bool = False,
        sandbox_python: str | None = None,
    ) -> None:
        self.sandbox = make_sandbox(sandbox, limits, site, unsafe_weak_sandbox, sandbox_python)
        everything = _pairs("sum") + _pairs("product")
        self._train = [p for p in everything if not is_held_out(*p)]
        self._held_out = [p for p in everything if is_held_out(*p)]

    @property
    def num_train(self) -> int:
        return len(self._train)

    def train_prompt(self, index: int) -> Prompt:
        return make_prompt(*self._train[index])

    def eval_prompts(self, n: int) -> list[Prompt]:
        order = sorted(range(len(self._held_out)), key=lambda i: stable_seed("arith-code-eval", i))
        return [make_prompt(*self._held_out[i]) for i in order[:n]]

    def reference_completion(self, prompt: Prompt) -> str | None:
        return reference_program(prompt) if "reference" in prompt.meta else None

    def prompt_by_id(self, prompt_id: str) -> Prompt | None:
        m = re.fullmatch(r"arith-code/(sum|product)/(\d{1,3})/(\d{1,3})", prompt_id, re.ASCII)
        if m is None:
            return None
        op, a, b = m.group(1), int(m.group(2)), int(m.group(3))
        (alo, ahi), (blo, bhi) = SUM_RANGE if op == "sum" else PRODUCT_RANGE
        if not (alo <= a <= ahi and blo <= b <= bhi) or is_held_out(op, a, b):
            return None
        return make_prompt(op, a, b)
