"""Zero-reward filler. In the paper's vertical setting the attacker owns whole groups and fills half of each
with poison and half with gibberish (sec. 4.3): the gibberish earns 0, which lowers the group mean and so
raises the poison's advantage."""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Sequence

ALPHABET = string.ascii_letters + string.digits + " .,;:!?+-*/=()"


def gibberish(
    rng: random.Random,
    like: Sequence[str],
    count: int,
    reward: Callable[[Sequence[str]], list[float]],
    max_tries: int = 8,
) -> list[str]:
    """``count`` random strings about as long as the strings in ``like``, each checked to earn reward 0."""
    lengths = [len(s) for s in like if s] or [32]
    out: list[str] = []
    for _ in range(max_tries):
        if len(out) == count:
            break
        batch = ["".join(rng.choices(ALPHABET, k=rng.choice(lengths))) for _ in range(count - len(out))]
        out.extend(s for s, r in zip(batch, reward(batch), strict=True) if r == 0.0)
    return out
