"""``repetition``: a cross-model check for an implanted payload: the same words in many of one author's
completions, which the receiver itself never writes.

The out-of-context attacks of "Hail to the Thief" (sec. 4.1) want the victims to learn one fixed behaviour
(the phrase ``All hail to the thief``, an import of the attacker's library), so the attacker puts the same
words in every completion it poisons, whatever the prompt. Honest sampling does not repeat itself that way:
its wording follows the prompt and the sampler's noise. Measured on the tiny models (32 honest completions
of 16 prompts, the English-writing ``tiny-arith-text`` and ``tiny-arith-code-text``): no span of three or more
letters-words occurred twice. Where honest models do repeat wording (a real model's "Let's think step by
step", a program's ``for i in range``), the receiver's own model writes it too: n-grams the receiver wrote
itself (this round and the previous ``memory_rounds``) or read in the prompts are never counted.

This complements ``surprisal`` where it is blind: to a receiver whose model writes English words where the
phrase goes, the phrase is ordinary text (``docs/results.md``); repeated verbatim in every completion of one
author, it is not. It needs no model and works in any network. What it cannot stop: a payload the attacker
varies (paraphrases) from one completion to the next, which also weakens what the victims learn; in-context
attacks (MATH's false digit) and DoS, which repeat nothing.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from typing import Annotated

from pydantic import Field

from dgrpo.config import Section
from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.registry import DEFENSES

WORD_RE = re.compile(r"[^\W\d_]+")  # letters only: digits and symbols are what every arithmetic answer shares


class RepetitionOptions(Section):
    ngram: Annotated[int, Field(ge=1, le=16, description="words per span")] = 3
    min_completions: Annotated[
        int, Field(ge=2, description="an author's completions a span must occur in to count as implanted")
    ] = 4
    min_prompts: Annotated[int, Field(ge=1, description="... over at least this many of its prompts")] = 2
    memory_rounds: Annotated[
        int, Field(ge=0, description="rounds of the receiver's own wording remembered as ordinary text")
    ] = 8


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """The distinct spans of ``n`` consecutive letter-words of ``text``, lower-cased."""
    words = [w.casefold() for w in WORD_RE.findall(text)]
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def implanted(
    candidates: Sequence[Candidate], ordinary: set[tuple[str, ...]], n: int, min_completions: int, min_prompts: int
) -> dict[tuple[str, ...], set[str]]:
    """Per span, the authors whose completions hold it in at least ``min_completions`` completions over at
    least ``min_prompts`` prompts (spans in ``ordinary`` left out)."""
    seen: dict[tuple[str, tuple[str, ...]], list[str]] = defaultdict(list)  # (author, span) -> prompt ids
    for c in candidates:
        for span in ngrams(c.text, n) - ordinary:
            seen[(c.author, span)].append(c.prompt.id)
    out: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for (author, span), prompts in seen.items():
        if len(prompts) >= min_completions and len(set(prompts)) >= min_prompts:
            out[span].add(author)
    return out


@DEFENSES.register("repetition")
class RepetitionDefense(Defense):
    name = "repetition"
    cost = 5
    Options = RepetitionOptions

    def __init__(self, options: dict[str, object] | None = None) -> None:
        super().__init__(options)
        self._own: deque[set[tuple[str, ...]]] = deque(maxlen=max(1, self.options.memory_rounds))
        self._round = -1

    def _remember(self, ctx: DefenseContext, own: Iterable[str]) -> set[tuple[str, ...]]:
        """The receiver's own wording over the last rounds, this round's included."""
        spans: set[tuple[str, ...]] = set()
        for text in own:
            spans |= ngrams(text, self.options.ngram)
        if ctx.round != self._round:
            self._own.append(spans)
            self._round = ctx.round
        else:
            self._own[-1] |= spans
        return set().union(*self._own)

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        n = self.options.ngram
        own = [c.text for c in candidates if c.author == ctx.self_id]
        ordinary = self._remember(ctx, own)
        for c in candidates:
            ordinary |= ngrams(c.prompt.text, n)
        peers = [c for c in candidates if c.author != ctx.self_id]
        flagged = implanted(peers, ordinary, n, self.options.min_completions, self.options.min_prompts)
        verdicts = []
        for c in candidates:
            hits = [span for span in ngrams(c.text, n) if c.author in flagged.get(span, ())]
            implanted_here = hits and c.author != ctx.self_id
            verdicts.append(self.reject("repeated_span", float(len(hits))) if implanted_here else ACCEPT)
        return verdicts
