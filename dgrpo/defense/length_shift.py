"""``length-shift``: a cross-model check for the DoS attack: an author whose completions are systematically
longer than what others running its model write, or one completion far longer than anybody's.

The DoS attack ("Hail to the Thief", sec. 4.1) publishes the longest of many samples of the attacker's own
model: each completion alone is an honest sample, so no per-completion filter across models can tell it
(docs/results.md, issue 12: `length` stopped 11%). What the selection cannot hide is its pattern: nearly all
of the author's completions sit in the top of its model's length distribution, where an honest author's
fall a quarter of the time. The padded variant (issue 28: filler added to the reasoning) is also caught
completion by completion: it is longer than any honest sample.

**Statistic.** A completion's *excess*: its length in characters minus that of the task's reference
completion for the prompt where the task has one whose length is the required working (the ``arith``
scratchpad; otherwise 0). **Null**: the excesses of the other authors announcing the same model and, where
the receiver runs it, the receiver's own (at least ``min_null`` of them over the remembered rounds).
Where too few others run the author's model (in the D3 mix the attacker is the only English writer), the
receiver samples that model itself, as published (``reference_models``: the models it may load, the
embedded ``dgrpo:`` ones always), ``reference_samples`` completions of the round's prompts with the run's
sampling: an author's model is named in its announcement, and comparing it with another model's lengths
says nothing. With neither, the author is not judged.

**Rules.** (1) *Shifted author*: of its remembered completions, ``k`` of ``n`` exceed the null's
``upper_quantile``; chance puts a share ``1 - upper_quantile`` there, so when ``P(Binomial(n, 1 - q) >= k)``
is below ``alpha`` and ``k / n >= min_share``, every completion the author sent this round is rejected
(``shifted``): the selection is the poison, and its shorter picks are picks too. (2) *Extreme completion*: an
excess above the null's ``extreme_quantile`` by ``extreme_margin`` characters is rejected (``extreme``).

What it cannot stop: a selection that keeps to the honest range (choosing the longest only some of the time
is also a weaker attack); length gained in ways the excess does not count.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from pydantic import Field

from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.odds import binomial_tail
from dgrpo.defense.reference import PatternOptions, ReferenceDraws, forget
from dgrpo.defense.registry import DEFENSES
from dgrpo.tasks.base import Prompt, Task

STRUCTURE_TASKS = ("arith",)  # the reference completion is exactly the working the task requires


class LengthShiftOptions(PatternOptions):
    upper_quantile: Annotated[float, Field(gt=0.0, lt=1.0, description="'long': above this quantile of the null")] = (
        0.75
    )
    alpha: Annotated[float, Field(gt=0.0, lt=1.0, description="odds below which an author's pattern is no chance")] = (
        1e-4
    )
    min_share: Annotated[
        float, Field(gt=0.0, le=1.0, description="a shifted author has at least this share of long completions")
    ] = 0.6
    extreme_quantile: Annotated[float, Field(gt=0.0, le=1.0, description="quantile of the null for one completion")] = (
        0.99
    )
    extreme_margin: Annotated[int, Field(ge=0, description="characters beyond that quantile to reject one")] = 16
    min_null: Annotated[int, Field(ge=1, description="completions of the author's model needed for its own null")] = 32


@dataclass(frozen=True)
class Seen:
    round: int
    author: str
    model_id: str
    excess: int


def excess(task: Task, candidate: Candidate) -> int:
    """Characters beyond the working the task requires (see the module docstring)."""
    reference = task.reference_completion(candidate.prompt) if task.name in STRUCTURE_TASKS else None
    return len(candidate.text) - (len(reference) if reference else 0)


@DEFENSES.register("length-shift")
class LengthShiftDefense(Defense):
    name = "length-shift"
    cost = 3
    Options = LengthShiftOptions

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.seen: deque[Seen] = deque()
        self.reference: deque[Seen] = deque()  # the receiver's own samples of models too few others run
        self.draws = ReferenceDraws()

    def null(self, ctx: DefenseContext, author: str, model_id: str, prompts: Sequence[Prompt]) -> torch.Tensor | None:
        """The excesses the author's completions are compared with; None when there is nothing fair."""
        family = [
            s.excess
            for s in self.seen
            if s.author != author and s.model_id == model_id and (s.author != ctx.self_id or model_id == ctx.model_id)
        ]
        if len(family) < self.options.min_null:
            family += [s.excess for s in self.sampled(ctx, model_id, prompts)]
        return torch.tensor(family, dtype=torch.float64) if len(family) >= self.options.min_null else None

    def sampled(self, ctx: DefenseContext, model_id: str, prompts: Sequence[Prompt]) -> list[Seen]:
        """The receiver's reference samples of ``model_id`` (:mod:`dgrpo.defense.reference`), this round's
        drawn once, the remembered rounds' kept."""
        for p, t in self.draws.new(ctx, model_id, prompts, self.options):
            self.reference.append(
                Seen(ctx.round, "", model_id, excess(ctx.task, Candidate("", p, t, 0, ctx.sampling, model_id)))
            )
        return [s for s in self.reference if s.model_id == model_id]

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        opts = self.options
        for memory in (self.seen, self.reference):
            forget(memory, ctx.round, opts.memory_rounds)
        sizes = [excess(ctx.task, c) for c in candidates]
        self.seen.extend(Seen(ctx.round, c.author, c.model_id, n) for c, n in zip(candidates, sizes, strict=True))
        verdicts: list[Verdict] = [ACCEPT] * len(candidates)
        for author in {c.author for c in candidates} - {ctx.self_id}:
            model_id = next(c.model_id for c in candidates if c.author == author)
            null = self.null(ctx, author, model_id, [c.prompt for c in candidates])
            if null is None:
                continue
            upper = float(null.quantile(opts.upper_quantile))
            extreme = float(null.quantile(opts.extreme_quantile)) + opts.extreme_margin
            mine = [s.excess for s in self.seen if s.author == author]
            k = sum(n > upper for n in mine)
            shifted = (
                k >= opts.min_share * len(mine) and binomial_tail(k, len(mine), 1 - opts.upper_quantile) < opts.alpha
            )
            for i, (c, n) in enumerate(zip(candidates, sizes, strict=True)):
                if c.author != author:
                    continue
                if shifted:
                    verdicts[i] = self.reject("shifted", k / len(mine))
                elif n > extreme:
                    verdicts[i] = self.reject("extreme", n - extreme)
        return verdicts
