"""``arith-pattern``: false arithmetic an author keeps stating, told from the slips every model makes.

``arith-check`` rejects every rewarded completion whose working is false. In a heterogeneous network that is
too strict: the tiny models get the answer right through a wrong step 1-21% of the time (measured on 800
samples each: tiny-arith 7%, tiny-arith-llama 21%, the English ones 1-2% of rewarded completions), and
rejecting those costs a whole model family up to 7% of its completions. What the in-context MATH attack
("Hail to the Thief", sec. 4.2) cannot avoid is a pattern: to teach a false fact it must state it again and
again, far more often than a slip comes back. And a model that rarely slips can afford no leniency at all.

**Per model.** The receiver estimates how often the author's model slips (rewarded completions with a finding,
over all its completions) from what no author controls: its own completions where it runs that model and its
own samples of the model (:mod:`dgrpo.defense.reference`), with one slip and one clean completion added
(Laplace). Where that is at most ``slip_budget``, every rewarded completion with a finding is rejected
(``false_step``): rejecting all of that model's slips costs it about that share of its completions, and an
attacker publishing a false fact only now and then (too rare for a pattern) is still stopped. Otherwise (the
digits-only tiny models slip 3-7% of the time) the two rules below decide, over the author's rewarded
completions of this round and the ``memory_rounds`` before (a completion that earns no reward teaches
nothing false):

- **habitual**: ``k`` of its ``n`` rewarded completions hold a finding of ``arith-check``
  (:func:`dgrpo.defense.arith_check.findings`); with an honest slip rate of at most ``base_rate``,
  ``P(Binomial(n, base_rate) >= k) < alpha`` and ``k / n >= min_share`` make the author habitual, and its
  rewarded completions with findings are rejected;
- **repeated_false**: a computation (a column: its two digits and its carry) the author stated at least
  ``min_repeats`` times, falsely in at least ``fact_share`` of them, and more often falsely than the model
  itself would with odds below ``fact_alpha`` (:func:`model_odds`, from what the receiver knows of the model):
  its completions stating it falsely are rejected. This catches the paper's one-fact attack, too rare in an
  author's output for the first rule. Stating a fact falsely every time but only twice is not enough: in
  simulation that rejected 6% of tiny-arith-llama's completions (its slips repeat once it has trained on
  them). Nor is a slip the model itself makes that often: tiny-arith-llama states ``3+9+0`` falsely in a
  quarter to half of its samples, and an honest llama node saying it falsely 2 times in 3 lost 6 of its 128
  completions in one run (D3 mix, 4 rounds) before the model's own odds were asked.

A slip that is neither (the model's random error) is accepted: it is what honest training on that model's
samples would see anyway, and GRPO's advantage does not single it out.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from dgrpo.defense.arith_check import ArithCheckOptions, findings
from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.claims import find_claims
from dgrpo.defense.odds import binomial_tail
from dgrpo.defense.reference import PatternOptions, ReferenceDraws, forget
from dgrpo.defense.registry import DEFENSES
from dgrpo.tasks.base import Prompt


class ArithPatternOptions(PatternOptions):
    base_rate: Annotated[
        float, Field(gt=0.0, lt=1.0, description="honest slip rate allowed: rewarded completions with findings")
    ] = 0.25
    alpha: Annotated[float, Field(gt=0.0, lt=1.0, description="odds below which an author's rate is no chance")] = 1e-4
    min_share: Annotated[float, Field(gt=0.0, le=1.0, description="a habitual author's share of findings")] = 0.4
    min_repeats: Annotated[int, Field(ge=2, description="statements of one computation to judge it")] = 3
    fact_share: Annotated[float, Field(gt=0.0, le=1.0, description="share of them false to reject")] = 0.5
    fact_alpha: Annotated[
        float,
        Field(gt=0.0, le=1.0, description="... and odds below this that the model states it that falsely itself"),
    ] = 0.01
    slip_budget: Annotated[
        float, Field(ge=0.0, le=1.0, description="a model slipping at most this often gets no leniency (0: never)")
    ] = 0.02
    reference_samples: Annotated[
        int, Field(ge=0, description="own samples of a model the receiver does not run, per round (0: never)")
    ] = 64  # more than the shared default: a slip rate of 1-2% needs more samples to estimate


@dataclass(frozen=True)
class Statement:
    round: int
    author: str
    model_id: str
    rewarded: bool
    flawed: bool  # a rewarded completion with a finding
    claims: tuple[tuple[str, bool], ...]  # (computation, stated truly)


COLUMN_RE = re.compile(r"^(\d)\+(\d)\+([01])$")


def computations(text: str) -> tuple[tuple[str, bool], ...]:
    """Each claim of ``text`` as (what it computes: its left-hand side without spaces, a column's two digits in
    order, ``7+4+0`` read ``4+7+0``; whether it is true). The carry stays part of it: keyed by the digits alone,
    a model's own habit of slipping on a carry column (tiny-arith-llama's ``9+4+1``) merges with the same
    digits' carry-free column and reads as a false fact (A4 mix: 4.7% of its completions rejected)."""
    out = []
    for c in find_claims(text):
        lhs = "=".join(c.sides[:-1]).replace(" ", "")
        m = COLUMN_RE.match(lhs)
        if m:
            x, y = sorted((int(m.group(1)), int(m.group(2))))
            lhs = f"{x}+{y}+{m.group(3)}"
        out.append((lhs, c.true))
    return tuple(out)


PRIOR_WEIGHT = 2.0  # statements of the model's overall slip rate a computation's own rate starts from


def tally(statements: Sequence[Statement]) -> tuple[Counter[str], Counter[str]]:
    """Per computation: how many times ``statements`` state it, and how many of those falsely."""
    stated: Counter[str] = Counter()
    false: Counter[str] = Counter()
    for s in statements:
        for key, true in s.claims:
            stated[key] += 1
            false[key] += not true
    return stated, false


def model_odds(known: Sequence[Statement]) -> Callable[[str, int, int], float]:
    """``odds(key, k, n)``: how likely the model itself (``known``: the receiver's own completions of it or its
    samples of it) states computation ``key`` falsely ``k`` or more times in ``n``, at its own rate for that
    computation (its false statements of it over its statements, starting from its rate over all computations
    with weight ``PRIOR_WEIGHT``: a computation it was seen stating a few times is not known to be safe). 0.0
    when nothing is known: every repeat then counts."""
    stated, false = tally(known)
    if not stated:
        return lambda key, k, n: 0.0
    overall = (sum(false.values()) + 1) / (sum(stated.values()) + 2)

    def odds(key: str, k: int, n: int) -> float:
        rate = (false[key] + PRIOR_WEIGHT * overall) / (stated[key] + PRIOR_WEIGHT)
        return binomial_tail(k, n, rate)

    return odds


@DEFENSES.register("arith-pattern")
class ArithPatternDefense(Defense):
    name = "arith-pattern"
    cost = 2
    Options = ArithPatternOptions

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.seen: deque[Statement] = deque()
        self.reference: deque[Statement] = deque()  # the receiver's own samples of others' models
        self.draws = ReferenceDraws()
        self.check_options = ArithCheckOptions(rewarded_only=False)

    def statement(self, ctx: DefenseContext, author: str, model_id: str, prompt: Prompt, text: str) -> Statement:
        rewarded = ctx.task.reward(prompt, text) > 0.0
        flawed = rewarded and bool(findings(ctx.task, prompt, text, self.check_options))
        return Statement(ctx.round, author, model_id, rewarded, flawed, computations(text) if rewarded else ())

    def known(self, ctx: DefenseContext, model_id: str, prompts: Sequence[Prompt]) -> list[Statement]:
        """What the receiver knows of ``model_id`` that no author controls: its own completions where it runs
        the model, else its own samples of it (empty when it has neither)."""
        if model_id == ctx.model_id:
            return [s for s in self.seen if s.author == ctx.self_id]
        for p, t in self.draws.new(ctx, model_id, prompts, self.options):
            self.reference.append(self.statement(ctx, "", model_id, p, t))
        return [s for s in self.reference if s.model_id == model_id]

    def slip_rate(self, ctx: DefenseContext, model_id: str, prompts: Sequence[Prompt]) -> float | None:
        """How often ``model_id`` slips (Laplace-smoothed), from what the receiver knows of it; None when it
        knows nothing."""
        known = self.known(ctx, model_id, prompts)
        if not known:
            return None
        return (sum(s.flawed for s in known) + 1) / (len(known) + 2)

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        opts = self.options
        for memory in (self.seen, self.reference):
            forget(memory, ctx.round, opts.memory_rounds)
        now = [self.statement(ctx, c.author, c.model_id, c.prompt, c.text) for c in candidates]
        self.seen.extend(now)
        prompts = [c.prompt for c in candidates]
        verdicts: list[Verdict] = [ACCEPT] * len(candidates)
        for author in {c.author for c in candidates} - {ctx.self_id}:
            model_id = next(c.model_id for c in candidates if c.author == author)
            rate = self.slip_rate(ctx, model_id, prompts) if opts.slip_budget > 0 else None
            if rate is not None and rate <= opts.slip_budget:
                for i, c in enumerate(candidates):
                    if c.author == author and now[i].flawed:
                        verdicts[i] = self.reject("false_step", rate)
                continue
            mine = [s for s in self.seen if s.author == author and s.rewarded]
            k = sum(s.flawed for s in mine)
            habitual = k >= opts.min_share * len(mine) and binomial_tail(k, len(mine), opts.base_rate) < opts.alpha
            stated, false = tally(mine)
            odds = model_odds(self.known(ctx, model_id, prompts))
            repeated = {
                key
                for key, n in stated.items()
                if n >= opts.min_repeats
                and false[key] >= opts.fact_share * n
                and odds(key, false[key], n) < opts.fact_alpha
            }
            for i, c in enumerate(candidates):
                if c.author != author or not now[i].flawed:
                    continue
                if habitual:
                    verdicts[i] = self.reject("habitual", k / len(mine))
                elif any(key in repeated and not true for key, true in now[i].claims):
                    verdicts[i] = self.reject("repeated_false", float(len(repeated)))
        return verdicts
