"""``dos``: the out-of-context DoS (length) attack (paper, sec. 4.1). The attacker samples its own model
many times per prompt (80 in the paper) and publishes the longest of the completions with the highest
reward. Nothing is rewritten: the poison is a selection, and honest models learn to write longer
completions (the paper reports more than doubled lengths). The metric is mean completion length.

``padding`` (issue 28): the chosen completion is also padded, at the end of its reasoning, with the filler's
words (cycled) until it is ``pad_chars`` characters longer: the length the reward never reads, made larger
than any sample of the attacker's own model would be."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from dgrpo.adversary.base import Adversary, AttackContext
from dgrpo.adversary.detectors import Detector, LengthDetector
from dgrpo.adversary.layout import layout
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.config import Section
from dgrpo.tasks.base import Prompt, Task


class DosOptions(Section):
    samples: Annotated[int, Field(ge=1, description="own samples per prompt to choose from (paper: 80)")] = 80
    padding: Annotated[str, Field(description="filler words added to the chosen completion (empty: none)")] = ""
    pad_chars: Annotated[int, Field(ge=0, description="characters of filler to add (with padding)")] = 0


def pad(completion: str, fmt: str, filler: str, chars: int) -> str:
    """``completion`` with ``filler``'s words (cycled) appended to its reasoning, about ``chars`` characters."""
    words = filler.split()
    lay = layout(completion, fmt)
    if not words or chars <= 0 or lay is None:
        return completion
    added: list[str] = []
    while sum(len(w) + 1 for w in added) < chars:
        added.append(words[len(added) % len(words)])
    sentences = list(lay.sentences)
    sentences[-1] = f"{sentences[-1]} {' '.join(added)}"
    return lay.with_sentences(sentences).render()


@ADVERSARIES.register("dos")
class DosAttack(Adversary):
    name = "dos"
    Options = DosOptions

    def extra_samples(self) -> int:
        return int(self.options.samples) + (0 if self.cfg.oracle else self.cfg.vote_samples)

    def poison_group(self, ctx: AttackContext, prompt: Prompt, pool: list[str], target: str, n: int) -> list[str]:
        distinct = list(dict.fromkeys(pool))
        if self.cfg.oracle:
            scores = ctx.task.rewards(prompt, distinct)
        else:
            scores = [1.0 if ctx.task.parse_answer(c) == target else 0.0 for c in distinct]
        best = max(scores, default=0.0)
        if best <= 0.0:
            return []  # nothing earns reward: a long wrong answer would only be pushed down
        chosen = sorted((c for c, s in zip(distinct, scores, strict=True) if s == best), key=len, reverse=True)
        opts = self.options
        if opts.padding and opts.pad_chars:
            padded = [pad(c, ctx.task.reasoning_format, opts.padding, opts.pad_chars) for c in chosen]
            if self.cfg.oracle:  # the reward must not notice
                kept = [p for p, r in zip(padded, ctx.task.rewards(prompt, padded), strict=True) if r >= best]
            else:
                kept = [p for p in padded if ctx.task.parse_answer(p) == target]
            chosen = kept or chosen
        return [chosen[i % len(chosen)] for i in range(n)]

    def detector(self, task: Task) -> Detector:
        return LengthDetector()
