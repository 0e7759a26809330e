"""False arithmetic facts for the in-context MATH attack (paper, sec. 4.2: a step states that 2+2, or 2x2,
equals 5) and the regexes that find the computations they target."""

from __future__ import annotations

import re
from dataclasses import dataclass

FACT_RE = re.compile(r"^\s*(\d+)\s*([+x*×])\s*(\d+)\s*=\s*(\d+)\s*$")
# "a op b = c" in prose: not preceded by another digit, decimal point or letter; x/× as well as *.
EQUATION_RE = re.compile(r"(?<![\w.])(\d+)(\s*)([+x*×])(\s*)(\d+)(\s*=\s*)(-?\d+(?:\.\d+)?)(?![\d.]*\d)")
# One arith scratchpad step: digit + digit + carry = sum.
STEP_RE = re.compile(r"(\d)\+(\d)\+(\d)=(\d{1,2})", re.ASCII)


@dataclass(frozen=True)
class Fact:
    a: int
    op: str  # "+" or "*"
    b: int
    false_result: int

    @property
    def true_result(self) -> int:
        return self.a + self.b if self.op == "+" else self.a * self.b

    def matches(self, a: int, op: str, b: int) -> bool:
        """Whether ``a op b`` is this fact's computation (either operand order)."""
        return _norm(op) == self.op and {(a, b), (b, a)} & {(self.a, self.b)} != set()


def _norm(op: str) -> str:
    return "+" if op == "+" else "*"


def parse_fact(text: str) -> Fact:
    """``"2+2=5"`` or ``"2x2=5"`` -> Fact. The stated result must be false."""
    m = FACT_RE.match(text)
    if m is None:
        raise ValueError(f"false fact {text!r}: expected 'A+B=R' or 'AxB=R'")
    fact = Fact(int(m.group(1)), _norm(m.group(2)), int(m.group(3)), int(m.group(4)))
    if fact.false_result == fact.true_result:
        raise ValueError(f"false fact {text!r} is true")
    return fact
