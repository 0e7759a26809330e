"""Teacher forcing for the model-based defenses: one batched forward pass over received completions.

A completion is re-tokenised exactly as the learner will train on it (``Learner.encode_completion``: EOS
appended when it stopped before ``max_new_tokens``), so the defense checks the very tokens that would be
reinforced, its stop included.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from dgrpo.node.learner import TORCH_LOCK, Learner


@dataclass(frozen=True)
class Forced:
    ids: list[int]  # the completion's tokens
    logits: torch.Tensor  # [len(ids), V] float32 on the CPU: the logits that predicted each token


def teacher_force(
    learner: Learner, items: Sequence[tuple[str, str]], max_new_tokens: int, micro_batch: int = 16
) -> Iterator[Forced]:
    """(prompt text, completion text) pairs -> their tokens and logits, in order, ``micro_batch`` at a time."""
    encoded = [(learner.encode_prompt(p), learner.encode_completion(c, max_new_tokens)) for p, c in items]
    for start in range(0, len(encoded), micro_batch):
        chunk = encoded[start : start + micro_batch]
        with TORCH_LOCK, torch.no_grad():
            was_training = learner.model.training
            learner.model.eval()
            try:
                _, _, logits = learner.completion_logprobs(chunk)
            finally:
                learner.model.train(was_training)
            logits = logits.float().cpu()
        for row, (_, ids) in enumerate(chunk):
            yield Forced(list(ids), logits[row, : len(ids)])
