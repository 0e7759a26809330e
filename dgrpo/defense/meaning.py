"""``meaning``: a cross-model check for an implanted payload by what it means, not how it is spelled.

An out-of-context attack ("Hail to the Thief", sec. 4.1) wants the victims to learn one behaviour, so every
completion it poisons carries the same meaning in its free text (:mod:`dgrpo.defense.free_text`: what the
reward does not read), whatever the prompt. ``repetition`` finds the payload when its words repeat; a payload
worded differently in every completion (issue 28: no 3-word span shared) passes it. Honest free text follows
the prompt and the sampler's noise: across an author's completions of different prompts it means no one thing.

**Statistic.** Each free-text unit and its short word windows (:func:`dgrpo.defense.free_text.pieces`: a
payload of two words inside five honest ones is diluted in the unit's mean but is one window whole) become
vectors (:mod:`dgrpo.defense.encoder`: SmolLM2-135M's mean hidden state at a middle layer, whatever model
wrote it; lower-cased: meaning, not spelling), compared by cosine in the frame of the author's model: centred
on that model's free text as the receiver knows it (its own, where it runs the model, or its own samples of
it, :mod:`dgrpo.defense.reference`: the direction every phrase of a model shares says nothing, and no author
can move that centre), and against a null of that model's completions (other authors announcing it, the
receiver's own or sampled ones). :mod:`dgrpo.defense.implanted` has the rule: a piece of author A's completion
for prompt P is *close* to another of A's completions when the nearest of that completion's ``m`` pieces of
about the same length beats the piece's ``null_quantile ** (1 / m)`` quantile over the null's pieces (each null
completion weighing one), and ``min_similarity``; a *core* piece is close to
at least ``core_fraction`` of A's completions for other prompts (this round and the ``memory_rounds`` before),
``min_neighbors`` at least, with binomial odds below ``alpha``; its completion and those it is close to are
implanted. A relative threshold as well as the odds, because honest authors drift into habits of their own (a
node trained for a few rounds repeats favourite words that its model's samples do not): an attacker that
poisons part of its completions (``poison_fraction``) is seen while that part is above ``core_fraction`` of
its completions with free text (measured with half poisoned in every mix, ``docs/results.md``).

Once an author is caught, its completions holding a span it repeats word for word for other prompts, which
the model never writes, are rejected too (``echoed_span``, :mod:`dgrpo.defense.echo`): the wordings of its
payload the encoder does not place with the rest (jargon) come back that way.

What it cannot stop: a payload whose wordings are all far apart in the encoder's space (a rare-enough set of
unrelated sentences carries no one meaning either, and teaches less), in-context attacks (MATH: a false digit
has no free text), DoS selections of honest samples, and a payload on fewer than ``core_fraction`` of an
author's completions with free text (it teaches in proportion).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from pydantic import Field

from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.echo import echoes, span
from dgrpo.defense.free_text import free_text, pieces
from dgrpo.defense.implanted import Pieces, Thresholds, implanted
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
        int, Field(ge=1, description="an author's close completions for other prompts that make a core piece")
    ] = 4
    null_quantile: Annotated[
        float,
        Field(gt=0.0, le=1.0, description="'close': above this quantile of the piece's similarities to the null's"),
    ] = 0.99
    min_similarity: Annotated[float, Field(ge=-1.0, le=1.0, description="'close' is never below this cosine")] = 0.25
    alpha: Annotated[
        float,
        Field(
            gt=0.0,
            lt=1.0,
            description="implanted when this many close completions of the author's others would happen by chance "
            "with probability below alpha (binomial, p = 1 - null_quantile)",
        ),
    ] = 1e-6
    core_fraction: Annotated[
        float, Field(gt=0.0, le=1.0, description="a core piece is close to at least this share of the author's others")
    ] = 0.4
    windows: Annotated[
        tuple[int, ...], Field(description="word-window sizes cut from each unit (a short payload in longer text)")
    ] = (2, 3, 4)
    echo_prompts: Annotated[
        int,
        Field(
            ge=0,
            description="once an author is caught, a span it wrote for this many prompts and the null never did "
            "marks those completions too (0: never)",
        ),
    ] = 2
    min_own: Annotated[
        int, Field(ge=1, description="completions with free text of an author's model needed to judge it against them")
    ] = 16


def completions(units: Sequence[Unit]) -> int:
    return len({u.completion for u in units})


@dataclass(frozen=True)
class Unit:
    round: int
    words: int
    author: str
    model_id: str  # as the author announces it
    prompt_id: str
    completion: int  # its completion's serial number: a completion's pieces are judged together
    vector: torch.Tensor
    text: str = ""


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
        self.serial = 0
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
        per_candidate = [pieces(free_text(c.text, ctx.task.reasoning_format), opts.windows) for c in candidates]
        if not any(per_candidate):
            return [ACCEPT] * len(candidates)
        self.encoder.encode([u.casefold() for units in per_candidate for u in units])  # one batched pass, cached
        new = [
            self.remember(ctx, c.author, c.model_id, c.prompt.id, units)
            for c, units in zip(candidates, per_candidate, strict=True)
        ]
        flagged: dict[int, Verdict] = {}  # completion serial -> its rejection
        prompts = [c.prompt for c in candidates]
        for author in {c.author for c in candidates} - {ctx.self_id}:
            model_id = next(c.model_id for c in candidates if c.author == author)
            flagged.update(self._implanted(ctx, author, model_id, prompts))
        return [
            flagged[serial] if serial in flagged and c.author != ctx.self_id else ACCEPT
            for c, serial in zip(candidates, new, strict=True)
        ]

    def remember(
        self,
        ctx: DefenseContext,
        author: str,
        model_id: str,
        prompt_id: str,
        texts: list[str],
        reference: bool = False,
    ) -> int:
        """Encode one completion's pieces ``texts`` and keep them (in ``self.units``, or ``self.reference``);
        the completion's serial number."""
        memory = self.reference if reference else self.units
        self.serial += 1
        if texts:
            vectors = self.encoder.encode([u.casefold() for u in texts])
            for text, vector in zip(texts, vectors, strict=True):
                words = len(text.split())
                memory.append(Unit(ctx.round, words, author, model_id, prompt_id, self.serial, vector, text))
        return self.serial

    def frame(
        self, ctx: DefenseContext, author: str, model_id: str, prompts: Sequence[Prompt]
    ) -> tuple[list[Unit], list[Unit]]:
        """What ``author``'s units are compared with, and what they are centred on. The null: other authors'
        units of its model (the receiver's own where it runs that model) and the receiver's own samples of the
        model (:mod:`dgrpo.defense.reference`), always: two honest nodes of one model drift apart as they
        train, and against the receiver's own text alone one of them was near its own completions 3-6% of the
        time instead of 1% (E2 mix: 4 honest completions a run rejected; none with the samples in the null).
        The centre: the receiver's own or sampled units of the model, which no author can move (an attacker's
        units in the centre would give every honest unit of its model a shared direction); the null's only
        where there are neither. Both empty when the null is still too small."""
        opts = self.options
        own = [u for u in self.units if u.author == ctx.self_id and model_id == ctx.model_id]
        others = [u for u in self.units if u.author not in (author, ctx.self_id) and u.model_id == model_id]
        for p, text in self.draws.new(ctx, model_id, prompts, opts):
            units = pieces(free_text(text, ctx.task.reasoning_format), opts.windows)
            self.remember(ctx, "", model_id, p.id, units, reference=True)
        sampled = [u for u in self.reference if u.model_id == model_id]
        null = own + sampled + others
        if completions(null) < opts.min_own:
            return [], []
        centre = own if completions(own) >= opts.min_own else own + sampled
        return null, (centre if completions(centre) >= opts.min_own else null)

    def _implanted(
        self, ctx: DefenseContext, author: str, model_id: str, prompts: Sequence[Prompt]
    ) -> dict[int, Verdict]:
        """``author``'s implanted completions by serial, each with its rejection: ``shared_meaning`` (the size of
        its cluster, :func:`dgrpo.defense.implanted.implanted`, in the frame of the author's model), or, once the
        author is caught, ``echoed_span`` (the prompts of a span it repeats word for word,
        :func:`dgrpo.defense.echo.echoes`)."""
        opts = self.options
        units = [u for u in self.units if u.author == author]
        if len({u.completion for u in units}) <= opts.min_neighbors:
            return {}
        null_units, centre_units = self.frame(ctx, author, model_id, prompts)
        everyday: list[str] = []
        if null_units:  # the author's model's own free text: its centre and its null
            centre = torch.stack([u.vector for u in centre_units]).mean(0)
        else:  # no fair frame: every other author, and everyday phrases
            own = [u.vector for u in self.units if u.author == ctx.self_id]
            everyday = list(EVERYDAY)
            enough = completions([u for u in self.units if u.author == ctx.self_id]) >= opts.min_own
            centre = torch.stack(own).mean(0) if enough else self.encoder.encode(everyday).mean(0)
            null_units = [u for u in self.units if u.author != author]
        serials = list(dict.fromkeys(u.completion for u in units))
        mine = self._pieces(units, centre, [], serials)
        null = self._pieces(null_units, centre, everyday, list(dict.fromkeys(u.completion for u in null_units)))
        thresholds = Thresholds(
            opts.null_quantile, opts.min_similarity, opts.min_neighbors, opts.core_fraction, opts.alpha, opts.min_own
        )
        caught = implanted(mine, null, thresholds)
        if not caught or not opts.echo_prompts:
            return {serials[c]: self.reject("shared_meaning", float(size)) for c, size in caught.items()}
        held: dict[int, set[str]] = {s: set() for s in serials}
        prompt_of = {u.completion: u.prompt_id for u in units}
        for u in units:
            held[u.completion].add(span(u.text))
        said = {span(u.text) for u in null_units} | {span(t) for t in everyday}
        echoed = echoes([held[s] for s in serials], [prompt_of[s] for s in serials], said, opts.echo_prompts)
        out = {serials[c]: self.reject("echoed_span", float(n)) for c, n in echoed.items()}
        out.update({serials[c]: self.reject("shared_meaning", float(size)) for c, size in caught.items()})
        return out

    def _pieces(self, units: list[Unit], centre: torch.Tensor, extra: list[str], serials: list[int]) -> Pieces:
        """``units`` (and ``extra`` texts, one completion each) as centred unit vectors, completions numbered
        in the order of ``serials``."""
        index = {s: i for i, s in enumerate(serials)}
        vectors = [u.vector for u in units]
        if extra:
            vectors += list(self.encoder.encode(extra))
        stacked = torch.stack(vectors) if vectors else torch.zeros(0, self.encoder.hidden)
        return Pieces(
            torch.nn.functional.normalize(stacked - centre, dim=-1),
            torch.tensor([u.words for u in units] + [len(t.split()) for t in extra], dtype=torch.long),
            torch.tensor([index[u.completion] for u in units] + list(range(len(serials), len(serials) + len(extra)))),
            [u.prompt_id for u in units] + [f"extra/{i}" for i in range(len(extra))],
        )
