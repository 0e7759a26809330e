"""Plan binding: which rollouts an author may publish in a round, derived from public data alone.

"Hail to the Thief" (sec. 3) has every node answer the round's prompts, G/m completions each (horizontal
split), or B/m prompts of its own, G completions each (vertical split). Its threat model lets the attacker
choose *what* it writes; nothing in the paper bounds *which* prompts it answers, *how many* completions it
sends, or *which* of its samples it keeps. Those freedoms are bypasses of any per-completion check: an
attacker that samples honestly with the seeded sampler passes ``sampling-proof`` on every string it sends,
yet it may send only the draws that suit it (selection), eight draws where its share is two
(over-publishing), one draw in several messages (repetition), or prompts of its own choosing (off-plan).

The rules here remove them (``docs/protocol.md``, "Plan binding"):

- an author's plan for round ``r`` is derivable by every receiver: the global plan from (run, r) in the
  horizontal split, the author's own from (run, r, author) in the vertical split;
- it publishes exactly one rollout per planned prompt (``parts`` = the plan's size), none for other prompts
  (``off_plan``), never two for one prompt (``duplicate_prompt``);
- each rollout holds exactly its share of completions, each with an explicit index below the share, each
  index once (``over_share``, ``bad_index``, ``withheld``);
- an author whose messages of the round do not cover its whole plan has none of them admitted
  (``incomplete``): withholding a prompt is as visible as withholding a draw.

With the seeded sampler every index's completion is then fixed by public data and the weights, and the
defend stage rejects a whole group when one of its completions fails the proof (:mod:`dgrpo.round.defend`),
so the attacker's only remaining choice is whether to publish its round at all.
"""

from __future__ import annotations

from collections.abc import Collection
from functools import lru_cache

from dgrpo.config import RolloutConfig
from dgrpo.protocol.messages import Rollout
from dgrpo.tasks.base import Prompt, Task

# Reasons of the rules above, per rollout (``incomplete`` and ``duplicate_prompt`` need the author's round).
ROLLOUT_REASONS = ("wrong_parts", "off_plan", "over_share", "bad_index", "withheld")
ROUND_REASONS = ("duplicate_prompt", "incomplete")


def plan_key(run_id: str, round_idx: int, author: str, split: str) -> str:
    """The seed key of an author's plan: shared by every author in the horizontal split (paper, sec. 3)."""
    key = f"{run_id}/{round_idx}"
    return f"{key}/{author}" if split == "vertical" else key


def planned_prompts(task: Task, rollout: RolloutConfig, run_id: str, author: str, round_idx: int) -> list[Prompt]:
    """The prompts ``author`` must answer in ``round_idx``, in publication order (part ``i`` answers the
    ``i``-th)."""
    return task.sample_prompts(rollout.prompts_per_round, plan_key(run_id, round_idx, author, rollout.split))


def rollout_reason(rollout: Rollout, planned: Collection[str], parts: int, share: int) -> str | None:
    """Whether one rollout keeps to its author's plan (None) or which rule it breaks. ``planned``: the
    author's planned prompt ids; ``parts``: the plan's size; ``share``: completions per prompt."""
    if rollout.parts != parts:
        return "wrong_parts"
    if rollout.prompt_id not in planned:
        return "off_plan"
    n = len(rollout.completions)
    if n > share:
        return "over_share"
    if len(set(rollout.indices)) != n or any(i >= share for i in rollout.indices):
        return "bad_index"
    if n < share:
        return "withheld"
    return None


class RoundPlan:
    """Every author's plan under one run's rollout settings (memoised: receivers ask once per author and
    round)."""

    def __init__(self, task: Task, rollout: RolloutConfig, run_id: str) -> None:
        self.task = task
        self.rollout = rollout
        self.run_id = run_id
        self.share = rollout.completions_per_prompt
        self._ids = lru_cache(maxsize=4096)(self._planned_ids)

    @property
    def parts(self) -> int:
        """Rollout messages per author and round: one per planned prompt."""
        return min(self.rollout.prompts_per_round, self.task.num_train)

    def prompts(self, author: str, round_idx: int) -> list[Prompt]:
        return planned_prompts(self.task, self.rollout, self.run_id, author, round_idx)

    def ids(self, author: str, round_idx: int) -> frozenset[str]:
        return self._ids(author if self.rollout.split == "vertical" else "", round_idx)

    def _planned_ids(self, author: str, round_idx: int) -> frozenset[str]:
        return frozenset(p.id for p in self.prompts(author, round_idx))

    def reason(self, rollout: Rollout) -> str | None:
        return rollout_reason(rollout, self.ids(rollout.author, rollout.round), self.parts, self.share)
