"""``arith-check``: recompute every arithmetic claim ``a op b (op c ...) = r`` in a completion's reasoning.

Aimed at the in-context MATH attack ("Hail to the Thief", sec. 4.2: a step states 2+2=5 while the final answer
stays correct), which the paper's logit check misses. By default only completions that earn a reward are
checked (``rewarded_only``): a false step in a zero-reward completion gets a non-positive advantage and
teaches nothing, while a false step in a rewarded one is exactly what the attack publishes. Honest models
make arithmetic slips too; rejecting the rewarded ones among them costs little.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Annotated

from pydantic import Field

from dgrpo.config import Section
from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.registry import DEFENSES

NUM = r"\d{1,12}(?:,\d{3})*(?:\.\d{1,12})?"
OP = r"\s*[-+*/x×÷]\s*"
# The expression before "=": numbers joined by operators, not preceded by a digit, letter or decimal point.
CLAIM_RE = re.compile(rf"(?<![\w.])({NUM}(?:{OP}{NUM})+)\s*=\s*(-?{NUM})(?![\d.]*\d)")
MAX_CLAIMS = 256  # bounds the work on hostile text

_OPS: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


class ArithCheckOptions(Section):
    rewarded_only: Annotated[bool, Field(description="check only completions that earn a reward > 0")] = True
    tolerance: Annotated[float, Field(ge=0.0, description="relative tolerance for non-integer results")] = 1e-6


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return Fraction(str(node.value))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("not arithmetic")


def evaluate(expression: str) -> Fraction | None:
    """The exact value of ``a op b ...`` (x and × multiply, ÷ divides, usual precedence); None if invalid."""
    text = expression.replace(",", "").replace("×", "*").replace("x", "*").replace("÷", "/")
    try:
        return _evaluate(ast.parse(text, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def false_claims(text: str, tolerance: float = 1e-6) -> list[str]:
    """The claims in ``text`` whose stated result is wrong."""
    wrong = []
    for k, m in enumerate(CLAIM_RE.finditer(text)):
        if k >= MAX_CLAIMS:
            break
        value = evaluate(m.group(1))
        if value is None:
            continue
        stated = Fraction(m.group(2).replace(",", ""))
        if abs(value - stated) <= abs(value) * Fraction(tolerance):
            continue
        # A rounded result of an inexact division ("10/3 = 3.33") is not a false claim.
        decimals = len(m.group(2).partition(".")[2])
        if value.denominator != 1 and abs(value - stated) <= Fraction(1, 2 * 10**decimals):
            continue
        wrong.append(m.group(0))
    return wrong


@DEFENSES.register("arith-check")
class ArithCheckDefense(Defense):
    name = "arith-check"
    cost = 2
    Options = ArithCheckOptions

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        verdicts: list[Verdict] = []
        for c in candidates:
            wrong = false_claims(c.text, self.options.tolerance)
            if wrong and self.options.rewarded_only and ctx.task.reward(c.prompt, c.text) <= 0.0:
                wrong = []
            verdicts.append(self.reject("false_claim", float(len(wrong))) if wrong else ACCEPT)
        return verdicts
