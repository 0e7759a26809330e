"""``repeat-part``: one draw sent several times, each copy in a message of its own.

Receivers deduplicated by (author, part), and indices restarted at 0 in each message, so an attacker could
send its preferred genuine draw for a prompt in ``copies`` extra parts and have it counted ``copies`` times
more. ``mode = "extra"`` announces the extra parts (``parts`` above the plan's size: ``wrong_parts``);
``"replace"`` keeps ``parts`` and gives the last ``copies`` parts to repeats of the first prompt instead of
their own prompts (a second rollout for one prompt, ``duplicate_prompt``, and the plan no longer covered,
``incomplete``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dgrpo.adversary.base import AttackContext
from dgrpo.adversary.exchange import ExchangeAttack
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.config import Section
from dgrpo.protocol.messages import Rollout


class RepeatPartOptions(Section):
    copies: Annotated[int, Field(ge=1, description="extra messages per repeated prompt")] = 3
    mode: Annotated[
        Literal["extra", "replace"],
        Field(description="extra: announce more parts; replace: reuse the last parts' slots"),
    ] = "extra"


@ADVERSARIES.register("repeat-part")
class RepeatPartAttack(ExchangeAttack):
    name = "repeat-part"
    Options = RepeatPartOptions

    def repeats(self, ctx: AttackContext, r: Rollout, part: int, parts: int) -> list[Rollout]:
        best = r.completions[self.preference(ctx.task, self.prompt_of(ctx, r), r.completions)[0]]
        texts = (best,) * len(r.completions)
        self.record_poison(r.prompt_id, [best] * self.options.copies * len(texts))
        return [
            r.model_copy(update={"part": part + k, "parts": parts, "completions": texts, "tokens": ()})
            for k in range(self.options.copies)
        ]

    def publish(self, ctx: AttackContext, rollouts: list[Rollout]) -> list[Rollout]:
        if not rollouts:
            return rollouts
        copies = self.options.copies
        if self.options.mode == "extra":
            parts = len(rollouts) * (1 + copies)
            out = [r.model_copy(update={"parts": parts}) for r in rollouts]
            for i, r in enumerate(rollouts):
                out += self.repeats(ctx, r, len(rollouts) + i * copies, parts)
            return out
        keep = max(1, len(rollouts) - copies)
        return rollouts[:keep] + self.repeats(ctx, rollouts[0], keep, len(rollouts))[: len(rollouts) - keep]
