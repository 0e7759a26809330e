"""What an author caught implanting repeats word for word: the rest of its payload.

``meaning`` sees a payload by what its wordings mean, as far as its encoder knows them. A payload set whose
wordings the encoder does not place together (jargon: "Stack sats" and "Own Doge" beside "Buy crypto", issue
28's held-out two-word crypto set, on half the attacker's completions) is seen only in part. But the attacker
wants the victims to learn its wordings, so they come from a set it chose, and across rounds each comes back
word for word, in completions for different prompts. Honest free text does not: on the tiny models no span of
two words came back in two of an honest author's 30-50 completions (4 rounds, E2 mix, ``docs/results.md``),
and a real model's habits ("let's think step by step") are its model's, so the null writes them too.

So once an author is caught implanting (a cluster whose odds are below ``alpha``: not an honest author by
chance), a span of two or more words that it wrote in completions for ``min_prompts`` different prompts (two,
in ``meaning``), and that no completion of the null holds, marks those completions as the payload's too. Only
a caught author is judged this way: an honest author's own favourite phrase (a node drifts as it trains) is
not evidence alone. Measured on the held-out crypto set (``studies/heterogeneous-heldout.toml``, 4 rounds): the
wordings the encoder misses are caught from their second prompt on; stop 0.80-0.83 without it, 0.96-0.97
with it, the honest families' rejections unchanged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from dgrpo.defense.repetition import WORD_RE


def span(text: str) -> str:
    """``text`` as a span: its letter-words, lower-cased ("Hold Ether." and "hold ether" are one span)."""
    return " ".join(w.casefold() for w in WORD_RE.findall(text))


def echoes(spans: Sequence[Iterable[str]], prompts: Sequence[str], null: set[str], min_prompts: int) -> dict[int, int]:
    """The completions (``spans[i]``: the spans of completion ``i``, written for prompt ``prompts[i]``) holding
    a span of two or more words that completions for at least ``min_prompts`` different prompts hold and
    ``null`` does not; each with the number of prompts of its most repeated such span."""
    where: dict[str, set[int]] = defaultdict(set)
    for i, held in enumerate(spans):
        for s in held:
            if " " in s and s not in null:
                where[s].add(i)
    out: dict[int, int] = {}
    for holders in where.values():
        n = len({prompts[i] for i in holders})
        if n >= min_prompts:
            for i in holders:
                out[i] = max(out.get(i, 0), n)
    return out
