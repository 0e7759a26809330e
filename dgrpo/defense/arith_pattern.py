"""``arith-pattern``: false arithmetic an author keeps stating, told from the slips every model makes.

``arith-check`` rejects every rewarded completion whose working is false. In a heterogeneous network that is
too strict: the tiny models get the answer right through a wrong step 1-21% of the time (measured on 800
samples each: tiny-arith 7%, tiny-arith-llama 21%, the English ones 1-2% of rewarded completions), and
rejecting those costs a whole model family up to 7% of its completions. What the in-context MATH attack
("Hail to the Thief", sec. 4.2) cannot avoid is a pattern: to teach a false fact it must state it again and
again, far more often than a slip comes back. Two rules, over the author's rewarded completions of this
round and the ``memory_rounds`` before (a completion that earns no reward teaches nothing false):

- **habitual**: ``k`` of its ``n`` rewarded completions hold a finding of ``arith-check``
  (:func:`dgrpo.defense.arith_check.findings`); with an honest slip rate of at most ``base_rate``,
  ``P(Binomial(n, base_rate) >= k) < alpha`` and ``k / n >= min_share`` make the author habitual, and its
  rewarded completions with findings are rejected;
- **repeated_false**: a computation (``2+2+0``) the author stated at least ``min_repeats`` times, falsely in
  at least ``fact_share`` of them: its completions stating it falsely are rejected. This catches the paper's
  one-fact attack, too rare in an author's output for the first rule.

A slip that is neither (the model's random error) is accepted: it is what honest training on that model's
samples would see anyway, and GRPO's advantage does not single it out.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from dgrpo.config import Section
from dgrpo.defense.arith_check import ArithCheckOptions, findings
from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.claims import find_claims
from dgrpo.defense.odds import binomial_tail
from dgrpo.defense.registry import DEFENSES


class ArithPatternOptions(Section):
    base_rate: Annotated[
        float, Field(gt=0.0, lt=1.0, description="honest slip rate allowed: rewarded completions with findings")
    ] = 0.25
    alpha: Annotated[float, Field(gt=0.0, lt=1.0, description="odds below which an author's rate is no chance")] = 1e-4
    min_share: Annotated[float, Field(gt=0.0, le=1.0, description="a habitual author's share of findings")] = 0.4
    min_repeats: Annotated[int, Field(ge=2, description="statements of one computation to judge it")] = 3
    fact_share: Annotated[float, Field(gt=0.0, le=1.0, description="share of them false to reject")] = 0.5
    memory_rounds: Annotated[int, Field(ge=0, description="earlier rounds remembered")] = 4


@dataclass(frozen=True)
class Statement:
    round: int
    author: str
    flawed: bool  # a rewarded completion with a finding
    claims: tuple[tuple[str, bool], ...]  # (computation, stated truly)


def computations(text: str) -> tuple[tuple[str, bool], ...]:
    """Each claim of ``text`` as (its left-hand side without spaces, whether it is true)."""
    return tuple(("=".join(c.sides[:-1]).replace(" ", ""), c.true) for c in find_claims(text))


@DEFENSES.register("arith-pattern")
class ArithPatternDefense(Defense):
    name = "arith-pattern"
    cost = 2
    Options = ArithPatternOptions

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.seen: deque[Statement] = deque()
        self.check_options = ArithCheckOptions(rewarded_only=False)

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        opts = self.options
        while self.seen and self.seen[0].round < ctx.round - opts.memory_rounds:
            self.seen.popleft()
        rewarded = [ctx.task.reward(c.prompt, c.text) > 0.0 for c in candidates]
        found = [
            findings(ctx.task, c.prompt, c.text, self.check_options) if r else []
            for c, r in zip(candidates, rewarded, strict=True)
        ]
        claims = [computations(c.text) if r else () for c, r in zip(candidates, rewarded, strict=True)]
        for c, r, f, cl in zip(candidates, rewarded, found, claims, strict=True):
            if r:
                self.seen.append(Statement(ctx.round, c.author, bool(f), cl))
        verdicts: list[Verdict] = [ACCEPT] * len(candidates)
        for author in {c.author for c in candidates} - {ctx.self_id}:
            mine = [s for s in self.seen if s.author == author]
            k = sum(s.flawed for s in mine)
            habitual = k >= opts.min_share * len(mine) and binomial_tail(k, len(mine), opts.base_rate) < opts.alpha
            stated: Counter[str] = Counter()
            false: Counter[str] = Counter()
            for s in mine:
                for key, true in s.claims:
                    stated[key] += 1
                    false[key] += not true
            repeated = {key for key, n in stated.items() if n >= opts.min_repeats and false[key] >= opts.fact_share * n}
            for i, c in enumerate(candidates):
                if c.author != author or not found[i]:
                    continue
                if habitual:
                    verdicts[i] = self.reject("habitual", k / len(mine))
                elif any(key in repeated and not true for key, true in claims[i]):
                    verdicts[i] = self.reject("repeated_false", float(len(found[i])))
        return verdicts
