"""GRPO advantages and loss against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from dgrpo.learner.grpo import group_advantages, per_token_loss, reduce_loss

SQRT_THIRD = math.sqrt(1 / 3)  # sample std of [1, 0, 0, 1] and of [1, 0, 1]


def test_advantages_one_group() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], ["p"] * 4)
    expected = 0.5 / (SQRT_THIRD + 1e-4)  # mean 0.5, unbiased std sqrt(1/3)
    assert adv == pytest.approx([expected, -expected, -expected, expected], rel=1e-12)
    assert expected == pytest.approx(0.865875, abs=1e-6)


def test_advantages_unequal_groups_and_singletons() -> None:
    adv = group_advantages([1.0, 0.0, 0.7, 1.0], ["x", "x", "y", "x"])
    d = SQRT_THIRD + 1e-4  # group x = [1, 0, 1]: mean 2/3, std sqrt(1/3)
    assert adv[0] == pytest.approx((1 / 3) / d)
    assert adv[1] == pytest.approx((-2 / 3) / d)
    assert adv[3] == pytest.approx((1 / 3) / d)
    assert adv[2] == 0.0  # a group of one carries no relative signal


def test_advantages_all_equal_rewards_are_zero_and_unscaled_option() -> None:
    assert group_advantages([1.0, 1.0, 1.0], ["p"] * 3) == [0.0, 0.0, 0.0]
    assert group_advantages([1.0, 0.0], ["p", "p"], scale=False) == [0.5, -0.5]


def test_advantages_length_mismatch_is_a_bug() -> None:
    with pytest.raises(ValueError, match="group labels"):
        group_advantages([1.0], ["a", "b"])


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = torch.tensor([1.0, -1.0])
    return logp, mask, adv


@pytest.mark.parametrize(
    ("loss_type", "value", "grad"),
    [
        # on-policy ratio is 1, so the per-token loss is -A: [[-1, -1], [1, pad]]
        ("grpo", 0.0, [[-0.25, -0.25], [0.5, 0.0]]),  # mean over tokens (-1, +1), then over 2 sequences
        ("dapo", -1 / 3, [[-1 / 3, -1 / 3], [1 / 3, 0.0]]),  # sum -1 over 3 active tokens
        ("dr_grpo", -0.25, [[-0.25, -0.25], [0.25, 0.0]]),  # sum -1 over 2 sequences x max length 2
    ],
)
def test_on_policy_loss_and_gradient(loss_type: str, value: float, grad: list[list[float]]) -> None:
    logp, mask, adv = _batch()
    token_loss = per_token_loss(logp, adv)
    loss = reduce_loss(token_loss, mask, loss_type, num_sequences=2, num_tokens=3, max_completion_length=2)  # type: ignore[arg-type]
    loss.backward()
    assert float(loss) == pytest.approx(value)
    assert logp.grad is not None
    assert logp.grad.flatten().tolist() == pytest.approx([g for row in grad for g in row])


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_micro_batches_sum_to_the_whole_batch(loss_type: str) -> None:
    torch.manual_seed(0)
    logp = torch.randn(5, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    adv = torch.randn(5)
    n_tok = int(mask.sum())
    whole = reduce_loss(per_token_loss(logp, adv), mask, loss_type, 5, n_tok, 4)  # type: ignore[arg-type]
    parts = sum(
        reduce_loss(per_token_loss(logp[s], adv[s]), mask[s], loss_type, 5, n_tok, 4)  # type: ignore[arg-type]
        for s in (slice(0, 2), slice(2, 5))
    )
    assert float(parts) == pytest.approx(float(whole), rel=1e-6)


def test_clipping_by_hand() -> None:
    old = torch.tensor([[0.0]])
    logp = torch.tensor([[math.log(1.5)]], requires_grad=True)  # ratio 1.5
    pos = per_token_loss(logp, torch.tensor([1.0]), old_logp=old, epsilon_low=0.2)
    assert float(pos) == pytest.approx(-1.2)  # min(1.5 * 1, 1.2 * 1), negated
    pos.sum().backward()
    assert logp.grad is not None and float(logp.grad) == 0.0  # clipped: no gradient
    logp.grad = None
    neg = per_token_loss(logp, torch.tensor([-1.0]), old_logp=old, epsilon_low=0.2)
    assert float(neg) == pytest.approx(1.5)  # -min(-1.5, -1.2)
    neg.sum().backward()
    assert float(logp.grad) == pytest.approx(1.5)  # d/dlogp of exp(logp - old) = ratio


def test_kl_term_by_hand() -> None:
    logp = torch.tensor([[0.0]])
    ref = torch.tensor([[math.log(2.0)]])
    loss = per_token_loss(logp, torch.tensor([0.0]), ref_logp=ref, beta=0.1)
    assert float(loss) == pytest.approx(0.1 * (2.0 - math.log(2.0) - 1.0))  # k3 = e^d - d - 1
    with pytest.raises(ValueError, match="reference"):
        per_token_loss(logp, torch.tensor([0.0]), beta=0.1)


def test_unknown_loss_type() -> None:
    with pytest.raises(ValueError, match="dapo"):
        reduce_loss(torch.zeros(1, 1), torch.ones(1, 1), "ppo", 1, 1, 1)  # type: ignore[arg-type]
