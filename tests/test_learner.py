"""The learner: seeded sampling, the EOS rule, micro-batching, LoRA, device and dtype choice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dgrpo.config import LearnerConfig, LoraConfig, ModelConfig
from dgrpo.learner.batch import TrainSample
from dgrpo.learner.learner import Learner
from dgrpo.learner.models import pick_device, pick_dtype
from dgrpo.learner.schedule import round_lr
from dgrpo.protocol.messages import SamplingParams


@pytest.fixture(scope="module")
def learner(random_model_dir: Path) -> Learner:
    return Learner(ModelConfig(name=str(random_model_dir)), LearnerConfig())


def test_sampling_is_seeded(learner: Learner) -> None:
    sp = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=12, seed=7)
    a = learner.generate(["12+34=", "5+6="], 3, sp)
    b = learner.generate(["12+34=", "5+6="], 3, sp)
    c = learner.generate(["12+34=", "5+6="], 3, sp.model_copy(update={"seed": 8}))
    assert a == b
    assert a != c
    assert [len(x) for x in a] == [3, 3]


def test_top_k_one_is_greedy(learner: Learner) -> None:
    sp = SamplingParams(temperature=1.0, top_k=1, max_new_tokens=10, seed=3)
    greedy = learner.generate(["12+34="], 1, sp, greedy=True)
    assert learner.generate(["12+34="], 2, sp) == [greedy[0] * 2]


def test_completion_eos_rule(learner: Learner) -> None:
    eos = learner.eos_ids[0]
    short = learner.encode_completion("ab", max_new_tokens=5)
    assert short[-1] == eos and len(short) == 3  # stopped early: it ended with EOS
    full = learner.encode_completion("abcde", max_new_tokens=5)
    assert eos not in full and len(full) == 5  # hit the limit: truncated, no EOS
    assert len(learner.encode_completion("x" * 50, max_new_tokens=5)) == 5


def test_micro_batch_size_does_not_change_the_gradient(random_model_dir: Path) -> None:
    samples = [
        TrainSample((5, 6, 7), (20, 21, 2), 1.0),
        TrainSample((8,), (30, 31, 32, 33), -1.0),
        TrainSample((9, 10), (40, 2), 0.5),
    ]
    grads = []
    for mb in (1, 3):
        lrn = Learner(ModelConfig(name=str(random_model_dir)), LearnerConfig(micro_batch_size=mb, loss_type="grpo"))
        lrn.accumulate_gradients(samples, 1.0, 4)
        grads.append(torch.cat([p.grad.flatten() for p in lrn.model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)
    assert float(grads[0].abs().sum()) > 0


def test_train_step_updates_weights_and_zero_advantages_do_nothing(random_model_dir: Path) -> None:
    lrn = Learner(ModelConfig(name=str(random_model_dir)), LearnerConfig(lr=1e-2))
    before = lrn.weights_digest()
    stats = lrn.train_step([TrainSample((5,), (6, 2), 0.0)], 1.0, 4)
    assert lrn.weights_digest() == before and stats.grad_norm == 0.0
    stats = lrn.train_step([TrainSample((5,), (6, 2), 1.0), TrainSample((5,), (7, 2), -1.0)], 1.0, 4)
    assert lrn.weights_digest() != before
    assert stats.grad_norm > 0 and stats.tokens == 4 and stats.sequences == 2


def test_lora_trains_only_adapters_and_kl_uses_the_base_model(random_model_dir: Path) -> None:
    cfg = ModelConfig(name=str(random_model_dir), lora=LoraConfig(r=4, alpha=8))
    lrn = Learner(cfg, LearnerConfig(lr=1e-2, beta=0.1))
    base = {n: p.detach().clone() for n, p in lrn.model.named_parameters() if not p.requires_grad}
    trainable = [n for n, p in lrn.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in n for n in trainable)
    for _ in range(2):
        lrn.train_step([TrainSample((5,), (6, 2), 1.0), TrainSample((5,), (7, 2), -1.0)], 1.0, 4)
    for n, p in lrn.model.named_parameters():
        if n in base:
            assert torch.equal(p, base[n]), n


@pytest.mark.parametrize("lora", [None, LoraConfig(r=4, alpha=8)])
def test_shared_prompt_logits_match_per_pair_logits(random_model_dir: Path, lora: LoraConfig | None) -> None:
    """Prompts run once with their KV cache repeated per completion, with and without a peft (LoRA) wrapper
    (which takes the cache argument by keyword)."""
    lrn = Learner(ModelConfig(name=str(random_model_dir), lora=lora), LearnerConfig())
    samples = [((5, 9), (6, 2)), ((5, 9), (7, 3, 2)), ((4,), (6,)), ((5, 9), (8,))]
    with lrn.inference():
        full, ids, mask = lrn.completion_logits(samples)
        shared, ids2, mask2 = lrn.completion_logits_shared(samples)
    assert torch.equal(ids, ids2) and torch.equal(mask, mask2)
    assert (full - shared).abs()[mask.bool()].max() < 1e-4


def test_beta_without_lora_is_refused(random_model_dir: Path) -> None:
    lrn = Learner(ModelConfig(name=str(random_model_dir)), LearnerConfig(beta=0.1))
    with pytest.raises(ValueError, match="LoRA"):
        lrn.accumulate_gradients([TrainSample((5,), (6, 2), 1.0)], 1.0, 4)


def test_device_and_dtype_choice() -> None:
    assert pick_device("cpu").type == "cpu"
    auto = pick_device("auto")
    assert auto.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_dtype("auto", torch.device("cpu")) == torch.float32  # never bf16 on the CPU
    assert pick_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16


def test_plain_sgd_moves_weights_by_lr_times_the_gradient(random_model_dir: Path) -> None:
    cfg = LearnerConfig(optimizer="sgd", lr=0.1, max_grad_norm=None)
    learner = Learner(ModelConfig(name=str(random_model_dir)), cfg)
    assert type(learner.optimizer) is torch.optim.SGD
    samples = [TrainSample((5, 6, 7), (8, 9), 1.0), TrainSample((5, 6, 7), (10, 11), -1.0)]
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    learner.accumulate_gradients(samples, 1.0, 4)
    grads = {n: p.grad.detach().clone() for n, p in learner.model.named_parameters() if p.grad is not None}
    learner.train_step(samples, 1.0, 4)
    for name, grad in grads.items():
        after = dict(learner.model.named_parameters())[name].detach()
        assert torch.allclose(after, before[name] - 0.1 * grad, atol=1e-6)


def test_sgd_momentum_is_heavy_ball(random_model_dir: Path) -> None:
    # torch's SGD: v_1 = g_1, v_2 = 0.9 v_1 + g_2, each step p -= lr v (what the fed-* scenarios run).
    cfg = LearnerConfig(optimizer="sgd", momentum=0.9, lr=0.1, max_grad_norm=None)
    learner = Learner(ModelConfig(name=str(random_model_dir)), cfg)
    samples = [TrainSample((5, 6, 7), (8, 9), 1.0), TrainSample((5, 6, 7), (10, 11), -1.0)]
    start = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    grads = []
    for _ in range(2):
        learner.accumulate_gradients(samples, 1.0, 4)
        grads.append({n: p.grad.detach().clone() for n, p in learner.model.named_parameters() if p.grad is not None})
        learner.train_step(samples, 1.0, 4)
    for name, g1 in grads[0].items():
        after = dict(learner.model.named_parameters())[name].detach()
        expected = start[name] - 0.1 * g1 - 0.1 * (0.9 * g1 + grads[1][name])
        assert torch.allclose(after, expected, atol=1e-6)


def test_momentum_is_refused_with_adam() -> None:
    with pytest.raises(ValueError, match="momentum is sgd's"):
        LearnerConfig(optimizer="adam", momentum=0.9)


def test_cosine_schedule_by_hand() -> None:
    # lr 0.01 to 0.001 over 5 rounds: round 2 is a quarter of the way, (1 + cos(pi/4)) / 2 = 0.853553.
    lrs = [round_lr(0.01, "cosine", 0.1, r, 5) for r in (1, 2, 3, 5, 9)]
    assert lrs == pytest.approx([0.01, 0.01 * (0.1 + 0.9 * 0.853553), 0.0055, 0.001, 0.001], rel=1e-6)
    assert round_lr(0.01, "constant", 0.1, 7, None) == 0.01
    assert round_lr(0.01, "cosine", 0.0, 1, 1) == 0.01  # a one-round run keeps its lr
    with pytest.raises(ValueError, match="needs the number of rounds"):
        round_lr(0.01, "cosine", 0.1, 2, None)


def test_begin_round_sets_the_optimizers_lr(random_model_dir: Path) -> None:
    cfg = LearnerConfig(optimizer="sgd", lr=0.01, lr_schedule="cosine", lr_final=0.1, max_grad_norm=None)
    learner = Learner(ModelConfig(name=str(random_model_dir)), cfg, rounds=3)
    assert learner.begin_round(2) == pytest.approx(0.0055)
    assert [g["lr"] for g in learner.optimizer.param_groups] == [pytest.approx(0.0055)]
    # The step taken is lr x gradient at the scheduled lr (plain SGD).
    samples = [TrainSample((5, 6, 7), (8, 9), 1.0), TrainSample((5, 6, 7), (10, 11), -1.0)]
    learner.accumulate_gradients(samples, 1.0, 4)
    grads = {n: p.grad.detach().clone() for n, p in learner.model.named_parameters() if p.grad is not None}
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    learner.train_step(samples, 1.0, 4)
    for name, grad in grads.items():
        after = dict(learner.model.named_parameters())[name].detach()
        assert torch.allclose(after, before[name] - 0.0055 * grad, atol=1e-7)
    assert learner.begin_round(3) == pytest.approx(0.001)
    with pytest.raises(ValueError, match="needs the rounds it spans"):
        Learner(ModelConfig(name=str(random_model_dir)), cfg)


def test_a_schedule_needs_a_span() -> None:
    from dgrpo.daemon.settings import NodeSettings
    from dgrpo.simulations.scenario import Scenario

    cosine = {"lr_schedule": "cosine"}
    assert Scenario(rounds=12, learner=cosine).lr_rounds() == 12
    assert Scenario(rounds=12, learner={**cosine, "lr_rounds": 30}).lr_rounds() == 30
    assert NodeSettings(rounds={"max_rounds": 7}, learner=cosine).lr_rounds() == 7
    with pytest.raises(ValueError, match="needs the rounds it spans"):
        NodeSettings(learner=cosine)
    assert NodeSettings().lr_rounds() is None  # constant: nothing to span
