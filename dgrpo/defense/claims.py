"""Arithmetic claims in reasoning text, ``a op b (op c ...) = r``, and whether each one is true.

A claim is an expression of numbers joined by ``+ - * / x × ÷``, then one or more ``= side``. Prose writes
units between the numbers (``12 hours/week x 4 weeks = 48 hours``, ``$0.5/soda``), chains equalities
(``8 * 2 + 4 * 5 = 16 + 20 = 36``) and percentages (``250 * 60% = 150``, ``100/4 = 25%``): all of these are
read, because a reader that skips them cannot say where a later number came from
(:mod:`dgrpo.defense.provenance`), and one that reads half a chain calls honest text false.

The in-context MATH attack ("Hail to the Thief", sec. 4.2) writes a claim such as ``2+2=5``; a claim is false
when a side disagrees with the first side's value under every reading of its notation: ``%`` as per cent or
as a plain unit, ``a/b`` written without spaces as one number (``28 / 1/5 = 140``) or with the usual precedence.
Rounding is not lying: a side written as a single number may round or truncate an inexact value to its own
decimal places (``10/3 = 3.33``, ``100 / 6 = 16`` books). On GSM8K's train reference solutions
(``scripts/arith_check_gsm8k.py``) 65 of the 7,473 (0.9%) hold a claim this calls false, nearly all of them
the dataset's own slips and notation no reader can settle (``50-8 = 44``, ``5 x 1/2 = 10``, ``14, 400 / 80``);
2.9% hold no claim this reads. The reader this replaced (no units, chains, ``$`` or ``%``) called 2.1% false
(154) and read no claim in 33%.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction

from dgrpo.parsing import parse

MAX_TEXT_CHARS = 64_000  # bounds the regex work on hostile text (GSM8K's completion cap)
MAX_CLAIMS = 256
MAX_SIDES = 8

NUM = r"(?:[0-9]{1,12}(?:,[0-9]{3})*(?:\.[0-9]{1,12})?|\.[0-9]{1,12})(?!\.?[0-9])"
VALUE = rf"\(*\$?{NUM}%?\)*"
WORD = r"[A-Za-z][A-Za-z'’]{0,30}"
UNIT = rf"(?:/{WORD}|(?:[ \t]+{WORD}){{1,3}}(?:/{WORD})?)?"  # up to three words, or a per-unit ``/hour``
TERM = rf"{VALUE}{UNIT}"
OP = r"[ \t]*[-+*/x×÷–−][ \t]*"
EXPR = rf"{TERM}(?:{OP}{TERM}){{0,24}}"
# Not inside a word or a number (``v1.2+3``, ``$5``), nor the last three digits of ``650,000``.
START = r"(?<![\w.$])(?!(?<=[0-9],)[0-9]{3}(?![0-9]))"
CLAIM_RE = re.compile(
    rf"{START}(?P<first>{TERM}(?:{OP}{TERM}){{1,24}})(?P<rest>(?:[ \t]*=[ \t]*-?{EXPR}){{1,{MAX_SIDES}}})"
)
EQUALS_RE = re.compile(r"[ \t]*=[ \t]*")
# A claim whose left side continues an expression to its left (``2 miles * 2 + 3 = 7``) or a mixed number
# (``1 1/2 = 3/2``) is only the tail of something this reader cannot evaluate: not a claim.
TRUNCATED_RE = re.compile(r"(?:[-+*/×÷(–−]|(?<![A-Za-z])x)[ \t]*$")
MIXED_NUMBER_RE = re.compile(r"[0-9][ \t]+$")
FRACTION_START_RE = re.compile(r"[0-9]+/[0-9]")
TOKEN_RE = re.compile(rf"\$?(?P<num>{NUM})(?P<pct>%?)|/{WORD}|(?P<word>{WORD})|(?P<op>[-+*/×÷–−()])")
FRACTION_TOKEN_RE = re.compile(rf"(?P<frac>(?<![0-9.]){NUM}/{NUM})(?![%/])|{TOKEN_RE.pattern}")
NUMBER_RE = re.compile(rf"(?<![\w.])\$?({NUM})")
TRAILING_UNIT_RE = re.compile(rf"(?:/{WORD}|[ \t]+{WORD})+$")
FRACTION_RE = re.compile(r"[0-9]/[0-9.]")
READINGS = ((False, False), (True, False), (False, True), (True, True))  # (% as per cent, a/b as one number)
OPERATORS = {"×": "*", "÷": "/", "–": "-", "−": "-"}

_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("not arithmetic")


def evaluate(expression: str) -> Fraction | None:
    """The exact value of ``a op b ...`` (x and × multiply, ÷ divides, usual precedence); None if invalid."""
    text = expression.replace(",", "").replace("×", "*").replace("x", "*").replace("÷", "/")
    try:
        return _evaluate(parse(text, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return None


def number(text: str) -> Fraction:
    """``"1,200.5"`` -> 1200.5 (a numeral as :data:`NUM` matches it)."""
    return Fraction(text.replace(",", ""))


def numbers(text: str) -> list[Fraction]:
    """The numerals in ``text``, in order (``$12``, ``1,200``, ``0.5``; a ``%`` is not applied)."""
    return [number(m.group(1)) for m in NUMBER_RE.finditer(text[:MAX_TEXT_CHARS])]


def side_value(side: str, per_cent: bool, tight_fractions: bool) -> Fraction | None:
    """The value of one side of a claim with its unit words dropped and ``x`` read as times, ``%`` read as per
    cent or not and a spaceless ``a/b`` as one number or not (see the module docstring)."""
    parts = []
    for m in (FRACTION_TOKEN_RE if tight_fractions else TOKEN_RE).finditer(side):
        if m.group("num"):
            parts.append(f"({m.group('num')}/100)" if per_cent and m.group("pct") else m.group("num"))
        elif m.lastgroup == "frac":
            parts.append(f"({m.group('frac')})")
        elif m.group("word") in ("x", "X"):
            parts.append("*")
        elif m.group("op"):
            parts.append(OPERATORS.get(m.group("op"), m.group("op")))
    return evaluate(" ".join(parts))


def agrees(value: Fraction, side: str, stated: Fraction, tolerance: float) -> bool:
    """Whether a side worth ``stated`` states ``value``: equal within ``tolerance`` (relative), or, for a side
    that is a single number and an inexact ``value``, that number rounded or truncated to its decimals."""
    if abs(value - stated) <= abs(value) * Fraction(tolerance):
        return True
    tokens = [m for m in TOKEN_RE.finditer(side) if m.group("num") or m.group("op")]
    if value.denominator == 1 or len(tokens) != 1 or not tokens[0].group("num"):
        return False
    decimals = len(tokens[0].group("num").partition(".")[2])
    return abs(value - stated) < Fraction(1, 10**decimals)


@dataclass(frozen=True)
class Claim:
    """One claim as written: ``sides[0] = sides[1] (= ...)``, at ``start`` in the text."""

    text: str
    start: int
    sides: tuple[str, ...]
    values: tuple[Fraction, ...]  # each side's value, under the reading of % that makes the claim true if any
    true: bool

    @property
    def operands(self) -> list[Fraction]:
        """The numbers the claim starts from (its left side's numerals)."""
        return numbers(self.sides[0])

    @property
    def results(self) -> set[Fraction]:
        """What a true claim establishes: every side's value and the numerals written on its right sides
        (``16 + 20 = 36`` after ``8 * 2 + 4 * 5``: 16 and 20 are now known too)."""
        out = set(self.values)
        for side in self.sides[1:]:
            out.update(numbers(side))
        return out


def _read(m: re.Match[str], tolerance: float) -> Claim | None:
    sides = (m.group("first"), *EQUALS_RE.split(m.group("rest"))[1:])
    readings: list[tuple[Fraction, ...]] = []
    for per_cent, tight in READINGS:
        if (per_cent and "%" not in m.group(0)) or (tight and FRACTION_RE.search(m.group(0)) is None):
            continue
        values = [side_value(s, per_cent, tight) for s in sides]
        known = tuple(v for v in values if v is not None)
        if len(known) == len(values):
            readings.append(known)
    if not readings:
        return None  # not arithmetic after all (unbalanced brackets, a division by zero)
    for reading in readings:
        if all(agrees(reading[0], s, v, tolerance) for s, v in zip(sides[1:], reading[1:], strict=True)):
            return Claim(_shown(m.group(0)), m.start(), sides, reading, True)
    return Claim(_shown(m.group(0)), m.start(), sides, readings[0], False)


def _shown(text: str) -> str:
    return TRAILING_UNIT_RE.sub("", text)


def find_claims(text: str, tolerance: float = 1e-6) -> Iterator[Claim]:
    """The claims in ``text`` in order, at most :data:`MAX_CLAIMS`, read from its first
    :data:`MAX_TEXT_CHARS` characters. Never raises on hostile text."""
    if not isinstance(text, str):
        return
    text = text[:MAX_TEXT_CHARS]
    found = 0
    for m in CLAIM_RE.finditer(text):
        if found >= MAX_CLAIMS:
            return
        before = text[max(0, m.start() - 8) : m.start()]
        if TRUNCATED_RE.search(before) or (MIXED_NUMBER_RE.search(before) and FRACTION_START_RE.match(m.group(0))):
            continue
        claim = _read(m, tolerance)
        if claim is not None:
            found += 1
            yield claim


def false_claims(text: str, tolerance: float = 1e-6) -> list[str]:
    """The claims in ``text`` whose stated result is wrong."""
    return [c.text for c in find_claims(text, tolerance) if not c.true]
