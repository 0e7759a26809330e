"""The seeded sampler: Gumbel-max over temperature-scaled, top-k/top-p-filtered logits, with noise from a
counter-based hash of (completion seed, position, token id). Specified exactly in ``docs/protocol.md``
("Seeded sampler") so that another implementation can produce completions and check them.

Why: "Hail to the Thief" (sec. 6) notes that its logit check could be exact with reproducible kernels and
shared sampling seeds. Here the seed of every completion is derived from (run, round, author, prompt id,
completion index), so its author cannot choose it, and the noise is a pure function of that seed. Given the
same weights, a verifier re-runs the model once over the completion (teacher forcing) and recomputes which
token the sampler had to pick at every position: the ``sampling-proof`` defense.

- Noise: ``u = ((splitmix64(seed XOR splitmix64(position * 2^32 + token)) >> 11) + 0.5) * 2^-53``, a double in
  (0, 1); ``g = -ln(-ln(u))``. splitmix64 is Vigna's finaliser (the mixing function of SplitMix64).
- Filtering (in this order, as transformers does): scores = logits / temperature; top-k keeps the tokens
  whose score is at least the k-th largest; top-p keeps the smallest set of highest scores whose softmax mass
  reaches p (the highest always kept).
- Choice: the kept token with the largest ``score + g``; ties go to the lowest token id.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dgrpo.seeds import stable_seed

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)


def completion_seed(run_id: str, round_idx: int, author: str, prompt_id: str, index: int) -> int:
    """The seed of one completion: a function of who, when and what, so that its author cannot pick it."""
    return stable_seed("dgrpo/sample/1", run_id, round_idx, author, prompt_id, index)


def splitmix64(z: np.ndarray) -> np.ndarray:
    """Vigna's SplitMix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = (z + _GOLDEN) & _M64
        z = ((z ^ (z >> np.uint64(30))) * _C1) & _M64
        z = ((z ^ (z >> np.uint64(27))) * _C2) & _M64
        return z ^ (z >> np.uint64(31))


def gumbel_noise(seed: int | np.ndarray, position: int | np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Gumbel(0, 1) noise (float64) for ``tokens`` at ``position`` of the completion with ``seed`` (seed and
    position: scalars or arrays broadcast against ``tokens``)."""
    counter = (np.asarray(position, dtype=np.uint64) << np.uint64(32)) | np.asarray(tokens).astype(np.uint64)
    bits = splitmix64(np.asarray(seed, dtype=np.uint64) ^ splitmix64(counter))
    u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    out: np.ndarray = -np.log(-np.log(u))
    return out


def kept_mask(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Which tokens survive top-k then top-p filtering of temperature-scaled ``scores`` [..., V]."""
    keep = torch.ones_like(scores, dtype=torch.bool)
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        keep &= scores >= kth
    if top_p < 1.0:
        masked = scores.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(masked.double(), dim=-1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of strictly better-ranked tokens
        sorted_keep = before < top_p
        nucleus = torch.zeros_like(keep).scatter(-1, order, sorted_keep)
        keep &= nucleus
    return keep


def choose(scores: np.ndarray, keep: np.ndarray, seed: int, position: int) -> int:
    """The seeded sampler's token at one position, from float64 scores [V] and the kept mask [V]."""
    tokens = np.flatnonzero(keep)
    perturbed = scores[tokens] + gumbel_noise(seed, position, tokens)
    return int(tokens[int(np.argmax(perturbed))])  # argmax returns the first maximum: the lowest token id


class SeededGumbelProcessor:
    """A transformers logits processor that makes greedy decoding the seeded sampler: at each step it leaves
    only the chosen token finite. Rows are the batch rows (left-padded prompts of equal width)."""

    def __init__(self, seeds: Sequence[int], prompt_width: int, temperature: float, top_k: int, top_p: float):
        self.seeds = list(seeds)
        self.prompt_width = prompt_width
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        position = input_ids.shape[1] - self.prompt_width
        scaled = scores.double() / self.temperature
        keep = kept_mask(scaled, self.top_k, self.top_p)
        rows, tokens = keep.nonzero(as_tuple=True)
        seeds = np.asarray(self.seeds, dtype=np.uint64)[rows.cpu().numpy()]
        noise = torch.from_numpy(gumbel_noise(seeds, position, tokens.cpu().numpy())).to(scaled.device)
        perturbed = torch.full_like(scaled, float("-inf"))
        perturbed[rows, tokens] = scaled[rows, tokens] + noise
        chosen = perturbed.argmax(dim=-1)  # the first maximum: ties go to the lowest token id
        out = torch.full_like(scores, float("-inf"))
        out[torch.arange(len(chosen), device=out.device), chosen] = 0.0
        return out
