"""``over-publish``: more genuine seeded draws per prompt than the attacker's share.

With a share of 2 completions per prompt, an attacker sending 8 draws at indices 0..7 made up 57% of what
the honest nodes trained on: each draw is the seeded sampler's own (indices 2..7 have seeds too), so
``sampling-proof`` accepts every one, and nothing bounded the count. Receivers now reject a rollout holding
more than the share (``over_share``). The draws past the share are the poison.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from dgrpo.adversary.base import AttackContext
from dgrpo.adversary.exchange import ExchangeAttack
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.config import Section
from dgrpo.protocol.messages import Rollout


class OverPublishOptions(Section):
    factor: Annotated[int, Field(ge=2, description="completions published per prompt, in shares")] = 4


@ADVERSARIES.register("over-publish")
class OverPublishAttack(ExchangeAttack):
    name = "over-publish"
    Options = OverPublishOptions

    def publish(self, ctx: AttackContext, rollouts: list[Rollout]) -> list[Rollout]:
        out = []
        for r in rollouts:
            prompt = self.prompt_of(ctx, r)
            if prompt is None:
                out.append(r)
                continue
            start = len(r.completions)
            extra_indices = list(range(start, start * self.options.factor))
            extra = ctx.draw([prompt], extra_indices)[0]
            self.record_poison(r.prompt_id, extra)
            out.append(
                r.model_copy(
                    update={
                        "completions": (*r.completions, *extra),
                        "indices": (*r.indices, *extra_indices),
                        "tokens": (),  # its extra draws travel as strings only
                    }
                )
            )
        return out
