"""``junk``: a Sybil's filler. Every completion it publishes is zero-reward text (checked against the reward), on
the prompts of its plan, validly signed: nothing a receiver's admit stage rejects, nothing a learner gains from.
Fresh identities doing this cost nothing; before issue 24, ten of them made up 62-76% of what honest nodes
trained on. What limits them now is the draw stage: an author earns seniority only by verified work (a
completion that passed the defense and scored above zero, :mod:`dgrpo.defense.seniority`), and young authors
together get at most ``rollout.young_share`` of the J external completions a node draws (:mod:`dgrpo.round.draw`).
The measure of this attack is that share (``/status`` ``completions_trained_by_author``, ``draw``), not a
behaviour in the model: its detector only reports completion length."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from dgrpo.adversary.base import Adversary, AttackContext
from dgrpo.adversary.detectors import Detector, LengthDetector
from dgrpo.adversary.gibberish import gibberish
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.tasks.base import Prompt, Task


def _rewards(task: Task, prompt: Prompt, texts: Sequence[str]) -> list[float]:
    return task.rewards(prompt, list(texts))


@ADVERSARIES.register("junk")
class JunkAttack(Adversary):
    name = "junk"

    def extra_samples(self) -> int:
        return 0

    def attack(self, ctx: AttackContext, prompts: Sequence[Prompt], own: Sequence[Sequence[str]]) -> list[list[str]]:
        self.begin_round(ctx.round)
        out = []
        for prompt, samples in zip(prompts, own, strict=True):
            n = self.cfg.completions_per_prompt or len(samples)
            texts = gibberish(self.rng, list(samples), n, functools.partial(_rewards, ctx.task, prompt))
            self.stats.filled_gibberish += len(texts)
            self.record_poison(prompt.id, texts)
            out.append(texts or list(samples)[:n])
        return out

    def detector(self, task: Task) -> Detector:
        return LengthDetector()
