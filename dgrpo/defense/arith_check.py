"""``arith-check``: a completion's reasoning must be arithmetically true, each claim and as a whole.

Aimed at the in-context MATH attack ("Hail to the Thief", sec. 4.2: a step states 2+2=5 while the final answer
stays correct), which the paper's logit check misses, and at its variants that keep every claim true: issue 12
found that checking each claim alone passes a reasoning whose claims are each fine but false as a whole. Three
rules, each checked once, in its own module:

- every claim ``a op b (op c ...) = r`` is true (:mod:`dgrpo.defense.claims`): reason ``false_claim``;
- a task whose question fixes the reasoning says so (:class:`~dgrpo.defense.column_chain.ColumnScratchpadTask`,
  the tiny ``arith`` task): the scratchpad must be that reasoning, each step taking the question's digits of its
  column and the carry the step before gave, the digits making the answer (:mod:`dgrpo.defense.column_chain`):
  reason ``inconsistent``;
- any other prose (GSM8K's ``<think>``): each claim's operands come from the question, an allowed constant or an
  earlier result, and the final answer from a claim or the question (:mod:`dgrpo.defense.provenance`): reasons
  ``unsupported`` and ``unsupported_answer``. Programs are not prose: their arithmetic is their output.

The verdict's reason is the first rule broken, its score the number of findings.

By default only completions that earn a reward are checked (``rewarded_only``): a wrong step in a zero-reward
completion gets a non-positive advantage and teaches nothing, while a wrong step in a rewarded one is exactly
what the attack publishes. Honest models make slips too; rejecting the rewarded ones among them costs little.

Honest false positives, measured: on GSM8K's 7,473 train reference solutions 2.5% are rejected with the
defaults (0.9% for false claims alone, 9.4% with the strict ``provenance = "claims"``; the table is in
:mod:`dgrpo.defense.provenance`, and ``scripts/arith_check_gsm8k.py`` re-measures). On the tiny ``arith`` task
the reference scratchpads of all 980,100 questions are accepted (checked once; the tests walk a sample). On the
tiny model's own samples (``dgrpo simulate math-vertical``, 8 rounds, reputation off) it rejected 22 of 768
honest completions of other nodes (FPR 0.029; the per-claim check alone, same seed: 20, 0.026): rewarded
scratchpads whose carries or digits do not chain, the model getting the answer right through wrong steps. Stop
rate 1.000 for both.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Annotated

from pydantic import Field

from dgrpo.config import Section
from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.claims import NUMBER_RE, evaluate, false_claims, find_claims, number
from dgrpo.defense.column_chain import ColumnScratchpadTask, scratchpad_errors
from dgrpo.defense.provenance import DEFAULT_CONSTANTS, Mode, ProvenanceRule, unsupported
from dgrpo.defense.registry import DEFENSES
from dgrpo.tasks.base import Prompt, Task

__all__ = ["ArithCheckDefense", "ArithCheckOptions", "evaluate", "false_claims", "find_claims", "findings"]


class ArithCheckOptions(Section):
    rewarded_only: Annotated[bool, Field(description="check only completions that earn a reward > 0")] = True
    tolerance: Annotated[float, Field(ge=0.0, description="relative tolerance for non-integer results")] = 1e-6
    consistency: Annotated[
        bool, Field(description="check the reasoning as a whole (scratchpad chain, or where prose numbers come from)")
    ] = True
    provenance: Annotated[
        Mode,
        Field(
            description="prose: what an operand may be besides the question's numbers, constants and earlier "
            "results: 'stated' (any number written before it), 'claims' (nothing else: strict) or 'off'"
        ),
    ] = "stated"
    constants: Annotated[
        list[float], Field(description="prose: numbers a reasoning may use without taking them from anywhere")
    ] = Field(default_factory=lambda: list(DEFAULT_CONSTANTS))
    check_answer: Annotated[
        bool, Field(description="prose: the final answer must be a computed result or given (stated, in 'stated')")
    ] = True


def final_number(answer: str | None) -> Fraction | None:
    """The number an answer states (``72``, ``\\boxed{72}``, ``$1,200``, ``-47``), or None unless exactly one."""
    if answer is None:
        return None
    found = list(NUMBER_RE.finditer(answer[:256]))
    if len(found) != 1:
        return None
    value = number(found[0].group(1))
    return -value if answer[: found[0].start()].rstrip().endswith("-") else value


def prose_findings(
    text: str, answer: str | None, question: str, rule: ProvenanceRule, tolerance: float
) -> list[tuple[str, str]]:
    """:func:`~dgrpo.defense.provenance.unsupported` for a prose completion ``text`` whose final answer, as
    its task parses it, is ``answer``: the reasoning is what comes before that answer."""
    reasoning = text.rpartition(answer)[0] if answer and answer in text else text
    return unsupported(reasoning, question, final_number(answer), rule, tolerance)


def rule_of(options: ArithCheckOptions) -> ProvenanceRule:
    constants = frozenset(Fraction(str(c)) for c in options.constants)
    return ProvenanceRule(options.provenance, constants, options.check_answer)


def findings(task: Task, prompt: Prompt, text: str, options: ArithCheckOptions) -> list[tuple[str, str]]:
    """``(kind, detail)`` for everything wrong with the completion's arithmetic, false claims first."""
    found = [("false_claim", claim) for claim in false_claims(text, options.tolerance)]
    if not options.consistency:
        return found
    if isinstance(task, ColumnScratchpadTask):
        found += [("inconsistent", error) for error in scratchpad_errors(task, prompt, text)]
    elif task.reasoning_format != "program":
        question = str(prompt.meta.get("question", prompt.text))  # GSM8K keeps it apart from its template
        found += prose_findings(text, task.parse_answer(text), question, rule_of(options), options.tolerance)
    return found


@DEFENSES.register("arith-check")
class ArithCheckDefense(Defense):
    name = "arith-check"
    cost = 2
    Options = ArithCheckOptions

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        verdicts: list[Verdict] = []
        for c in candidates:
            found = findings(ctx.task, c.prompt, c.text, self.options)
            if found and self.options.rewarded_only and ctx.task.reward(c.prompt, c.text) <= 0.0:
                found = []
            verdicts.append(self.reject(found[0][0], float(len(found))) if found else ACCEPT)
        return verdicts
