"""Teacher forcing for the model-based defenses: batched forward passes over received completions.

A completion is re-tokenised exactly as the learner will train on it (``Learner.encode_completion``: EOS
appended when it stopped before ``max_new_tokens``), so the defense checks the very tokens that would be
reinforced, its stop included. Checks then run on whole micro-batches of logits at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from dgrpo.node.learner import TORCH_LOCK, Learner


@dataclass(frozen=True)
class ForcedBatch:
    rows: list[int]  # indices into the items passed in
    ids: torch.Tensor  # [B, T] completion tokens (padding where mask is 0), on the CPU
    mask: torch.Tensor  # [B, T] bool
    logits: torch.Tensor  # [B, T, V] float32 on the CPU: the logits that predicted each token
    overflow: list[bool]  # the text re-encodes to more than max_new_tokens tokens: the rest goes unchecked


def teacher_force(
    learner: Learner, items: Sequence[tuple[str, str]], max_new_tokens: int, micro_batch: int = 16
) -> Iterator[ForcedBatch]:
    """(prompt text, completion text) pairs -> batches of their tokens and logits, ``micro_batch`` at a time
    (rows sorted by length so that little is padded)."""
    encoded = [(learner.encode_prompt(p), learner.encode_completion(c, max_new_tokens)) for p, c in items]
    # A completion longer than max_new_tokens cannot come from the claimed sampling, and the learner would
    # train on its first max_new_tokens tokens only while the reward reads all of it (an answer appended
    # after honest-looking tokens): flagged for the defenses to reject.
    overflow = [len(learner.tokenizer(c, add_special_tokens=False)["input_ids"]) > max_new_tokens for _, c in items]
    order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i][1]), len(encoded[i][0])))
    for start in range(0, len(order), micro_batch):
        rows = order[start : start + micro_batch]
        with TORCH_LOCK, torch.no_grad():
            was_training = learner.model.training
            learner.model.eval()
            try:
                logits, ids, mask = learner.completion_logits([encoded[i] for i in rows])
            finally:
                learner.model.train(was_training)
        yield ForcedBatch(rows, ids.cpu(), mask.cpu().bool(), logits.float().cpu(), [overflow[i] for i in rows])
