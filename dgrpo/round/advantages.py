"""The advantages stage: group-relative advantages of the scored completions (GRPO), each completion
against the other completions of its prompt, from every author alike."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from dgrpo.config import LearnerConfig
from dgrpo.learner.grpo import group_advantages
from dgrpo.round.group_memory import windowed_advantages
from dgrpo.round.outcome import ScoredCompletion


def advantages(
    scored: Sequence[ScoredCompletion], cfg: LearnerConfig, history: Mapping[Hashable, Sequence[float]] | None = None
) -> list[float]:
    """``(r - mean) / (std + eps)`` within each prompt's group (``scale_rewards = false``: ``r - mean``);
    ``history`` (async mode, :mod:`dgrpo.round.group_memory`): rewards of the prompt's group from earlier steps."""
    if history is not None:
        return windowed_advantages(
            [s.reward for s in scored], [s.prompt.id for s in scored], history, cfg.advantage_eps, cfg.scale_rewards
        )
    return group_advantages(
        [s.reward for s in scored], [s.prompt.id for s in scored], eps=cfg.advantage_eps, scale=cfg.scale_rewards
    )
