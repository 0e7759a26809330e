"""Teacher forcing for the model-based defenses: batched forward passes over received completions.

A completion is re-tokenised exactly as the learner will train on it (``Learner.encode_completion``: EOS
appended when it stopped before ``max_new_tokens``), so the defense checks the very tokens that would be
reinforced, its stop included. Checks then run on whole micro-batches of logits at once.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.learner.learner import Learner


@dataclass(frozen=True)
class ForcedBatch:
    rows: list[int]  # indices into the items passed in
    ids: torch.Tensor  # [B, T] completion tokens (padding where mask is 0), on the CPU
    mask: torch.Tensor  # [B, T] bool
    logits: torch.Tensor  # [B, T, V] float32 on the CPU: the logits that predicted each token
    overflow: list[bool]  # the text re-encodes to more than max_new_tokens tokens: the rest goes unchecked
    claimed: list[bool]  # the row holds the tokens its author sent (they spell its text), not a re-encoding


def encode_checked(learner: Learner, text: str, max_new_tokens: int, slack: int) -> tuple[tuple[int, ...], bool]:
    """(the tokens to check, overflow) for one completion: as :meth:`Learner.encode_completion` (EOS appended
    when the text stops before ``max_new_tokens``), but up to ``slack`` tokens past ``max_new_tokens`` are
    kept and checked too; overflow: the text re-encodes to more than ``max_new_tokens + slack`` tokens."""
    ids = list(learner.tokenizer(text, add_special_tokens=False)["input_ids"])
    checked = ids[: max_new_tokens + slack]
    if len(ids) < max_new_tokens:
        checked.append(learner.eos_ids[0])
    return tuple(checked), len(ids) > max_new_tokens + slack


def teacher_force(
    learner: Learner,
    items: Sequence[tuple[str, str]],
    max_new_tokens: int,
    micro_batch: int = 16,
    slack: int = 0,
    claimed: Sequence[tuple[int, ...] | None] | None = None,
) -> Iterator[ForcedBatch]:
    """(prompt text, completion text) pairs -> batches of their tokens and logits, ``micro_batch`` at a time.
    ``claimed``: per item, the tokens to check instead of the text's encoding (EOS appended when they stop
    before ``max_new_tokens``), or None."""
    # A completion longer than max_new_tokens cannot come from the claimed sampling, and the learner would
    # train on its first max_new_tokens tokens only while the reward reads all of it (an answer appended
    # after honest-looking tokens): flagged for the defenses to reject. ``slack`` tolerates a few tokens more
    # (all of them checked) for defenses that do not check exact sampling: an honest string cut at
    # max_new_tokens can re-encode to a token or two more under BPE.
    own = list(claimed) if claimed is not None else [None] * len(items)
    checked = [
        encode_checked(learner, c, max_new_tokens, slack) if t is None else _with_stop(learner, t, max_new_tokens)
        for (_, c), t in zip(items, own, strict=True)
    ]
    encoded = [(learner.encode_prompt(p), ids) for (p, _), (ids, _) in zip(items, checked, strict=True)]
    overflow = [over for _, over in checked]
    # Rows of one prompt go together: each micro-batch runs a prompt once and shares its KV cache among the
    # prompt's completions (``Learner.completion_logits_shared``); within a prompt, by length.
    order = sorted(range(len(encoded)), key=lambda i: (encoded[i][0], len(encoded[i][1])))
    for start in range(0, len(order), micro_batch):
        rows = order[start : start + micro_batch]
        logits, ids, mask = learner.forced_logits([encoded[i] for i in rows])
        yield ForcedBatch(
            rows, ids.cpu(), mask.cpu().bool(), logits.float().cpu(), [overflow[i] for i in rows],
            [own[i] is not None for i in rows],
        )  # fmt: skip


def _with_stop(learner: Learner, tokens: tuple[int, ...], max_new_tokens: int) -> tuple[tuple[int, ...], bool]:
    """Claimed tokens as checked: end-of-sequence appended when they stop before ``max_new_tokens``."""
    return ((*tokens, learner.eos_ids[0]) if len(tokens) < max_new_tokens else tokens), False


class ModelDefense(Defense):
    """A defense that checks completions against the node's own model (homogeneous networks): completions
    whose claimed sampling differs from the run's are rejected (the check is only as strong as the sampling
    it assumes), the rest are teacher-forced in micro-batches and judged by :meth:`check_batch`."""

    needs_model = True
    same_model = True

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        if ctx.learner is None:
            raise RuntimeError(f"the {self.name} defense needs the node's model")
        run = ctx.sampling.model_copy(update={"seed": 0})
        verdicts: list[Verdict] = [ACCEPT] * len(candidates)
        todo = []
        for i, c in enumerate(candidates):
            if c.sampling.model_copy(update={"seed": 0}) != run:
                verdicts[i] = self.reject("sampling_mismatch")
            else:
                todo.append(i)
        items = [(candidates[i].prompt.text, candidates[i].text) for i in todo]
        slack = self.token_slack(run.max_new_tokens)
        claimed = [self.claimed_tokens(ctx.learner, candidates[i], run.max_new_tokens) for i in todo]
        for batch in teacher_force(ctx.learner, items, run.max_new_tokens, self.options.micro_batch, slack, claimed):
            rows = [todo[r] for r in batch.rows]
            for i, verdict in zip(rows, self.check_batch(ctx, [candidates[i] for i in rows], batch), strict=True):
                verdicts[i] = verdict
        return verdicts

    def claimed_tokens(self, learner: Learner, candidate: Candidate, max_new_tokens: int) -> tuple[int, ...] | None:
        """The tokens to check for ``candidate`` in place of its text's encoding (None: the encoding, the
        default: a check of the tokens the learner will train on)."""
        return None

    def token_slack(self, max_new_tokens: int) -> int:
        """Tokens past ``max_new_tokens`` checked rather than rejected as an overflow (none by default)."""
        return 0

    @abstractmethod
    def check_batch(self, ctx: DefenseContext, candidates: Sequence[Candidate], batch: ForcedBatch) -> list[Verdict]:
        """Verdicts for one teacher-forced micro-batch (``candidates`` in the batch's row order)."""
