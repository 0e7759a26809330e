"""Adaptive sparse communication (Fed-GRPO, mechanism iii): top-k with error feedback, a per-client budget
scaled by its learning signal.

Error feedback (Seide et al. 2014; Stich et al. 2018, "Sparsified SGD with memory"): a client adds what it
did not send before to this round's update, sends the k largest entries of the sum (values rounded to the
wire dtype), and keeps everything else, rounding included, as its residual::

    a = u_t + e_{t-1};   s_t = round(top_k(a));   e_t = a - s_t

so that, exactly, ``sum_t s_t + e_T = sum_t u_t`` up to the float additions themselves: nothing is lost,
only delayed.

Budget: ``k_k = clamp(round(budget * n * clip(sigma_k / sigma_bar, low, high)), 1, n)`` with ``sigma_bar``
the mean reward std the aggregator broadcast last round (the first round: scale 1). A client with more
signal than the federation's average gets more entries (the paper: bandwidth "based on the informativeness of
each client's update"). A budget of 1 sends every entry (dense).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WIRE_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16}


@dataclass(frozen=True)
class SparseUpdate:
    """``size`` entries of which those at ``indices`` (ascending, int64) hold ``values`` (wire dtype)."""

    size: int
    indices: torch.Tensor
    values: torch.Tensor

    def dense(self) -> torch.Tensor:
        out = torch.zeros(self.size, dtype=torch.float32)
        out[self.indices] = self.values.to(torch.float32)
        return out

    @property
    def entries(self) -> int:
        return int(self.indices.numel())


def budget_entries(
    size: int,
    budget: float,
    signal: float | None = None,
    mean_signal: float | None = None,
    low: float = 0.5,
    high: float = 2.0,
) -> int:
    """How many entries a client sends: ``budget * size``, scaled by its signal relative to the mean; a
    budget of 1 is dense whatever the signal."""
    if budget >= 1.0:
        return size
    scale = 1.0
    if signal is not None and mean_signal is not None and mean_signal > 0.0:
        scale = min(max(signal / mean_signal, low), high)
    return min(max(round(budget * size * scale), 1), size)


def top_k(update: torch.Tensor, k: int, dtype: str = "float32") -> SparseUpdate:
    """The ``k`` entries of largest magnitude, values rounded to ``dtype`` (ties broken by torch's topk)."""
    size = update.numel()
    if k >= size:
        indices = torch.arange(size, dtype=torch.int64)
    else:
        indices = torch.topk(update.abs(), k, sorted=False).indices.sort().values
    return SparseUpdate(size, indices, update[indices].to(WIRE_DTYPES[dtype]))


class ErrorFeedback:
    """A client's residual: what it has not sent yet (kept across rounds, and in checkpoints)."""

    def __init__(self, size: int, residual: torch.Tensor | None = None) -> None:
        self.residual = torch.zeros(size, dtype=torch.float32) if residual is None else residual.clone()
        if self.residual.numel() != size:
            raise ValueError(f"residual has {self.residual.numel()} entries, the model {size}")

    def compress(self, update: torch.Tensor, k: int, dtype: str = "float32") -> SparseUpdate:
        """Send the top ``k`` of update + residual; keep the rest (and the rounding) as the new residual."""
        accumulated = update.to(torch.float32) + self.residual
        sent = top_k(accumulated, k, dtype)
        self.residual = accumulated - sent.dense()
        return sent
