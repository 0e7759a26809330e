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
    micro_batch: Annotated[int, Field(ge=1, description="completions per forward pass")] = 16


def mismatches(
    logits: torch.Tensor, ids: Sequence[int], seed: int, temperature: float, top_k: int, top_p: float, atol: float
) -> int:
    """Positions where ``ids`` is not the seeded sampler's choice (beyond ``atol``), from [T, V] logits."""
    scores = logits.double() / temperature
    keep = kept_mask(scores, top_k, top_p)
    t_idx, tok_idx = keep.nonzero(as_tuple=True)
    t_np, tok_np = t_idx.numpy(), tok_idx.numpy()
    perturbed = scores[t_idx, tok_idx].numpy() + gumbel_noise(seed, t_np, tok_np)
    best = np.full(len(ids), -np.inf)
    np.maximum.at(best, t_np, perturbed)
    target = np.asarray(ids, dtype=np.int64)
    positions = np.arange(len(ids))
    own_scores = scores.numpy()[positions, target]
    own = own_scores + gumbel_noise(seed, positions, target)
    ok = own >= best - atol
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1].numpy()
        ok &= own_scores >= kth - atol
    if top_p < 1.0:
        ok &= keep.numpy()[positions, target]
    return int((~ok).sum())


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
        for i, f in zip(todo, forced, strict=True):
            c = candidates[i]
            seed = completion_seed(ctx.run_id, ctx.round, c.author, c.prompt.id, c.index)
            bad = mismatches(f.logits, f.ids, seed, run.temperature, run.top_k, run.top_p, self.options.atol)
            if bad > self.options.max_mismatch_fraction * len(f.ids):
                verdicts[i] = self.reject("diverged", bad / max(len(f.ids), 1))
        return verdicts
