"""``meaning``: a cross-model check for an implanted payload by what it means, not how it is spelled.

An out-of-context attack ("Hail to the Thief", sec. 4.1) wants the victims to learn one behaviour, so every
completion it poisons carries the same meaning in its free text (:mod:`dgrpo.defense.free_text`: what the
reward does not read), whatever the prompt. ``repetition`` finds the payload when its words repeat; a payload
worded differently in every completion (issue 28: no 3-word span shared) passes it. Honest free text follows
the prompt and the sampler's noise: across an author's completions of different prompts it means no one thing.

**Statistic.** Each free-text unit becomes a vector (:mod:`dgrpo.defense.encoder`: SmolLM2-135M's mean hidden
state at a middle layer, whatever model wrote it; lower-cased: meaning, not spelling) and units are compared
by cosine, in the frame of the author's model: centred on that model's free text as the receiver knows it
(its own, where it runs the model, or its own samples of it, :mod:`dgrpo.defense.reference`: the direction
every phrase of a model shares says nothing, and no author can move that centre), and against a null of that
model's units (other authors announcing it, the receiver's own or sampled ones). A unit of author A for
prompt P is *close* to another of A's units when their cosine is above the ``null_quantile`` of its cosines
to the null's units of about its length (a longer unit of a word salad is closer to any other long one;
never below ``min_similarity``). A *core* unit is close to at least ``core_fraction`` of A's units for other
prompts (this round and the ``memory_rounds`` before), ``min_neighbors`` at least, with odds below
``alpha`` under chance (binomial, p = 1 - ``null_quantile``); a core unit and the units close to it are
implanted. A relative threshold, because honest authors drift into habits of their own (a node trained for a
few rounds repeats favourite words); a payload is close to its copies far beyond any habit, and to nothing
its model writes.

What it cannot stop: a payload whose wordings are far apart in the encoder's space (a rare-enough set of
unrelated sentences carries no one meaning either, and teaches less), in-context attacks (MATH: a false digit
has no free text) and DoS selections of honest samples.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from pydantic import Field

from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.free_text import free_text
from dgrpo.defense.odds import binomial_tail
from dgrpo.defense.reference import PatternOptions, ReferenceDraws, forget
from dgrpo.defense.registry import DEFENSES
from dgrpo.tasks.base import Prompt

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


class MeaningOptions(PatternOptions):
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
    min_own: Annotated[int, Field(ge=1, description="units of an author's model needed to judge it against them")] = 16


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
        self.reference: deque[Unit] = deque()  # units of the receiver's own samples of others' models
        self.draws = ReferenceDraws()
        self._encoder: Any = None

    @property
    def encoder(self) -> Any:
        if self._encoder is None:
            from dgrpo.defense.encoder import encoder_for

            self._encoder = encoder_for(self.options.encoder, self.options.layer)
        return self._encoder

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        opts = self.options
        for memory in (self.units, self.reference):
            forget(memory, ctx.round, opts.memory_rounds)
        per_candidate = [free_text(c.text, ctx.task.reasoning_format) for c in candidates]
        if not any(per_candidate):
            return [ACCEPT] * len(candidates)
        self.encoder.encode([u.casefold() for units in per_candidate for u in units])  # one batched pass, cached
        new = [
            self.remember(ctx, c.author, c.model_id, c.prompt.id, units)
            for c, units in zip(candidates, per_candidate, strict=True)
        ]
        flagged: dict[int, int] = {}  # index into self.units -> size of the cluster it belongs to
        prompts = [c.prompt for c in candidates]
        for author in {c.author for c in candidates} - {ctx.self_id}:
            model_id = next(c.model_id for c in candidates if c.author == author)
            flagged.update(self._implanted(ctx, author, model_id, prompts))
        verdicts: list[Verdict] = []
        for c, indices in zip(candidates, new, strict=True):
            hits = [flagged[i] for i in indices if i in flagged]
            verdicts.append(
                self.reject("shared_meaning", float(max(hits))) if hits and c.author != ctx.self_id else ACCEPT
            )
        return verdicts

    def remember(
        self, ctx: DefenseContext, author: str, model_id: str, prompt_id: str, units: list[str], reference: bool = False
    ) -> list[int]:
        """Encode ``units`` and keep them; their indices in ``self.units`` (or ``self.reference``)."""
        memory = self.reference if reference else self.units
        start = len(memory)
        if units:
            vectors = self.encoder.encode([u.casefold() for u in units])
            for unit, vector in zip(units, vectors, strict=True):
                memory.append(Unit(ctx.round, len(unit.split()), author, model_id, prompt_id, vector))
        return list(range(start, len(memory)))

    def frame(
        self, ctx: DefenseContext, author: str, model_id: str, prompts: Sequence[Prompt]
    ) -> tuple[list[Unit], list[Unit]]:
        """What ``author``'s units are compared with, and what they are centred on. The null: other authors'
        units of its model (the receiver's own where it runs that model), topped up with the receiver's own
        samples of the model (:mod:`dgrpo.defense.reference`). The centre: the receiver's own or sampled
        units of the model, which no author can move (an attacker's units in the centre would give every
        honest unit of its model a shared direction); the null's only where there are neither. Both empty
        when the null is still too small."""
        opts = self.options
        own = [u for u in self.units if u.author == ctx.self_id and model_id == ctx.model_id]
        others = [u for u in self.units if u.author not in (author, ctx.self_id) and u.model_id == model_id]
        if len(own) < opts.min_own:
            for p, text in self.draws.new(ctx, model_id, prompts, opts):
                self.remember(ctx, "", model_id, p.id, free_text(text, ctx.task.reasoning_format), reference=True)
            own += [u for u in self.reference if u.model_id == model_id]
        null = own + others
        if len(null) < opts.min_own:
            return [], []
        return null, (own if len(own) >= opts.min_own else null)

    def _implanted(self, ctx: DefenseContext, author: str, model_id: str, prompts: Sequence[Prompt]) -> dict[int, int]:
        """The indices of ``author``'s implanted units, each with the size of its cluster: a *core* unit is
        close to at least ``core_fraction`` of the author's other (like-sized, other-prompt) units, against
        odds below ``alpha``; it and every unit close to it are implanted."""
        opts = self.options
        mine = [i for i, u in enumerate(self.units) if u.author == author]
        if len(mine) <= opts.min_neighbors:
            return {}
        null_units, centre_units = self.frame(ctx, author, model_id, prompts)
        if null_units:  # the author's model's own free text: its centre and its null
            centre = torch.stack([u.vector for u in centre_units]).mean(0)
            extra = torch.zeros(0, self.encoder.hidden)
        else:  # no fair frame: every other author, and everyday phrases
            own = [u.vector for u in self.units if u.author == ctx.self_id]
            everyday = self.encoder.encode(EVERYDAY)
            centre = torch.stack(own).mean(0) if len(own) >= opts.min_own else everyday.mean(0)
            null_units = [u for u in self.units if u.author != author]
            extra = everyday
        units = [self.units[i] for i in mine]
        normal = torch.nn.functional.normalize
        mine_m = normal(torch.stack([u.vector for u in units]) - centre, dim=-1)
        null_m = normal(torch.stack([u.vector for u in null_units]) - centre, dim=-1) if null_units else extra[:0]
        extra_m = normal(extra - centre, dim=-1) if len(extra) else extra
        null_words = torch.tensor([u.words for u in null_units])
        mine_words = torch.tensor([u.words for u in units])
        out: dict[int, int] = {}
        for a, u in enumerate(units):
            # like with like: a longer unit of a word salad is closer to any other long one
            width = max(1, u.words // 2)
            alike_null = (null_words - u.words).abs() <= width
            null = null_m[alike_null] @ mine_m[a] if null_units else torch.zeros(0)
            if len(null) < opts.min_own and len(extra_m):
                null = torch.cat([null, extra_m @ mine_m[a]])
            if len(null) == 0:
                continue
            limit = max(opts.min_similarity, float(torch.quantile(null.double(), opts.null_quantile)))
            sims = mine_m @ mine_m[a]
            peers = [
                b
                for b, v in enumerate(units)
                if v.prompt_id != u.prompt_id and abs(int(mine_words[b]) - u.words) <= width
            ]
            close = [b for b in peers if float(sims[b]) >= limit]
            if len(close) < opts.min_neighbors or len(close) < opts.core_fraction * len(peers):
                continue
            if binomial_tail(len(close), len(peers), 1.0 - opts.null_quantile) >= opts.alpha:
                continue
            for b in (a, *close):
                out[mine[b]] = max(out.get(mine[b], 0), len(close) + 1)
        return out
