"""``logit``: the paper's logit check for homogeneous networks ("Hail to the Thief", sec. 6.1).

One forward pass of the local model over each received completion; the completion is rejected if ANY of its
tokens lies outside the local model's top-k at its position, k being the run's sampling k (and outside the
top-p nucleus when the run samples with top-p < 1). The paper finds that this stops TEXT and CODE (injected
tokens are far outside the top-k) and misses MATH ("5" is in the top-k after "2+2=") and DoS (every token
of a long honest-looking sample is in the top-k). A completion whose claimed sampling differs from the run's
is rejected too: the check is only as strong as the k it uses.

Completions travel as strings, and one cut at ``max_new_tokens`` can re-encode to a token or two more under
BPE (seen with SmolLM2): up to ``overflow_slack`` x max_new_tokens tokens more are checked like the rest, and
only a longer text is rejected as an overflow (its tail would go unchecked: the learner trains on the first
max_new_tokens tokens while the reward reads all of it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated

import torch
from pydantic import Field

from dgrpo.config import Section
from dgrpo.defense.base import ACCEPT, Candidate, DefenseContext, Verdict
from dgrpo.defense.forward import ForcedBatch, ModelDefense
from dgrpo.defense.registry import DEFENSES
from dgrpo.learner.sampler import kept_mask


class LogitOptions(Section):
    top_k: Annotated[int | None, Field(ge=0, description="k to check against; None: the run's sampling top_k")] = None
    atol: Annotated[
        float, Field(ge=0.0, description="a token within atol (logit units) of the k-th logit counts as inside")
    ] = 1e-3
    micro_batch: Annotated[int, Field(ge=1, description="completions per forward pass")] = 32
    overflow_slack: Annotated[
        float,
        Field(
            ge=0.0,
            description="share of max_new_tokens a re-encoded completion may run over (every token checked): "
            "an honest string cut at max_new_tokens can re-encode to a token or two more under BPE",
        ),
    ] = 0.1


def outside_top(
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    atol: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """How many tokens of each row of ``ids`` [B, T] (or [T]) fall outside the top-k / top-p set of their
    position's ``logits`` [B, T, V] (or [T, V]); padding (``mask`` False) never counts."""
    if ids.dim() == 1:
        return outside_top(
            logits[None], ids[None], temperature, top_k, top_p, atol, None if mask is None else mask[None]
        )[0]
    scores = logits.float() / temperature
    own = scores.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    inside = torch.ones_like(ids, dtype=torch.bool)
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1]
        inside &= own >= kth - atol / temperature
    if top_p < 1.0:
        inside &= kept_mask(scores, top_k, top_p).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    outside = ~inside if mask is None else ~inside & mask
    return outside.sum(-1)


@DEFENSES.register("logit")
class LogitDefense(ModelDefense):
    name = "logit"
    cost = 50
    Options = LogitOptions

    def token_slack(self, max_new_tokens: int) -> int:
        return math.ceil(float(self.options.overflow_slack) * max_new_tokens)

    def check_batch(self, ctx: DefenseContext, candidates: Sequence[Candidate], batch: ForcedBatch) -> list[Verdict]:
        run = ctx.sampling
        k = run.top_k if self.options.top_k is None else self.options.top_k
        n_out = outside_top(batch.logits, batch.ids, run.temperature, k, run.top_p, self.options.atol, batch.mask)
        verdicts: list[Verdict] = []
        for bad, length, over in zip(n_out.tolist(), batch.mask.sum(-1).tolist(), batch.overflow, strict=True):
            if bad:
                verdicts.append(self.reject("outside_top_k", bad / max(length, 1)))
            elif over:
                verdicts.append(self.reject("overflow", 1.0))
            else:
                verdicts.append(ACCEPT)
        return verdicts
