"""The sampling proof's vectorised check (issue 27) decides every position as the seeded sampler's own
definition does (:func:`dgrpo.learner.sampler.choose`, one position at a time) and as the check over the whole
vocabulary does (:func:`mismatches_full`): the same failing counts, first failing positions and choices there,
with top-k, with top-k and top-p, and where the k-th score is tied."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dgrpo.defense.sampling_proof import mismatches, mismatches_full
from dgrpo.learner.sampler import choose, kept_mask


def _sampled(logits: torch.Tensor, seeds: list[int], temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The seeded sampler's token at every position, one position at a time (the definition)."""
    B, T, _ = logits.shape
    out = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        for t in range(T):
            scores = logits[b, t].double() / temperature
            keep = kept_mask(scores[None], top_k, top_p)[0]
            out[b, t] = choose(scores.numpy(), keep.numpy(), seeds[b], t)
    return out


@pytest.mark.parametrize(("top_k", "top_p"), [(5, 1.0), (5, 0.8), (20, 0.95), (1, 1.0), (0, 1.0), (0, 0.9)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_vectorised_check_decides_as_the_sampler(top_k: int, top_p: float, temperature: float) -> None:
    gen = torch.Generator().manual_seed(top_k * 100 + int(top_p * 10) + int(temperature * 3))
    B, T, V = 6, 9, 48
    logits = torch.randn(B, T, V, generator=gen) * 3
    seeds = [11 + 7 * b for b in range(B)]
    honest = _sampled(logits, seeds, temperature, top_k, top_p)
    ids = honest.clone()
    # rows 2..5 edited: a token that is not the sampler's at a known position (row 5 at two positions)
    edits = {2: [0], 3: [4], 4: [8], 5: [3, 6]}
    for b, positions in edits.items():
        for t in positions:
            ids[b, t] = (honest[b, t] + 1 + b) % V
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 7:] = False  # padding never counts
    ids[1, 8] = (honest[1, 8] + 3) % V
    bad, first, choice = mismatches(logits, ids, seeds, temperature, top_k, top_p, 0.0, mask)
    assert bad.tolist() == [0, 0, 1, 1, 1, 2]
    assert first.tolist() == [-1, -1, 0, 4, 8, 3]
    assert choice.tolist() == [-1, -1, *(int(honest[b, edits[b][0]]) for b in (2, 3, 4, 5))]
    full = mismatches_full(logits, ids, seeds, temperature, top_k, top_p, 0.0, mask)
    for got, want in zip((bad, first, choice), full, strict=True):
        assert np.array_equal(got, want)


def test_a_tie_at_the_kth_score_keeps_every_tied_token() -> None:
    """Where tokens past the k-th tie with it the sampler keeps them all; so does the check."""
    B, T, V = 3, 3, 12
    logits = torch.zeros(B, T, V)
    logits[:2, :, 0] = 2.0  # rows 0 and 1: one best, then eleven tied at the k-th score (k = 3)
    logits[2] = torch.randn(T, V, generator=torch.Generator().manual_seed(3))  # row 2: no tie
    seeds = [5, 6, 7]
    honest = _sampled(logits, seeds, 1.0, 3, 1.0)
    assert any(int(tok) >= 3 for tok in honest[:2].flatten()), "the noise picks tied tokens past the first k"
    ids = honest.clone()
    ids[1, 2] = (honest[1, 2] + 1) % V  # a tied row with an edit
    ids[2, 1] = (honest[2, 1] + 1) % V  # the untied row with an edit
    bad, first, choice = mismatches(logits, ids, seeds, 1.0, 3, 1.0, 0.0)
    assert bad.tolist() == [0, 1, 1] and first.tolist() == [-1, 2, 1]
    assert choice.tolist() == [-1, int(honest[1, 2]), int(honest[2, 1])]


def test_empty_batches_pass() -> None:
    bad, first, choice = mismatches(torch.zeros(0, 0, 10), torch.zeros(0, 0, dtype=torch.long), [], 1.0, 5, 1.0, 0.0)
    assert bad.shape == first.shape == choice.shape == (0,)
