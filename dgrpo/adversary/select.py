"""``select``: publish only the seeded draws that suit the attacker, withholding the rest.

The attacker samples honestly with the seeded sampler, so every string it sends passes ``sampling-proof``;
it keeps its ``keep`` preferred draws per prompt (rewarded, then longest: the DoS behaviour of "Hail to the
Thief", sec. 4.1, obtained by selection instead of 80 extra samples). ``mode = "withhold"`` sends them under
their true indices and leaves the others out; ``"substitute"`` sends its best draw in place of each withheld
one, claiming that index. Receivers reject the first as ``withheld`` (every index of the share must be
present) and the second through the group rule of the defend stage (one index failing the proof rejects its
author's whole group).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dgrpo.adversary.base import AttackContext
from dgrpo.adversary.exchange import ExchangeAttack
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.config import Section
from dgrpo.protocol.messages import Rollout


class SelectOptions(Section):
    keep: Annotated[int, Field(ge=1, description="draws kept per prompt (the rest are withheld)")] = 1
    mode: Annotated[
        Literal["withhold", "substitute"],
        Field(description="withhold: leave the other indices out; substitute: send the best draw in their place"),
    ] = "withhold"


@ADVERSARIES.register("select")
class SelectAttack(ExchangeAttack):
    name = "select"
    Options = SelectOptions

    def publish(self, ctx: AttackContext, rollouts: list[Rollout]) -> list[Rollout]:
        out = []
        for r in rollouts:
            order = self.preference(ctx.task, self.prompt_of(ctx, r), r.completions)
            kept = sorted(order[: self.options.keep])
            if len(kept) == len(r.completions):
                out.append(r)  # nothing to withhold: an honest message
                continue
            if self.options.mode == "withhold":
                texts = tuple(r.completions[j] for j in kept)
                indices = tuple(r.indices[j] for j in kept)
            else:
                best = r.completions[order[0]]
                texts = tuple(c if j in kept else best for j, c in enumerate(r.completions))
                indices = r.indices
            self.record_poison(r.prompt_id, texts)
            out.append(r.model_copy(update={"completions": texts, "indices": indices, "tokens": ()}))
        return out
