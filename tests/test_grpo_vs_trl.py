"""Our GRPO loss and gradient against TRL's GRPOTrainer on one fixed batch, for each loss type."""

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


def _trl_loss_and_grads(model_dir: Path, loss_type: str) -> tuple[float, dict[str, torch.Tensor]]:
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
