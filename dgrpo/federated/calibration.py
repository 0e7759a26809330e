"""Global reward calibration (Fed-GRPO, mechanism ii): the aggregator broadcasts the global mean reward
``mu_g``; each client re-weights each prompt's objective by the gap between ``mu_g`` and its own mean
reward on that prompt, so that it pushes harder where it is weaker than the federation::

    w_p = clip(1 + lambda * (mu_g - r_p), low, high)

and the advantages of prompt p's completions are multiplied by ``w_p``. Worked example (``lambda = 1``,
[0.5, 2]): mu_g = 0.6, a prompt the client solves 1 time in 4 (r_p = 0.25) gets 1.35, one it solves 4 times
in 4 gets 0.6, one at 0.6 gets 1. The weights are not renormalised: a client below the federation as a
whole takes larger steps, one above it smaller ones (the paper: "steering each client toward its relative
weaknesses"; its exact formula is not public).
"""

from __future__ import annotations

from collections.abc import Sequence


def calibration_weights(
    prompt_means: Sequence[float], global_mean: float, strength: float = 1.0, low: float = 0.5, high: float = 2.0
) -> list[float]:
    """One weight per prompt from its mean reward ``r_p`` and the broadcast ``mu_g``."""
    return [min(max(1.0 + strength * (global_mean - r), low), high) for r in prompt_means]


def calibrate(
    advantages: Sequence[float],
    groups: Sequence[str],
    rewards: Sequence[float],
    global_mean: float,
    strength: float = 1.0,
    low: float = 0.5,
    high: float = 2.0,
) -> list[float]:
    """Advantages times their prompt's calibration weight (``groups`` names each completion's prompt)."""
    sums: dict[str, list[float]] = {}
    for g, r in zip(groups, rewards, strict=True):
        sums.setdefault(g, []).append(r)
    names = list(sums)
    weights = calibration_weights([sum(sums[g]) / len(sums[g]) for g in names], global_mean, strength, low, high)
    by_group = dict(zip(names, weights, strict=True))
    return [a * by_group[g] for a, g in zip(advantages, groups, strict=True)]
