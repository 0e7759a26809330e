"""How likely chance alone is to give what an author's completions show: the odds behind the cross-model
defenses that judge an author's pattern over many completions (``meaning``, ``length-shift``,
``arith-pattern``) rather than one completion alone."""

from __future__ import annotations

import math


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    return sum(math.comb(n, i) * p**i * (1.0 - p) ** (n - i) for i in range(k, n + 1))
