"""A model's trainable parameters as one flat float32 vector, in name order: the unit updates are made of.

Every node flattens in the same order (sorted parameter names), so index i means the same entry everywhere.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def trainable(model: Any) -> list[tuple[str, torch.nn.Parameter]]:
    return sorted((n, p) for n, p in model.named_parameters() if p.requires_grad)


def flat_parameters(model: Any) -> torch.Tensor:
    """A float32 copy of every trainable parameter, concatenated in name order."""
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).to(torch.float32).cpu() for _, p in trainable(model)])


def assign_parameters(model: Any, flat: torch.Tensor) -> None:
    """Set the trainable parameters from ``flat`` (as :func:`flat_parameters` lays them out)."""
    params = trainable(model)
    total = sum(p.numel() for _, p in params)
    if flat.numel() != total:
        raise ValueError(f"flat vector has {flat.numel()} entries, the model {total}")
    at = 0
    with torch.no_grad():
        for _, p in params:
            n = p.numel()
            p.copy_(flat[at : at + n].reshape(p.shape).to(p.dtype))
            at += n


def digest(flat: torch.Tensor) -> str:
    """SHA-256 of the vector's bytes: equal digests mean identical weights."""
    return hashlib.sha256(flat.contiguous().numpy().tobytes()).hexdigest()
