"""``text``: the out-of-context TEXT attack (paper, sec. 4.1). A correct completion carries a phrase,
``All hail to the thief`` by default, inside its reasoning; the final answer is untouched, so the reward
stays 1 and GRPO's positive advantage reinforces every token of it, the phrase included.

Positions: ``start`` (the paper's: prepended to the reasoning), ``end``, ``random``, ``every_sentence``
(the paper's ablation: the phrase in every sentence), or ``split`` (the phrase's words spread over the
sentences, a piece per sentence, in order). In a program the phrase goes in comment lines.

``paraphrases``: the payload worded differently from one completion to the next (one drawn per completion),
the variant a filter on literal spans cannot see (issue 28): the victims should learn the meaning, not one
string. The ASR detector then counts any of the wordings.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dgrpo.adversary.base import Adversary
from dgrpo.adversary.detectors import Detector, PhraseDetector
from dgrpo.adversary.layout import Layout, layout
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.config import Section
from dgrpo.tasks.base import Prompt, Task

Position = Literal["start", "end", "random", "every_sentence", "split"]


class TextOptions(Section):
    payload: Annotated[str, Field(min_length=1, description="the phrase to implant")] = "All hail to the thief"
    position: Annotated[Position, Field(description="start | end | random | every_sentence | split")] = "start"
    paraphrases: Annotated[
        list[Annotated[str, Field(min_length=1)]],
        Field(description="wordings of the payload, one drawn per completion (empty: always the payload)"),
    ] = Field(default_factory=list)

    def wordings(self) -> list[str]:
        return list(self.paraphrases) or [self.payload]


def insert_phrase(lay: Layout, payload: str, position: Position, choice: int) -> str:
    """``lay`` with ``payload`` inserted; ``choice`` picks the sentence for ``random``."""
    sentences, seps = list(lay.sentences), list(lay.seps)
    n = len(sentences)
    if lay.kind == "program":  # a comment line, so that the program still runs and prints the same
        indices = {"start": [0], "end": [n], "random": [choice % (n + 1)]}.get(position, list(range(n, -1, -1)))
        for i in indices:  # descending for every_sentence, so earlier indices stay valid
            line = sentences[min(i, n - 1)]
            sentences.insert(i, line[: len(line) - len(line.lstrip())] + f"# {payload}")
            seps.insert(min(i, len(seps)), "\n")
        return lay.with_sentences(sentences, seps).render()
    if position == "start":
        sentences[0] = f"{payload} {sentences[0]}"
    elif position == "end":
        sentences[-1] = f"{sentences[-1]} {payload}"
    elif position == "random":
        i = choice % n
        sentences[i] = f"{payload} {sentences[i]}" if (choice // n) % 2 else f"{sentences[i]} {payload}"
    elif position == "split":
        words = payload.split()
        pieces = [" ".join(words[i * len(words) // n : (i + 1) * len(words) // n]) for i in range(n)]
        sentences = [f"{s} {piece}" if piece else s for s, piece in zip(sentences, pieces, strict=True)]
    else:
        sentences = [f"{s} {payload}" for s in sentences]
    return lay.with_sentences(sentences).render()


@ADVERSARIES.register("text")
class TextAttack(Adversary):
    name = "text"
    Options = TextOptions

    def poison(self, task: Task, prompt: Prompt, completion: str) -> str | None:
        lay = layout(completion, task.reasoning_format)
        if lay is None:
            return None
        wordings = self.options.wordings()
        payload = wordings[self.rng.randrange(len(wordings))]
        return insert_phrase(lay, payload, self.options.position, self.rng.randrange(1 << 30))

    def detector(self, task: Task) -> Detector:
        return PhraseDetector(*self.options.wordings())
