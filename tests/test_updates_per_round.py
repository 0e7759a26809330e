"""``learner.updates_per_round`` (TRL's ``num_iterations``): several updates on one batch of rollouts, the first
exactly the on-policy one, the later ones against its old log-probs; and the batched pool still copies them."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from dgrpo.config import LearnerConfig, ModelConfig
from dgrpo.learner.batch import StepStats, TrainSample
from dgrpo.learner.learner import Learner
from dgrpo.simulations.pool import LearnerPool


def _batch(seed: int) -> list[TrainSample]:
    g = torch.Generator().manual_seed(seed)
    return [
        TrainSample((5, 6, 7)[: 1 + i % 3], tuple(int(t) for t in torch.randint(3, 60, (3 + i,), generator=g)), a)
        for i, a in enumerate((1.0, -1.0, 0.0, 0.5))
    ]


def _grads(learner: Learner) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in learner.model.parameters() if p.grad is not None])


def test_updates_per_round_is_at_least_one() -> None:
    assert LearnerConfig().updates_per_round == 1
    with pytest.raises(ValidationError):
        LearnerConfig(updates_per_round=0)


def test_the_first_update_is_the_on_policy_one(random_model_dir: Path) -> None:
    """Keeping the old log-probs changes nothing on the first update (its ratio is exactly 1), and keeps one
    tensor per micro-batch, the shape of that micro-batch's completions."""
    cfg = LearnerConfig(micro_batch_size=2, epsilon=0.2)
    plain, keeping = (Learner(ModelConfig(name=str(random_model_dir)), cfg) for _ in range(2))
    behaviour: list[torch.Tensor] = []
    loss_plain = plain.accumulate_gradients(_batch(0), 1.0, 8)
    loss_keeping = keeping.accumulate_gradients(_batch(0), 1.0, 8, behaviour)
    assert loss_plain == loss_keeping
    assert torch.equal(_grads(plain), _grads(keeping))
    assert [tuple(b.shape) for b in behaviour] == [(2, 4), (2, 6)]  # 4 rows sorted by length, 2 per micro-batch
    assert not any(b.requires_grad for b in behaviour)


def test_several_updates_step_the_optimizer_each_time(random_model_dir: Path) -> None:
    one = Learner(ModelConfig(name=str(random_model_dir)), LearnerConfig(lr=1e-3))
    two = Learner(ModelConfig(name=str(random_model_dir)), LearnerConfig(lr=1e-3, updates_per_round=2))
    s1, s2 = one.train_step_here(_batch(0), 1.0, 8), two.train_step_here(_batch(0), 1.0, 8)
    p1, p2 = next(one.model.parameters()), next(two.model.parameters())
    assert float(one.optimizer.state[p1]["step"]) == 1 and float(two.optimizer.state[p2]["step"]) == 2
    assert one.weights_digest() != two.weights_digest()
    assert (s2.sequences, s2.tokens) == (s1.sequences, s1.tokens)  # one batch, whatever the updates


def _train(pool: LearnerPool, learners: list[Learner], batches: list[list[TrainSample]]) -> list[StepStats]:
    """Every learner's train_step at once in its own thread, as a simulated round makes them."""
    for lr in learners:
        pool.enter(lr)
    out: list[StepStats | None] = [None] * len(learners)

    def one(i: int) -> None:
        try:
            out[i] = learners[i].train_step(batches[i], 1.0, 8)
        finally:
            pool.leave(learners[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(learners))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return [s for s in out if s is not None]


def test_the_pool_copies_several_updates_as_their_own(random_model_dir: Path) -> None:
    """Several updates are one deterministic function of (state, batch), and the learner's settings, with
    updates_per_round, are in the pool's batch digest: learners with the same weights and batch share one
    computation and end exactly as their own run would; a learner taking another number of updates does not."""
    torch.set_num_threads(1)
    model = ModelConfig(name=str(random_model_dir))
    cfgs = [LearnerConfig(lr=1e-3, epsilon=0.2, updates_per_round=n) for n in (3, 3, 1)]
    pooled = [Learner(model, c) for c in cfgs]
    alone = [Learner(model, c) for c in cfgs]
    pool = LearnerPool(pooled)
    for step in range(2):
        got = _train(pool, pooled, [_batch(step)] * 3)
        want = [lr.train_step(_batch(step), 1.0, 8) for lr in alone]
        assert [g.loss for g in got] == [w.loss for w in want]
    assert pool.stats.train_calls == 6 and pool.stats.train_steps == 4
    for p, a in zip(pooled, alone, strict=True):
        assert p.weights_digest() == a.weights_digest()
        for pp, pa in zip(p.model.parameters(), a.model.parameters(), strict=True):
            sp, sa = p.optimizer.state[pp], a.optimizer.state[pa]
            assert torch.equal(sp["exp_avg"], sa["exp_avg"]) and torch.equal(sp["exp_avg_sq"], sa["exp_avg_sq"])
    assert pooled[0].weights_digest() == pooled[1].weights_digest() != pooled[2].weights_digest()
