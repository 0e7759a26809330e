"""Async mode's groups: a prompt's group spans the staleness window, not one step.

In sync mode every author's completions of a prompt arrive in the same round and form its group (GRPO's G). In
async mode they arrive over several steps (a peer's a step or two late), so one step holds a few members of
each group: groups of one or two, whose advantage is zero or a coin flip. A node therefore remembers, per
prompt, the rewards it computed itself in the last S + 1 steps, and uses them as the rest of the group: each
completion is trained on once, in the step where it arrives, against the mean and spread of every completion of
its prompt seen in the window. Those rewards are the node's own (never a peer's claim); the ones from earlier
steps were sampled by policies at most S steps older, the same bound as the completions themselves.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence


def windowed_advantages(
    rewards: Sequence[float],
    groups: Sequence[Hashable],
    history: Mapping[Hashable, Sequence[float]],
    eps: float = 1e-4,
    scale: bool = True,
) -> list[float]:
    """``A = (r - mean) / (std + eps)`` with each group's mean and unbiased std over its members in this step
    and ``history[group]`` (rewards of earlier steps, not trained on again). Without history this is GRPO's
    group advantage (:func:`dgrpo.learner.grpo.group_advantages`)."""
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards but {len(groups)} group labels")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    out = [0.0] * len(rewards)
    for g, idx in members.items():
        values = [float(rewards[i]) for i in idx] + [float(v) for v in history.get(g, ())]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        for i in idx:
            v = float(rewards[i])
            out[i] = (v - mean) / (std + eps) if scale else v - mean
    return out


class GroupMemory:
    """Per prompt, the rewards scored in the last ``window`` steps (``window`` = S + 1), bounded by
    ``max_per_group`` per prompt (the newest kept)."""

    def __init__(self, window: int, max_per_group: int = 256) -> None:
        self.window = window
        self.max_per_group = max_per_group
        self._rewards: dict[Hashable, list[tuple[int, float]]] = {}

    def history(self, step_round: int) -> dict[Hashable, list[float]]:
        """The remembered rewards still inside the window of a step at ``step_round``."""
        self._forget_before(step_round - self.window + 1)
        return {g: [r for _, r in items] for g, items in self._rewards.items()}

    def remember(self, step_round: int, rewards: Sequence[float], groups: Sequence[Hashable]) -> None:
        for r, g in zip(rewards, groups, strict=True):
            items = self._rewards.setdefault(g, [])
            items.append((step_round, float(r)))
            del items[: -self.max_per_group]

    def _forget_before(self, oldest: int) -> None:
        for g in list(self._rewards):
            kept = [(s, r) for s, r in self._rewards[g] if s >= oldest]
            if kept:
                self._rewards[g] = kept
            else:
                del self._rewards[g]
