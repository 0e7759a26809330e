"""``dos``: the out-of-context DoS (length) attack (paper, sec. 4.1). The attacker samples its own model
many times per prompt (80 in the paper) and publishes the longest of the completions with the highest
reward. Nothing is rewritten: the poison is a selection, and honest models learn to write longer
completions (the paper reports more than doubled lengths). The metric is mean completion length."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from dgrpo.adversary.base import Adversary, AttackContext
from dgrpo.adversary.detectors import Detector, LengthDetector
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.config import Section
from dgrpo.tasks.base import Prompt, Task


class DosOptions(Section):
    samples: Annotated[int, Field(ge=1, description="own samples per prompt to choose from (paper: 80)")] = 80


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
        return [chosen[i % len(chosen)] for i in range(n)]

    def detector(self, task: Task) -> Detector:
        return LengthDetector()
