"""GRPO as plain functions: group-relative advantages and the per-token policy-gradient loss.

Follows "Hail to the Thief" (Blagoev et al., 2025, sec. 3) by default: one update per generation, so the ratio
is ``exp(logp - logp.detach())`` (value 1, gradient = policy gradient), no clipping and KL weight beta = 0, loss
averaged per token. ``learner.updates_per_round`` > 1 takes several updates per generation (TRL's
``num_iterations``, GRPO's mu), the later ones against the old log-probs (``old_logp``), where the ratio leaves 1
and clipping acts. Clipping, KL and the loss normalisations follow TRL's GRPOTrainer so that the numbers can be
compared one to one (``tests/test_grpo_vs_trl.py``, one and two updates):

* ``grpo``:    each sequence's loss is averaged over its tokens, then averaged over sequences;
* ``dr_grpo``: summed over all tokens, divided by (sequences x max_completion_length) (Liu et al., 2025);
* ``dapo``:    summed over all tokens, divided by the number of active tokens in the whole batch.

With micro-batching the normalisers must be those of the whole batch, so the reduction takes them
explicitly (``num_sequences``, ``num_tokens``) instead of reading them off the micro-batch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch

from dgrpo.config.learner import LOSS_TYPES, LossType


def group_advantages(
    rewards: Sequence[float], groups: Sequence[Hashable], eps: float = 1e-4, scale: bool = True
) -> list[float]:
    """``A = (r - mean) / (std + eps)`` within each group (completions of the same prompt).

    Groups may be of unequal size (a defense may have removed members). ``std`` is the unbiased sample
    standard deviation, as ``torch.std`` in TRL; a group of one has no spread and gets advantage 0.
    ``scale=False`` gives Dr. GRPO's unscaled ``r - mean``.
    """
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards but {len(groups)} group labels")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        values = [float(rewards[i]) for i in idx]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        for i, v in zip(idx, values, strict=True):
            out[i] = (v - mean) / (std + eps) if scale else v - mean
    return out


def per_token_loss(
    logp: torch.Tensor,
    advantages: torch.Tensor,
    old_logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    epsilon_low: float | None = None,
    epsilon_high: float | None = None,
) -> torch.Tensor:
    """The GRPO per-token loss ``-min(ratio*A, clip(ratio)*A) + beta*KL`` of shape [B, T].

    ``old_logp=None`` means on-policy (the paper's setting): the ratio is ``exp(logp - logp.detach())``.
    ``epsilon_low=None`` disables clipping. The KL term is the k3 estimator of TRL/DeepSeekMath.
    """
    old = logp.detach() if old_logp is None else old_logp
    ratio = torch.exp(logp - old)
    adv = advantages.unsqueeze(-1)
    loss = -ratio * adv
    if epsilon_low is not None:
        high = epsilon_low if epsilon_high is None else epsilon_high
        clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + high)
        loss = -torch.min(ratio * adv, clipped * adv)
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta != 0 needs reference log-probabilities")
        delta = ref_logp - logp
        loss = loss + beta * (torch.exp(delta) - delta - 1.0)
    return loss


def reduce_loss(
    token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: LossType,
    num_sequences: int,
    num_tokens: int,
    max_completion_length: int,
) -> torch.Tensor:
    """Reduce a (micro-)batch's per-token loss with the whole batch's normalisers (see module docstring).

    Summing this over the micro-batches of one batch gives exactly the loss of the whole batch.
    """
    mask = mask.to(token_loss.dtype)
    if loss_type == "grpo":
        per_seq = (token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.sum() / num_sequences
    if loss_type == "dr_grpo":
        return (token_loss * mask).sum() / (num_sequences * max_completion_length)
    if loss_type == "dapo":
        return (token_loss * mask).sum() / max(num_tokens, 1)
    raise ValueError(f"unknown loss_type {loss_type!r}; valid: {', '.join(LOSS_TYPES)}")


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each target token under ``logits / temperature`` ([B, T, V], [B, T] -> [B, T]).

    TRL divides logits by the sampling temperature before the log-softmax; so do we.
    """
    logits = logits.float() / temperature
    return torch.gather(logits.log_softmax(-1), -1, targets.unsqueeze(-1)).squeeze(-1)
