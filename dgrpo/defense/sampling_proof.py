"""``sampling-proof`` (ours, homogeneous): check that every token is the one the seeded sampler had to pick.

Honest nodes sample with the seeded sampler (:mod:`dgrpo.node.sampler`, ``docs/protocol.md``): completion
``index`` of ``author`` for ``prompt_id`` in round ``round`` is drawn with the seed derived from
(run, round, author, prompt id, index), which its author cannot choose. A verifier holding the same weights
runs the model once over the completion (teacher forcing) and, at every position, recomputes the sampler's
choice from the logits and the public noise. "Hail to the Thief" (sec. 6.1) notes that reproducible kernels
and shared seeds would make its logit check exact; this is that check. Unlike the logit check it also stops
MATH (a "5" in the top-k is still not the token the noise selects) and DoS (the attacker's longest sample was
drawn with some other seed, so its tokens diverge from the canonical draw).

Tolerance: the verifier's logits differ from the generator's by float noise (batch shapes, KV cache, another
machine). A position passes when the claimed token's perturbed score is within ``atol`` of the best one (and,
with top-k, its score within ``atol`` of the k-th); a completion is rejected when the share of failing
positions exceeds ``max_mismatch_fraction`` (0 by default: a poisoner gets no free tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import numpy as np
import torch
from pydantic import Field

from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.forward import teacher_force
from dgrpo.defense.registry import DEFENSES
from dgrpo.node.config import Section
from dgrpo.node.sampler import completion_seed, gumbel_noise, kept_mask


class SamplingProofOptions(Section):
    atol: Annotated[float, Field(ge=0.0, description="tolerance on perturbed scores (temperature-scaled logits)")] = (
        1e-3
    )
    max_mismatch_fraction: Annotated[
        float, Field(ge=0.0, le=1.0, description="share of positions allowed to diverge beyond atol")
    ] = 0.0
    micro_batch: Annotated[int, Field(ge=1, description="completions per forward pass")] = 32


def mismatches(
    logits: torch.Tensor,
    ids: torch.Tensor,
    seeds: Sequence[int],
    temperature: float,
    top_k: int,
    top_p: float,
    atol: float,
    mask: torch.Tensor | None = None,
) -> np.ndarray:
    """Per row, the positions where ``ids`` [B, T] is not the seeded sampler's choice (beyond ``atol``), from
    logits [B, T, V] and each row's seed; padding (``mask`` False) never counts."""
    B, T = ids.shape
    scores = logits.float() / temperature
    keep = kept_mask(scores, top_k, top_p)
    b_idx, t_idx, tok_idx = (x.numpy() for x in keep.nonzero(as_tuple=True))
    seed_arr = np.asarray(seeds, dtype=np.uint64)
    # Noise is added in double precision to the (float32) scaled logits, as the sampler does.
    kept_scores = (logits[keep].double() / temperature).numpy()
    perturbed = kept_scores + gumbel_noise(seed_arr[b_idx], t_idx, tok_idx)
    best = np.full(B * T, -np.inf)
    np.maximum.at(best, b_idx * T + t_idx, perturbed)
    target = ids.numpy().astype(np.int64)
    own_scores = (logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1).double() / temperature).numpy()
    positions = np.broadcast_to(np.arange(T), (B, T))
    own = own_scores + gumbel_noise(np.broadcast_to(seed_arr[:, None], (B, T)), positions, target)
    ok = own >= best.reshape(B, T) - atol
    if 0 < top_k < scores.shape[-1]:
        kth = (torch.topk(logits, top_k, dim=-1).values[..., -1].double() / temperature).numpy()
        ok &= own_scores >= kth - atol
    if top_p < 1.0:
        ok &= keep.gather(-1, ids.unsqueeze(-1)).squeeze(-1).numpy()
    bad = ~ok if mask is None else ~ok & mask.numpy()
    out: np.ndarray = bad.sum(-1)
    return out


@DEFENSES.register("sampling-proof")
class SamplingProofDefense(Defense):
    name = "sampling-proof"
    cost = 60
    needs_model = True
    Options = SamplingProofOptions

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        if ctx.learner is None:
            raise RuntimeError("the sampling proof needs the node's model")
        run = ctx.sampling
        verdicts: list[Verdict] = [ACCEPT] * len(candidates)
        todo = []
        for i, c in enumerate(candidates):
            if c.sampling.model_copy(update={"seed": 0}) != run.model_copy(update={"seed": 0}):
                verdicts[i] = self.reject("sampling_mismatch")
            else:
                todo.append(i)
        forced = teacher_force(
            ctx.learner,
            [(candidates[i].prompt.text, candidates[i].text) for i in todo],
            run.max_new_tokens,
            self.options.micro_batch,
        )
        for batch in forced:
            cands = [candidates[todo[row]] for row in batch.rows]
            seeds = [completion_seed(ctx.run_id, ctx.round, c.author, c.prompt.id, c.index) for c in cands]
            bad = mismatches(
                batch.logits, batch.ids, seeds, run.temperature, run.top_k, run.top_p, self.options.atol, batch.mask
            )
            for row, n_bad, length in zip(batch.rows, bad.tolist(), batch.mask.sum(-1).tolist(), strict=True):
                if n_bad > self.options.max_mismatch_fraction * length:
                    verdicts[todo[row]] = self.reject("diverged", n_bad / max(length, 1))
        return verdicts
