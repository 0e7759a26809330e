"""The advantages stage: group-relative advantages of the scored completions (GRPO), each completion
against the other completions of its prompt, from every author alike."""

from __future__ import annotations

from collections.abc import Sequence

from dgrpo.config import LearnerConfig
from dgrpo.learner.grpo import group_advantages
from dgrpo.round.outcome import ScoredCompletion


def advantages(scored: Sequence[ScoredCompletion], cfg: LearnerConfig) -> list[float]:
    """``(r - mean) / (std + eps)`` within each prompt's group (``scale_rewards = false``: ``r - mean``)."""
    return group_advantages(
        [s.reward for s in scored], [s.prompt.id for s in scored], eps=cfg.advantage_eps, scale=cfg.scale_rewards
    )
