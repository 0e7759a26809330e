"""Aggregation weights: how much each client's update counts (``docs/federated.md``, "Aggregation weights").

* ``samples`` (FedAvg, McMahan et al. 2017): ``w_k = n_k / sum_j n_j``, n_k the client's completions.
* ``signal`` (Fed-GRPO's signal-weighted aggregation): ``w_k = (sigma_k + eps)^(1/T) / sum_j (sigma_j + eps)^(1/T)``;
  T = 1 is proportional to the reward std (the paper's reading), T -> infinity uniform, T -> 0 the client
  with the strongest signal only. ``eps`` keeps a client with no signal this round from weighing exactly 0.
* ``relative-gain`` (the FGRPO baseline, arXiv 2606.03094, whose formula is not public either): each client
  is compared with its own history, ``g_k = (mu_k - h_k) / max(h_k, eps)`` with ``h_k`` an exponential
  moving average of its past mean rewards, and ``w_k = softmax(g_k / T)``; a client without history has
  g_k = 0. It rewards clients that improve, whatever their level.
* ``uniform``: ``1 / K``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def _normalise(raw: Sequence[float]) -> list[float]:
    total = sum(raw)
    if total <= 0.0 or not math.isfinite(total):
        return [1.0 / len(raw)] * len(raw)
    return [r / total for r in raw]


def uniform_weights(count: int) -> list[float]:
    return [1.0 / count] * count


def sample_weights(samples: Sequence[int]) -> list[float]:
    """FedAvg: proportional to each client's number of samples."""
    return _normalise([float(max(n, 0)) for n in samples])


def signal_weights(stds: Sequence[float], temperature: float = 1.0, eps: float = 0.01) -> list[float]:
    """Fed-GRPO: proportional to ``(sigma_k + eps)^(1/temperature)``."""
    if temperature <= 0.0:
        raise ValueError("temperature must be positive")
    logs = [math.log(max(s, 0.0) + eps) / temperature for s in stds]
    top = max(logs)
    return _normalise([math.exp(v - top) for v in logs])  # shifted by the max: no overflow at small T


def relative_gains(means: Sequence[float], history: Sequence[float | None], eps: float = 0.01) -> list[float]:
    """``(mu_k - h_k) / max(h_k, eps)``; 0 for a client with no history."""
    return [0.0 if h is None else (m - h) / max(h, eps) for m, h in zip(means, history, strict=True)]


def relative_gain_weights(
    means: Sequence[float], history: Sequence[float | None], temperature: float = 0.1, eps: float = 0.01
) -> list[float]:
    """FGRPO-style: ``softmax(g_k / temperature)`` over the clients' relative gains."""
    gains = [g / temperature for g in relative_gains(means, history, eps)]
    top = max(gains)
    return _normalise([math.exp(g - top) for g in gains])


def update_history(history: Mapping[str, float], means: Mapping[str, float], momentum: float) -> dict[str, float]:
    """``h_k <- m h_k + (1 - m) mu_k`` (a client seen for the first time starts at its mean)."""
    out = dict(history)
    for client, mu in means.items():
        out[client] = mu if client not in history else momentum * history[client] + (1.0 - momentum) * mu
    return out
