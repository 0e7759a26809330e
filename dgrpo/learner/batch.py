"""What a learner's calls carry: a generation request, a sampled completion, a training sample and a step's
statistics (the learner hands them to a :class:`~dgrpo.learner.learner.Batcher` in a batched simulation)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dgrpo.protocol.messages import SamplingParams


@dataclass(frozen=True)
class TrainSample:
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    advantage: float


@dataclass(frozen=True)
class StepStats:
    loss: float
    grad_norm: float
    sequences: int
    tokens: int
    seconds: float


@dataclass(frozen=True)
class GenerateRequest:
    """One call of :meth:`Learner.generate`: ``n`` completions of each prompt, sampled with ``sampling``."""

    prompts: tuple[str, ...]
    n: int
    sampling: SamplingParams
    greedy: bool = False
    batch_rows: int = 64
    seeds: tuple[tuple[int, ...], ...] | None = None

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n


# A sampled completion: its text and the token ids it was sampled as, up to its end-of-sequence.
Sampled = tuple[str, tuple[int, ...]]
# (prompt ids, completion ids) pairs, and their teacher-forced (logits [B, T, V], ids [B, T], mask [B, T])
ForcedSamples = tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
ForcedLogits = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
