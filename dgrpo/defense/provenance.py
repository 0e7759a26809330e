"""Where the numbers of a prose reasoning come from: a generic consistency rule for GSM8K-style reasoning.

Checking each claim alone (:mod:`dgrpo.defense.claims`) lets through a reasoning whose claims are all true
but do not hold together: a step computed on a number that is in neither the question nor any earlier step
(``37 x 3 = 111`` dropped into a solution, an operand swapped for another), or a final answer that nothing
computed. The rule: walking the reasoning in order, every operand of a claim must be *known* (a number of the
question, an allowed constant, or a result of an earlier true claim), and the final answer must be known at
the end. ``mode`` says what else is known:

- ``claims``: nothing else. The rule as stated; strict.
- ``stated``: also any number the reasoning wrote before the claim, outside claims (``There are 150 seats.``).
  A claim may then not use a number before the reasoning introduces it.
- ``off``: no operand is checked (only the answer, if ``check_answer``).

The question's numbers are its numerals (``$12``, ``1,200``, ``0.5``), its number words (``twelve``, ``a
dozen``, ``half`` as 2 and 1/2, ``a third``), for a percentage p its fractions p/100, 1 + p/100 and
1 - p/100 (``20% off``: ``x 0.8``), and n/100 for each whole n (cents written as dollars, ``$.45``).

Measured on the 7,473 train reference solutions of GSM8K (``scripts/arith_check_gsm8k.py``; each one honest
and rewarded, so every rejection is a false positive), the share the whole arith-check rejects (false claims,
this rule and the answer, default constants):

=========  ============  =========  ==================================================
mode       check_answer  rejected   stops (first claim's operand n -> n+1, result redone)
=========  ============  =========  ==================================================
stated     yes           2.5%       66.9% (the default)
claims     yes           9.4%       72.2%
claims     no            6.1%       71.3%
off        no            0.9%       0.4% (false claims only: the check this rule extends)
=========  ============  =========  ==================================================

The strict rule (``claims``) is not low: honest prose computes numbers outside ``a op b = c`` claims (``Half
of them, 40, left``), which a regex cannot follow, and it states its final answer in prose. ``stated`` is the
default for that reason; ``claims`` suits reasoning written as claims only (a model trained to show every
computation). The attack column's misses are mostly n+1 being a constant (1-10) or a number of the question.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from dgrpo.defense.claims import MAX_TEXT_CHARS, NUM, find_claims, number, numbers

Mode = Literal["claims", "stated", "off"]

# Units a solution may bring in unasked: 1-10 (counting, "twice", "a week of 7 days"), 12 (a dozen, months),
# 16 (ounces in a pound), 24 (hours), 30 and 31 (days in a month), 52 (weeks), 60 (minutes), 100 (per cent,
# cents), 365 (days), 1000; 0, 1/2 and 1/4 (halves, quarters written as 0.5, 0.25).
DEFAULT_CONSTANTS: tuple[float, ...] = (
    0, 0.25, 0.5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 24, 30, 31, 52, 60, 100, 365, 1000,
)  # fmt: skip

NUMBER_WORDS: dict[str, int] = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
    "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17,
    "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100, "thousand": 1000, "million": 1_000_000,
    "twice": 2, "double": 2, "triple": 3, "thrice": 3, "dozen": 12, "dozens": 12,
}  # fmt: skip
# Words for a fraction 1/n: both n and 1/n are known ("half as many": 48/2 or 48 x 0.5).
FRACTION_WORDS: dict[str, int] = {
    "half": 2, "halves": 2, "third": 3, "thirds": 3, "quarter": 4, "quarters": 4, "fourth": 4, "fourths": 4,
    "fifth": 5, "fifths": 5, "sixth": 6, "seventh": 7, "eighth": 8, "ninth": 9, "tenth": 10, "twelfth": 12,
}  # fmt: skip
WORD_RE = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)?")
PERCENT_RE = re.compile(rf"(?<![\w.])\$?({NUM})[ \t]*(?:%|percent\b|per cent\b)")


@dataclass(frozen=True)
class ProvenanceRule:
    mode: Mode = "stated"
    constants: frozenset[Fraction] = frozenset(Fraction(str(c)) for c in DEFAULT_CONSTANTS)
    check_answer: bool = True


def question_numbers(question: str) -> set[Fraction]:
    """The numbers a reasoning may take from ``question`` (see the module docstring)."""
    question = question[:MAX_TEXT_CHARS]
    known = set(numbers(question))
    for word in WORD_RE.findall(question):
        tens, _, unit = word.lower().partition("-")  # "thirty-four"
        if tens in NUMBER_WORDS and unit in NUMBER_WORDS and NUMBER_WORDS[unit] < 10 <= NUMBER_WORDS[tens] < 100:
            known.add(Fraction(NUMBER_WORDS[tens] + NUMBER_WORDS[unit]))
        for w in (tens, unit):
            if w in NUMBER_WORDS:
                known.add(Fraction(NUMBER_WORDS[w]))
            elif w in FRACTION_WORDS:
                known.update({Fraction(FRACTION_WORDS[w]), Fraction(1, FRACTION_WORDS[w])})
    known.update({v / 100 for v in known if v.denominator == 1})  # cents written as dollars ($.45)
    for m in PERCENT_RE.finditer(question):
        p = number(m.group(1)) / 100
        known.update({p, 1 + p, 1 - p})
    return known


def _fmt(values: Iterable[Fraction]) -> str:
    return ", ".join(str(v) if v.denominator == 1 else f"{float(v):g}" for v in values)


def unsupported(
    reasoning: str, question: str, answer: Fraction | None, rule: ProvenanceRule, tolerance: float = 1e-6
) -> list[tuple[str, str]]:
    """``(kind, detail)`` for each claim with an operand from nowhere (kind ``unsupported``) and for a final
    ``answer`` nothing established (``unsupported_answer``); empty when the reasoning holds together.
    False claims are :func:`~dgrpo.defense.claims.false_claims`' business and are skipped here."""
    reasoning = reasoning[:MAX_TEXT_CHARS]
    known = question_numbers(question) | rule.constants
    found: list[tuple[str, str]] = []
    read_to = 0  # prose before this offset has been read (mode "stated")
    for claim in find_claims(reasoning, tolerance):
        if rule.mode == "stated":
            known.update(numbers(reasoning[read_to : claim.start]))
            read_to = claim.start + len(claim.text)
        if not claim.true:
            continue
        missing = [v for v in claim.operands if v not in known]
        if missing and rule.mode != "off":
            found.append(("unsupported", f"{_fmt(missing)} in {claim.text!r}"))
            known.update(missing)  # reported once
        known.update(claim.results)
    if rule.mode == "stated":
        known.update(numbers(reasoning[read_to:]))
    if rule.check_answer and answer is not None and answer not in known:
        found.append(("unsupported_answer", f"answer {_fmt([answer])} is neither computed nor given"))
    return found
