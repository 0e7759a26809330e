"""Held-out accuracy of a daemon's own model, every ``eval.every`` rounds (off by default: it costs a
generation pass over ``eval.prompts`` prompts). The value goes in the round's ``rounds.jsonl`` row, in
``/status`` (``history``) and on the live page's accuracy curve; it is the task's mean reward over the
task's held-out prompts, greedy, as the simulations' ``accuracy``."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from dgrpo.round.node import Node
from dgrpo.round.observer import RoundObserver
from dgrpo.round.outcome import RoundOutcome

log = logging.getLogger(__name__)


class HeldOut(RoundObserver):
    """Runs before the observers that write the round (:class:`~dgrpo.daemon.observers.RoundLog`,
    :class:`~dgrpo.daemon.history.RoundHistory`), which read :meth:`accuracy_at`."""

    def __init__(self, node: Node, every: int, prompts: int, seed: int = 1234) -> None:
        self.node = node
        self.every = every
        self.prompts = node.task.eval_prompts(prompts) if every else []
        self.seed = seed
        self.latest: tuple[int, float] | None = None

    def on_round(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
        if not self.every or not self.prompts or round_idx % self.every:
            return
        texts = self.node.eval_completions(self.prompts, True, self.seed)
        items = [(p, [t]) for p, t in zip(self.prompts, texts, strict=True)]
        rewards = [r[0] for r in self.node.task.rewards_batch(items)]
        self.latest = (round_idx, sum(rewards) / len(rewards))
        log.info("held-out accuracy %.3f at round %d (%d prompts)", self.latest[1], round_idx, len(rewards))

    def accuracy_at(self, round_idx: int) -> float | None:
        return self.latest[1] if self.latest is not None and self.latest[0] == round_idx else None
