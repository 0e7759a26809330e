"""The update stage: GRPO updates on the scored completions (``learner.updates_per_round``, one by default),
each completion re-tokenised by this node.

Completions travel as strings (paper, sec. 3): the learner encodes every one it trains on, its own
included, so nodes holding the same weights compute exactly the same update from the same strings.
"""

from __future__ import annotations

from collections.abc import Sequence

from dgrpo.learner.batch import StepStats, TrainSample
from dgrpo.learner.learner import Learner
from dgrpo.protocol.messages import SamplingParams
from dgrpo.round.outcome import ScoredCompletion


def update(
    learner: Learner, scored: Sequence[ScoredCompletion], advantages: Sequence[float], sampling: SamplingParams
) -> StepStats | None:
    """Train on ``scored`` with ``advantages``; None when there is nothing to train on."""
    if not scored:
        return None
    max_new = sampling.max_new_tokens
    prompt_ids: dict[str, tuple[int, ...]] = {}
    samples = []
    for s, a in zip(scored, advantages, strict=True):
        if s.prompt.id not in prompt_ids:
            prompt_ids[s.prompt.id] = learner.encode_prompt(s.prompt.text)
        samples.append(TrainSample(prompt_ids[s.prompt.id], learner.encode_completion(s.text, max_new), a))
    return learner.train_step(samples, sampling.temperature, max_new)
