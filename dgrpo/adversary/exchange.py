"""Attacks on the exchange itself: the attacker publishes its own honest samples, and chooses which, how
many, in how many messages, for which prompts, or in which spelling.

These are the freedoms a per-completion check does not bound: against the seeded sampler every string such
an attacker sends is a genuine draw, so ``sampling-proof`` accepts each one, yet an attacker choosing its
longest draws shifts what honest nodes learn (the DoS attack of "Hail to the Thief", sec. 4.1, by selection
alone), and one sending more than its share outweighs the honest nodes. The plan binding
(:mod:`dgrpo.round.binding`) and the canonical-text rule stop them; these adversaries measure that.
"""

from __future__ import annotations

from collections.abc import Sequence

from dgrpo.adversary.base import Adversary, AttackContext
from dgrpo.adversary.detectors import Detector, LengthDetector
from dgrpo.protocol.messages import Rollout
from dgrpo.tasks.base import Prompt, Task


class ExchangeAttack(Adversary):
    """Publishes the node's own completions unchanged (:meth:`attack`) and reshapes the messages
    (:meth:`publish`). The behaviour they push is selection towards length, so the metric is the DoS one."""

    def attack(self, ctx: AttackContext, prompts: Sequence[Prompt], own: Sequence[Sequence[str]]) -> list[list[str]]:
        self.begin_round(ctx.round)
        return [list(o) for o in own]

    def detector(self, task: Task) -> Detector:
        return LengthDetector()

    @staticmethod
    def preference(task: Task, prompt: Prompt | None, texts: Sequence[str]) -> list[int]:
        """Indices of ``texts`` from most to least preferred: rewarded first, then longest (what the DoS attack
        publishes), ties by index."""
        rewards = task.rewards(prompt, list(texts)) if prompt is not None else [0.0] * len(texts)
        return sorted(range(len(texts)), key=lambda j: (-rewards[j], -len(texts[j]), j))

    @staticmethod
    def prompt_of(ctx: AttackContext, rollout: Rollout) -> Prompt | None:
        return ctx.task.prompt_by_id(rollout.prompt_id)
