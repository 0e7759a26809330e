"""The score stage: every kept completion gets the reward this node computes itself, with its own copy of
the prompt. A peer's reward is never trusted (there is none on the wire)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from dgrpo.round.outcome import Kept, ScoredCompletion, Scoring
from dgrpo.tasks.base import Prompt, Task


def score(task: Task, kept: Sequence[Kept]) -> Scoring:
    """Rewards of ``kept`` (times each one's ``reward_scale``), in order. One call scores the whole round:
    a code task runs it as one sandbox batch."""
    groups: list[tuple[Prompt, list[Kept]]] = []
    for k in kept:  # consecutive completions of one prompt form a group, in the admitted order
        if groups and groups[-1][0] is k.prompt:
            groups[-1][1].append(k)
        else:
            groups.append((k.prompt, [k]))
    t0 = time.perf_counter()
    rewards = task.rewards_batch([(prompt, [k.text for k in group]) for prompt, group in groups])
    seconds = time.perf_counter() - t0
    scored = tuple(
        ScoredCompletion(k.author, k.prompt, k.text, reward * k.reward_scale)
        for (_, group), group_rewards in zip(groups, rewards, strict=True)
        for k, reward in zip(group, group_rewards, strict=True)
    )
    return Scoring(scored, seconds)
