"""Our GRPO loss and gradient against TRL's GRPOTrainer on one fixed batch, for each loss type: on one update per
generation (the ratio is 1) and on two (TRL's ``num_iterations=2``: the second update's ratio leaves 1 and clips)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from dgrpo.config import LearnerConfig, ModelConfig
from dgrpo.learner.batch import TrainSample
from dgrpo.learner.learner import Learner

PROMPTS = [(5, 6, 7), (8, 9), (5, 6, 7), (8, 9)]  # unequal prompt lengths: left padding is exercised
COMPLETIONS = [(20, 21, 22, 2), (30, 2), (40, 41, 42), (50, 51, 2)]  # one truncated (no EOS)
ADVANTAGES = [1.0, -0.5, 0.0, 0.75]  # one zero advantage: we skip it, TRL runs it
MAX_LEN = 4
TEMPERATURE = 0.7


def _trl_inputs() -> dict[str, torch.Tensor]:
    pw = max(len(p) for p in PROMPTS)
    cw = max(len(c) for c in COMPLETIONS)
    prompt_ids = torch.tensor([[0] * (pw - len(p)) + list(p) for p in PROMPTS])
    prompt_mask = torch.tensor([[0] * (pw - len(p)) + [1] * len(p) for p in PROMPTS])
    completion_ids = torch.tensor([list(c) + [0] * (cw - len(c)) for c in COMPLETIONS])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (cw - len(c)) for c in COMPLETIONS])
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(ADVANTAGES),
        "num_items_in_batch": completion_mask.sum().float(),
    }


def _trl_trainer(model_dir: Path, loss_type: str, **extra: object) -> GRPOTrainer:
    learner = Learner(ModelConfig(name=str(model_dir)), LearnerConfig())  # only to load the same weights
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=MAX_LEN,
        temperature=TEMPERATURE,
        loss_type=loss_type,
        beta=0.0,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        bf16=False,  # TRL defaults to bf16 autocast; compare in fp32
        **extra,  # type: ignore[arg-type]
    )
    trainer = GRPOTrainer(
        model=learner.model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "1+2="}] * 4),
        processing_class=learner.tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1  # normally set by the training loop
    trainer.model.train()
    return trainer


def _trl_loss_and_grads(model_dir: Path, loss_type: str) -> tuple[float, dict[str, torch.Tensor]]:
    trainer = _trl_trainer(model_dir, loss_type)
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, _trl_inputs())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("clip", [None, 0.2])
def test_loss_and_gradient_match_trl(random_model_dir: Path, loss_type: str, clip: float | None) -> None:
    trl_loss, trl_grads = _trl_loss_and_grads(random_model_dir, loss_type)
    cfg = LearnerConfig(loss_type=loss_type, micro_batch_size=2, epsilon=clip)  # type: ignore[arg-type]
    ours = Learner(ModelConfig(name=str(random_model_dir)), cfg)
    samples = [TrainSample(p, c, a) for p, c, a in zip(PROMPTS, COMPLETIONS, ADVANTAGES, strict=True)]
    ours.model.train()
    loss = ours.accumulate_gradients(samples, TEMPERATURE, MAX_LEN)
    assert loss == pytest.approx(trl_loss, rel=1e-5, abs=1e-7)
    assert trl_loss != 0.0
    our_grads = {n: p.grad for n, p in ours.model.named_parameters() if p.grad is not None}
    assert set(our_grads) == set(trl_grads)
    for name, g in trl_grads.items():
        torch.testing.assert_close(our_grads[name], g, rtol=1e-4, atol=1e-7)


def test_a_different_advantage_changes_the_gradient(random_model_dir: Path) -> None:
    """Guards the comparison above against passing trivially (e.g. all-zero gradients)."""
    _, trl_grads = _trl_loss_and_grads(random_model_dir, "dapo")
    ours = Learner(ModelConfig(name=str(random_model_dir)), LearnerConfig(loss_type="dapo"))
    flipped = [TrainSample(p, c, -a) for p, c, a in zip(PROMPTS, COMPLETIONS, ADVANTAGES, strict=True)]
    ours.accumulate_gradients(flipped, TEMPERATURE, MAX_LEN)
    name, g = next(iter(trl_grads.items()))
    ours_g = dict(ours.model.named_parameters())[name].grad
    assert ours_g is not None and float(g.abs().sum()) > 0
    torch.testing.assert_close(ours_g, -g, rtol=1e-4, atol=1e-7)


# Two updates on one batch (TRL's num_iterations = 2, GRPO's mu in DeepSeekMath's Algorithm 1). Adam moves every
# weight of the random model by about lr, which at 3e-4 puts some second-update ratios beyond 1 +/- 0.2 and keeps
# others inside (checked below), so that clipping acts on part of the batch.
LR = 3e-4
EPSILON = 0.2


def _trl_two_updates(
    model_dir: Path, loss_type: str, epsilon_high: float | None
) -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """TRL's loss at each of two Adam updates on one batch, the second update's gradients, the weights after it,
    and the second update's ratio and clipped tokens (TRL's own ``is_low_clipped | is_high_clipped``)."""
    trainer = _trl_trainer(model_dir, loss_type, num_iterations=2, epsilon=EPSILON, epsilon_high=epsilon_high)
    model = trainer.model
    inputs = _trl_inputs()
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].size(1)

    def logps() -> torch.Tensor:
        with torch.no_grad():  # as TRL's _generate_and_score_completions takes old_per_token_logps
            out: torch.Tensor = trainer._get_per_token_logps_and_entropies(model, ids, attention, width)[0]
        return out

    inputs["old_per_token_logps"] = logps()  # once per generation batch, before the first update
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=LR)  # as our Learner's
    losses, ratio = [], torch.ones(0)
    for _ in range(2):
        ratio = torch.exp(logps() - inputs["old_per_token_logps"])
        model.zero_grad()
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        losses.append(float(loss.detach()))
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
    adv = inputs["advantages"].unsqueeze(-1)
    high = EPSILON if epsilon_high is None else epsilon_high
    clipped = ((ratio < 1 - EPSILON) & (adv < 0)) | ((ratio > 1 + high) & (adv > 0))
    active = (inputs["completion_mask"] == 1) & (adv != 0)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return losses, grads, weights, ratio[active], clipped[active]


@pytest.mark.parametrize(("loss_type", "epsilon_high"), [("grpo", None), ("dr_grpo", None), ("dapo", 0.28)])
def test_two_updates_per_round_match_trl_with_clipping(
    random_model_dir: Path, loss_type: str, epsilon_high: float | None
) -> None:
    trl_losses, trl_grads, trl_weights, ratio, clipped = _trl_two_updates(random_model_dir, loss_type, epsilon_high)
    # The comparison is of clipping at work: the second update's ratio has left 1, on part of the tokens by more
    # than epsilon (clipped), on part by less.
    assert float((ratio - 1).abs().max()) > EPSILON
    assert 0 < int(clipped.sum()) < clipped.numel()
    cfg = LearnerConfig(
        loss_type=loss_type,  # type: ignore[arg-type]
        micro_batch_size=2,
        lr=LR,
        epsilon=EPSILON,
        epsilon_high=epsilon_high,
        max_grad_norm=None,  # p.grad is then the second update's raw gradient, as TRL's above
        updates_per_round=2,
    )
    ours = Learner(ModelConfig(name=str(random_model_dir)), cfg)
    samples = [TrainSample(p, c, a) for p, c, a in zip(PROMPTS, COMPLETIONS, ADVANTAGES, strict=True)]
    stats = ours.train_step_here(samples, TEMPERATURE, MAX_LEN)
    assert stats.loss == pytest.approx(sum(trl_losses) / 2, rel=1e-5, abs=1e-7)  # the mean over the updates
    assert trl_losses[0] != trl_losses[1]
    our_grads = {n: p.grad for n, p in ours.model.named_parameters() if p.grad is not None}
    assert set(our_grads) == set(trl_grads)
    for name, g in trl_grads.items():
        torch.testing.assert_close(our_grads[name], g, rtol=1e-4, atol=1e-7)
    # Adam's first steps move a weight by about lr whatever its gradient's size, so a near-zero gradient's
    # rounding shows up to a few e-6 in the weights: compared to 1e-5, a thirtieth of one step.
    for name, w in ours.model.named_parameters():
        torch.testing.assert_close(w.detach(), trl_weights[name], rtol=0.0, atol=1e-5)


def _second_update(model_dir: Path, epsilon: float | None, updates: int) -> tuple[float, torch.Tensor]:
    cfg = LearnerConfig(lr=LR, epsilon=epsilon, max_grad_norm=None, updates_per_round=updates)
    learner = Learner(ModelConfig(name=str(model_dir)), cfg)
    samples = [TrainSample(p, c, a) for p, c, a in zip(PROMPTS, COMPLETIONS, ADVANTAGES, strict=True)]
    stats = learner.train_step_here(samples, TEMPERATURE, MAX_LEN)
    return stats.loss, torch.cat([p.grad.flatten() for p in learner.model.parameters() if p.grad is not None])


def test_epsilon_clips_from_the_second_update_and_not_before(random_model_dir: Path) -> None:
    """Fails if ``epsilon`` is a no-op where it should act: at the second update a tight clip (0.001) holds
    nearly every token's ratio and so changes loss and gradient against no clip. With one update per round the
    ratio is exactly 1 and the clip cannot act: the same loss and gradient (why the key exists)."""
    loss_clip, grad_clip = _second_update(random_model_dir, 0.001, 2)
    loss_free, grad_free = _second_update(random_model_dir, None, 2)
    assert loss_clip != pytest.approx(loss_free, rel=1e-3)
    assert not torch.allclose(grad_clip, grad_free, rtol=1e-2, atol=1e-6)
    assert float(grad_clip.norm()) < 0.5 * float(grad_free.norm())  # most tokens clipped: little gradient left
    loss_clip, grad_clip = _second_update(random_model_dir, 0.001, 1)
    loss_free, grad_free = _second_update(random_model_dir, None, 1)
    assert loss_clip == pytest.approx(loss_free, rel=1e-6)
    torch.testing.assert_close(grad_clip, grad_free, rtol=1e-5, atol=1e-8)  # a clip runs zero-advantage rows too
