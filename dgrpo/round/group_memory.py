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

from collections.abc import Hashable, Mapping, Sequence

from dgrpo.learner.grpo import group_advantages


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
    members = dict.fromkeys(groups)
    past = [(float(v), g) for g in members for v in history.get(g, ())]
    together = group_advantages([*rewards, *(v for v, _ in past)], [*groups, *(g for _, g in past)], eps, scale)
    return together[: len(rewards)]  # the remembered rewards shape the baseline; only this step's are trained on


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
