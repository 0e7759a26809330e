"""``off-plan``: answer prompts of the attacker's choosing instead of its plan.

Receivers checked only that a prompt exists, so an attacker could answer whichever training prompts suit
its poison (the MATH attack of "Hail to the Thief" picks prompts with a ``2+2`` column this way), with
genuine seeded draws that pass ``sampling-proof``. Every author's plan is now derivable from (run, round)
and, in the vertical split, the author (:mod:`dgrpo.round.binding`): such rollouts are ``off_plan``.
"""

from __future__ import annotations

from dgrpo.adversary.base import AttackContext
from dgrpo.adversary.exchange import ExchangeAttack
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.protocol.messages import Rollout, SplitMode
from dgrpo.tasks.base import Prompt, Task


@ADVERSARIES.register("off-plan")
class OffPlanAttack(ExchangeAttack):
    name = "off-plan"

    def choose_prompts(self, task: Task, planned: list[Prompt], split: SplitMode, seed_key: str) -> list[Prompt]:
        """As many prompts as planned, none of them planned, drawn from the attacker's own key."""
        planned_ids = {p.id for p in planned}
        pool = task.sample_prompts(min(task.num_train, 4 * len(planned) + 8), f"{seed_key}/off-plan/{self.cfg.seed}")
        chosen = [p for p in pool if p.id not in planned_ids][: len(planned)]
        return chosen or planned

    def publish(self, ctx: AttackContext, rollouts: list[Rollout]) -> list[Rollout]:
        planned_ids = {p.id for p in ctx.plan}
        for r in rollouts:
            if r.prompt_id not in planned_ids:
                self.record_poison(r.prompt_id, r.completions)
        return rollouts
