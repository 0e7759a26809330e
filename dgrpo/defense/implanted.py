"""Which of an author's completions share one meaning far beyond chance: the statistic of ``meaning``.

Each completion's free text is a set of *pieces* (its units and their short word windows,
:func:`dgrpo.defense.free_text.pieces`), each a unit vector in the author's model's frame. A payload of a few
words inside other free text (issue 28: no longer than the honest text, on part of the attacker's completions)
is diluted in its unit's mean but is one piece whole. Piece ``u`` is *close* to a completion ``d`` when the
nearest of ``d``'s ``m`` pieces of about ``u``'s length is nearer than the ``quantile ** (1 / m)`` quantile of
``u``'s similarities to the null's pieces of that length: the best of ``m`` independent draws from the null
passes it with probability ``1 - quantile``, so "close" means the same to a completion of many pieces as to one
of few (a completion with a longer free text is not closer to everything), whatever ``u`` is. A *core* piece
is close to at least ``core_fraction`` of the author's completions for other prompts, ``min_neighbors`` at
least, with binomial odds below ``alpha``; its completion and those it is close to are implanted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dgrpo.defense.odds import binomial_tail


@dataclass(frozen=True)
class Pieces:
    """Pieces as rows: ``vectors`` [n, d] (unit length, centred), and per row its word count and completion
    (an index; for the author's pieces also the prompt, so that a completion is never compared with one for
    the same prompt: the same question gives honest authors the same words)."""

    vectors: torch.Tensor
    words: torch.Tensor
    completion: torch.Tensor
    prompt: Sequence[str] = ()


@dataclass(frozen=True)
class Thresholds:
    """The rule's numbers; the defaults are ``meaning``'s (:class:`dgrpo.defense.meaning.MeaningOptions`)."""

    quantile: float = 0.99
    min_similarity: float = 0.25
    min_neighbors: int = 4
    core_fraction: float = 0.4
    alpha: float = 1e-6
    min_null: int = 16


def like_length(words: torch.Tensor, w: int) -> torch.Tensor:
    """Pieces of about ``w`` words: a longer piece of a word salad is nearer any other long one."""
    return (words - w).abs() <= max(1, w // 2)


def row_limits(sims: torch.Tensor, weights: torch.Tensor, levels: Sequence[float], floor: float) -> torch.Tensor:
    """For each row of ``sims`` [rows, n] (a piece's similarities to the null's n pieces, piece j weighing
    ``weights[j]``), its weighted quantile at each of ``levels``: the smallest similarity with at least that share
    of the weight at or below it, never below ``floor``. [rows, len(levels)]."""
    base, order = sims.sort(dim=1)
    cumulative = weights.double()[order].cumsum(dim=1)
    share = torch.tensor(list(levels), dtype=torch.float64)[None, :] * cumulative[:, -1:]
    at = torch.searchsorted(cumulative, share).clamp(max=sims.shape[1] - 1)
    return base.gather(1, at).clamp(min=floor)


def piece_limit(base: torch.Tensor, weights: torch.Tensor, m: int, t: Thresholds) -> float:
    """The similarity the best of ``m`` pieces must reach to be *close*: the best of ``m`` independent draws
    from ``base`` (a piece's similarities to the null's pieces, each null completion weighing one in all: an
    author sending many pieces does not make the null its own) passes it with probability ``1 - quantile``
    (overlapping windows are not independent, which only makes "close" rarer by chance)."""
    return float(row_limits(base[None, :], weights, [t.quantile ** (1.0 / m)], t.min_similarity)[0, 0])


def implanted(author: Pieces, null: Pieces, t: Thresholds) -> dict[int, int]:
    """The author's implanted completions (indices as in ``author.completion``), each with the size of the
    largest cluster it is in. Pieces of one length are judged together (one matrix product each)."""
    out: dict[int, int] = {}
    n_completions = int(author.completion.max()) + 1 if len(author.completion) else 0
    if n_completions <= t.min_neighbors:
        return out
    codes = {p: i for i, p in enumerate(dict.fromkeys(author.prompt))}
    prompt = torch.tensor([codes[p] for p in author.prompt], dtype=torch.long)
    completion_prompt = torch.zeros(n_completions, dtype=torch.long).scatter(0, author.completion, prompt)
    for w in sorted(set(author.words.tolist())):
        rows = (author.words == w).nonzero().squeeze(1)
        alike = like_length(null.words, w)
        in_null = null.completion[alike]
        if len(torch.unique(in_null)) < t.min_null:
            continue
        mine = like_length(author.words, w)
        groups = author.completion[mine]
        count = torch.bincount(groups, minlength=n_completions)  # a completion's pieces of about w words
        ms = sorted(set(count[count > 0].tolist()))
        weights = 1.0 / torch.bincount(in_null)[in_null].double()  # each null completion weighs one
        sims_null = author.vectors[rows] @ null.vectors[alike].T
        limits = row_limits(sims_null, weights, [t.quantile ** (1.0 / m) for m in ms], t.min_similarity)
        level = torch.zeros(max(ms) + 1, dtype=torch.long)
        level[ms] = torch.arange(len(ms))
        limit = limits[:, level[count]]  # [rows, completions]
        sims = author.vectors[rows] @ author.vectors[mine].T
        best = torch.full((len(rows), n_completions), -2.0).scatter_reduce(
            1, groups.expand(len(rows), -1), sims, reduce="amax"
        )
        peer = (count > 0)[None, :] & (completion_prompt[None, :] != prompt[rows][:, None])
        close = peer & (best >= limit)
        n_close, n_peer = close.sum(1), peer.sum(1)
        core = (n_close >= t.min_neighbors) & (n_close >= t.core_fraction * n_peer)
        for i in core.nonzero().squeeze(1).tolist():
            k, n = int(n_close[i]), int(n_peer[i])
            if binomial_tail(k, n, 1.0 - t.quantile) >= t.alpha:
                continue
            for c in (int(author.completion[rows[i]]), *close[i].nonzero().squeeze(1).tolist()):
                out[c] = max(out.get(c, 0), k + 1)
    return out
