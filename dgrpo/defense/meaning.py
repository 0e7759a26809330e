"""``meaning``: a cross-model check for an implanted payload by what it means, not how it is spelled.

An out-of-context attack ("Hail to the Thief", sec. 4.1) wants the victims to learn one behaviour, so every
completion it poisons carries the same meaning in its free text (:mod:`dgrpo.defense.free_text`: what the
reward does not read), whatever the prompt. ``repetition`` finds the payload when its words repeat; a payload
worded differently in every completion (issue 28: no 3-word span shared) passes it. Honest free text follows
the prompt and the sampler's noise: across an author's completions of different prompts it means no one thing.

**Statistic.** Each free-text unit becomes a vector (:mod:`dgrpo.defense.encoder`: SmolLM2-135M's mean hidden
state at a middle layer, whatever model wrote it), centred on the receiver's own free text (the direction
every English phrase shares says nothing; without enough own text, on a fixed set of everyday phrases), and
compared by cosine. A unit of author A for prompt P is *implanted* when at least ``min_neighbors`` of A's
units for other prompts (this round and the ``memory_rounds`` before) are closer to it than it is to what
others write: the threshold is the ``null_quantile`` of its similarities to the units of every other author,
the receiver's own and the everyday phrases (never below ``min_similarity``). A relative threshold, because
how close two phrases are depends on the phrases (two one-word units of a word salad can be close); an
author's payload is close to its other copies and to nothing anyone else writes. The receiver's own wording
is in that null, so a style the receiver shares is never the author's payload.

What it cannot stop: a payload whose wordings are far apart in the encoder's space (a rare-enough set of
unrelated sentences carries no one meaning either, and teaches less), in-context attacks (MATH: a false digit
has no free text) and DoS selections of honest samples.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from pydantic import Field

from dgrpo.config import Section
from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.free_text import free_text
from dgrpo.defense.registry import DEFENSES

log = logging.getLogger(__name__)

# Everyday phrases and words, none about arithmetic: the centre and part of the null where the receiver has
# too little free text of its own (a digits-only model).
EVERYDAY = (  # noqa: SIM905 (a list literal would take 90 lines)
    "the weather is nice today|please close the door|a cup of tea|we went to the market|time to go home|"
    "she reads a book|the train was late|open the window|my brother plays football|it was a long day|"
    "green apples|the river is cold|a small house|he likes music|turn left at the corner|"
    "the meeting starts at noon|dogs and cats|a quiet evening|write your name here|the shop is closed|"
    "children play outside|bread and butter|a red car|thank you very much|the garden needs water|"
    "we should leave soon|an old friend|the movie was good|call me tomorrow|the sun is bright|"
    "walk slowly|the keys are on the table|a warm coat|birds sing in the morning|paper and pen|"
    "the office is far|listen carefully|a blue sky|they built a bridge|the soup is hot|wait here|"
    "a busy street|learn something new|the clock stopped|fresh fish|the door is open|count to ten|"
    "a happy song|the road is wet|my phone is broken|stone|window|happy|run|table|light|mountain|quickly|"
    "because|yellow|family|question|answer|story|number|water|city|morning|between|always|never|around|"
    "little|large|place|work"
).split("|")


class MeaningOptions(Section):
    encoder: Annotated[str, Field(description="model whose hidden states encode free text")] = (
        "pypi:SmolLM2-135M-Instruct"
    )
    layer: Annotated[int, Field(ge=0, description="hidden layer read (SmolLM2 has 30)")] = 16
    min_neighbors: Annotated[
        int, Field(ge=1, description="an author's close units for other prompts that make a core unit")
    ] = 4
    null_quantile: Annotated[
        float, Field(gt=0.0, le=1.0, description="'close': above this quantile of the unit's similarities to others")
    ] = 0.95
    min_similarity: Annotated[float, Field(ge=-1.0, le=1.0, description="'close' is never below this cosine")] = 0.3
    alpha: Annotated[
        float,
        Field(
            gt=0.0,
            lt=1.0,
            description="implanted when this many close units out of the author's others would happen by chance "
            "with probability below alpha (binomial, p = 1 - null_quantile)",
        ),
    ] = 1e-6
    core_fraction: Annotated[
        float, Field(gt=0.0, le=1.0, description="a core unit is close to at least this share of the author's others")
    ] = 0.5
    memory_rounds: Annotated[int, Field(ge=0, description="earlier rounds of units compared with")] = 4
    min_own: Annotated[int, Field(ge=1, description="own units needed to centre on the receiver's own text")] = 16


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how often chance alone puts k of n units this close."""
    return sum(math.comb(n, i) * p**i * (1.0 - p) ** (n - i) for i in range(k, n + 1)) if k > 0 else 1.0


@dataclass(frozen=True)
class Unit:
    round: int
    words: int
    author: str
    model_id: str  # as the author announces it
    prompt_id: str
    vector: torch.Tensor


@DEFENSES.register("meaning")
class MeaningDefense(Defense):
    name = "meaning"
    cost = 40
    Options = MeaningOptions

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.units: deque[Unit] = deque()  # every author's units of the remembered rounds, the receiver's too
        self._encoder: Any = None

    @property
    def encoder(self) -> Any:
        if self._encoder is None:
            from dgrpo.defense.encoder import encoder_for

            self._encoder = encoder_for(self.options.encoder, self.options.layer)
        return self._encoder

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        opts = self.options
        fmt = ctx.task.reasoning_format
        per_candidate = [free_text(c.text, fmt) for c in candidates]
        texts = [u.casefold() for units in per_candidate for u in units]
        if not texts:
            return [ACCEPT] * len(candidates)
        vectors = self.encoder.encode(texts)
        while self.units and self.units[0].round < ctx.round - opts.memory_rounds:
            self.units.popleft()
        new: list[list[int]] = []  # per candidate, indices into self.units of its units
        k = 0
        for c, units in zip(candidates, per_candidate, strict=True):
            new.append(list(range(len(self.units), len(self.units) + len(units))))
            for unit in units:
                self.units.append(Unit(ctx.round, len(unit.split()), c.author, c.model_id, c.prompt.id, vectors[k]))
                k += 1
        everyday = self.encoder.encode(EVERYDAY)
        remembered = list(self.units)
        own = [u.vector for u in remembered if u.author == ctx.self_id]
        centre = torch.stack(own).mean(0) if len(own) >= opts.min_own else everyday.mean(0)
        matrix = torch.nn.functional.normalize(torch.stack([u.vector for u in remembered]) - centre, dim=-1)
        reference = torch.nn.functional.normalize(everyday - centre, dim=-1)
        flagged: dict[int, int] = {}  # unit index -> size of the cluster it belongs to
        for author in {c.author for c in candidates} - {ctx.self_id}:
            flagged.update(self._implanted(ctx, remembered, matrix, reference, author))
        verdicts: list[Verdict] = []
        for c, indices in zip(candidates, new, strict=True):
            hits = [flagged[i] for i in indices if i in flagged]
            verdicts.append(
                self.reject("shared_meaning", float(max(hits))) if hits and c.author != ctx.self_id else ACCEPT
            )
        return verdicts

    def _implanted(
        self, ctx: DefenseContext, units: list[Unit], matrix: torch.Tensor, reference: torch.Tensor, author: str
    ) -> dict[int, int]:
        """The indices of ``author``'s implanted units, each with the size of its cluster: a *core* unit is
        close to at least ``core_fraction`` of the author's other (like-sized, other-prompt) units, against
        odds below ``alpha``; it and every unit close to it are implanted."""
        opts = self.options
        mine = [i for i, u in enumerate(units) if u.author == author]
        if len(mine) <= opts.min_neighbors:
            return {}
        model = units[mine[0]].model_id
        words = torch.tensor([u.words for u in units])
        is_other = torch.tensor([u.author != author for u in units])
        family = is_other & torch.tensor([u.model_id == model or u.author == ctx.self_id for u in units])
        out: dict[int, int] = {}
        for i in mine:
            sims = matrix @ matrix[i]
            # like with like: a longer unit of a word salad is closer to any other long one
            alike = (words - words[i]).abs() <= max(1, int(words[i]) // 2)
            others = family & alike if int((family & alike).sum()) >= opts.min_own else is_other & alike
            null = sims[others]
            if int(others.sum()) < opts.min_own:
                null = torch.cat([null, reference @ matrix[i]])
            limit = max(opts.min_similarity, float(torch.quantile(null.double(), opts.null_quantile)))
            peers = [j for j in mine if units[j].prompt_id != units[i].prompt_id and bool(alike[j])]
            close = [j for j in peers if float(sims[j]) >= limit]
            if len(close) < opts.min_neighbors or len(close) < opts.core_fraction * len(peers):
                continue
            if binomial_tail(len(close), len(peers), 1.0 - opts.null_quantile) >= opts.alpha:
                continue
            for j in (i, *close):
                out[j] = max(out.get(j, 0), len(close) + 1)
        return out
