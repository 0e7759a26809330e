"""The learning rate of a round: constant, or cosine decay over the run's rounds.

Cosine annealing (Loshchilov and Hutter 2017, without restarts) from ``lr`` at round 1 to ``lr * final`` at
round ``horizon``, held there after it:

    lr_t = lr * (final + (1 - final) * (1 + cos(pi * (t - 1) / (horizon - 1))) / 2)

Why a schedule at all: with a constant step, momentum SGD keeps moving held-out accuracy by a few points
between evaluations to the last round (docs/results.md, "Federated mode"), and top-k with error feedback
(Stich et al. 2018) delivers what it held back only once the updates shrink; federated learning decays the
clients' step over rounds for the same reasons (Li et al. 2020, "On the convergence of FedAvg on non-IID
data", need a decaying step for FedAvg to converge).
"""

from __future__ import annotations

import math

from dgrpo.config.learner import LrSchedule


def round_lr(lr: float, schedule: LrSchedule, final: float, round_idx: int, horizon: int | None) -> float:
    """The learning rate of round ``round_idx`` (1-based) of a run whose schedule spans ``horizon`` rounds."""
    if schedule == "constant":
        return lr
    if horizon is None:
        raise ValueError("a cosine learning-rate schedule needs the number of rounds it spans")
    progress = min(max(round_idx - 1, 0) / max(horizon - 1, 1), 1.0)
    return lr * (final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress)))
