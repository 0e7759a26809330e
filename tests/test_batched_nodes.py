"""The batched engine (issue 27): nodes' generation and updates run together where that gives the same results
as one by one, and runs with it equal runs without it."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from dgrpo.config import LearnerConfig, ModelConfig
from dgrpo.learner.batch import GenerateRequest, TrainSample
from dgrpo.learner.learner import Learner
from dgrpo.learner.together import generate_together
from dgrpo.protocol.messages import SamplingParams
from dgrpo.simulations.pool import LearnerPool
from dgrpo.simulations.runner import run_simulation
from dgrpo.simulations.scenario import load_scenario
from dgrpo.simulations.summary import RunSummary
from dgrpo.tasks import get_task


@pytest.fixture(scope="module")
def learner() -> Learner:
    torch.set_num_threads(1)
    return Learner(ModelConfig(), LearnerConfig())


def _prompts(n: int) -> tuple[str, ...]:
    return tuple(p.text for p in get_task("arith").eval_prompts(n))


def test_one_pass_samples_each_request_as_its_own_call(learner: Learner) -> None:
    """Multinomial blocks (several temperatures, top-k, top-p), a seeded-sampler block and a greedy block,
    decoded in one pass, give each request exactly the completions of its own call."""
    prompts = _prompts(30)
    requests = []
    for k in range(6):
        sampling = SamplingParams(
            temperature=1.0 if k % 2 else 0.7, top_k=10 if k < 3 else 0, top_p=1.0 if k < 4 else 0.9,
            max_new_tokens=48, seed=100 + k,
        )  # fmt: skip
        chosen = prompts[k * 4 : k * 4 + 6 + k]
        seeds = tuple(tuple(1000 * k + 10 * i + j for j in range(2)) for i in range(len(chosen))) if k == 4 else None
        requests.append(GenerateRequest(chosen, 2, sampling, greedy=k == 5, seeds=seeds))
    alone = [learner.generate_here(r) for r in requests]
    together = generate_together(learner, requests)
    assert together == alone
    assert len({c for out in alone[:4] for per in out for c in per}) > 20  # they are samples, not one string


def test_requests_that_need_chunks_are_refused(learner: Learner) -> None:
    sampling = SamplingParams(max_new_tokens=8, seed=1)
    big = GenerateRequest(_prompts(10), 2, sampling, batch_rows=8)
    with pytest.raises(ValueError, match="fit one pass"):
        generate_together(learner, [big])


def _train(pool: LearnerPool, learners: list[Learner], batches: list[list[TrainSample]]) -> list[Any]:
    """Every learner's train_step at once in its own thread, as a simulated round makes them."""
    for lr in learners:
        pool.enter(lr)
    out: list[Any] = [None] * len(learners)

    def one(i: int) -> None:
        try:
            out[i] = learners[i].train_step(batches[i], 1.0, 8)
        except Exception as exc:
            out[i] = exc
        finally:
            pool.leave(learners[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(learners))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return out


def _batch(seed: int, learner: Learner) -> list[TrainSample]:
    g = torch.Generator().manual_seed(seed)
    prompt = learner.encode_prompt("12+34=")
    return [
        TrainSample(prompt, tuple(int(t) for t in torch.randint(3, 60, (6,), generator=g)), float(a))
        for a in (1.0, -1.0, 0.5, -0.5)
    ]


def test_identical_updates_are_computed_once_and_equal_their_own() -> None:
    """Three learners with the same weights: two train on one batch, one on another. The pool computes two
    updates, and each learner ends with exactly the weights and optimizer state of its own update."""
    torch.set_num_threads(1)
    pooled = [Learner(ModelConfig(), LearnerConfig(lr=1e-3)) for _ in range(3)]
    alone = [Learner(ModelConfig(), LearnerConfig(lr=1e-3)) for _ in range(3)]
    pool = LearnerPool(pooled)
    for step in range(2):
        batches = [_batch(step, pooled[0]), _batch(step, pooled[0]), _batch(100 + step, pooled[0])]
        got = _train(pool, pooled, batches)
        want = [lr.train_step(b, 1.0, 8) for lr, b in zip(alone, batches, strict=True)]
        assert [g.loss for g in got] == [w.loss for w in want]
    assert pool.stats.train_calls == 6 and pool.stats.train_steps == 4
    for p, a in zip(pooled, alone, strict=True):
        assert p.weights_digest() == a.weights_digest()
        for pp, pa in zip(p.model.parameters(), a.model.parameters(), strict=True):
            sp, sa = p.optimizer.state[pp], a.optimizer.state[pa]
            assert torch.equal(sp["exp_avg"], sa["exp_avg"]) and torch.equal(sp["exp_avg_sq"], sa["exp_avg_sq"])
    assert pooled[0].weights_digest() == pooled[1].weights_digest() != pooled[2].weights_digest()


def test_weights_changed_outside_the_pool_are_not_taken_for_identical() -> None:
    torch.set_num_threads(1)
    a, b = Learner(ModelConfig(), LearnerConfig(lr=1e-3)), Learner(ModelConfig(), LearnerConfig(lr=1e-3))
    pool = LearnerPool([a, b])
    assert pool.state_key(a) == pool.state_key(b)
    with torch.no_grad():
        next(b.model.parameters()).add_(1e-3)  # in place: torch counts it
    assert pool.state_key(a) != pool.state_key(b)
    batch = _batch(0, a)
    _train(pool, [a, b], [batch, batch])
    assert pool.stats.train_steps == 2
    assert a.weights_digest() != b.weights_digest()


def test_an_error_reaches_every_caller_and_nobody_hangs() -> None:
    torch.set_num_threads(1)
    learners = [Learner(ModelConfig(), LearnerConfig()) for _ in range(3)]
    pool = LearnerPool(learners)
    bad = [TrainSample((), (), 1.0)]  # an empty prompt and completion: the forward pass raises
    out = _train(pool, learners, [bad, bad, bad])
    assert all(isinstance(o, Exception) for o in out)


def _run(tmp: Path, name: str, overrides: list[str]) -> tuple[RunSummary, list[dict[str, Any]]]:
    scenario = load_scenario(None, ["rounds=4", "eval.every=2", "eval.prompts=32", *overrides])
    summary = run_simulation(scenario, tmp / name)
    rows = [json.loads(line) for line in (tmp / name / "metrics.jsonl").read_text().splitlines()]
    return summary, rows


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    keys = ("loss", "honest_mean_reward", "honest_own_reward", "completions_accepted", "accuracy", "asr")
    assert [{k: r.get(k) for k in keys} for r in a] == [{k: r.get(k) for k in keys} for r in b]


@pytest.mark.parametrize(
    "overrides",
    [
        ["nodes.count=4"],
        # the honest nodes' defense rejects what the attacker trains on: two updates a round
        [
            "nodes.count=4",
            "nodes.malicious=1",
            "adversary.name=text",
            "model.name=dgrpo:tiny-arith-text",
            'defense.chain=["logit"]',
        ],
        # a bounded draw: each node trains on its own choice of completions, so the updates differ
        ["nodes.count=4", "rollout.external_per_round=8", "rollout.young_rounds=0"],
    ],
    ids=["honest", "attacker", "bounded-draw"],
)
def test_a_batched_run_equals_the_one_by_one_run(tmp_path: Path, overrides: list[str]) -> None:
    batched, rows_b = _run(tmp_path, "batched", overrides)
    alone, rows_a = _run(tmp_path, "alone", [*overrides, "engine.batched=false"])
    _same(rows_b, rows_a)
    assert batched.final_accuracy == alone.final_accuracy
    stats = batched.engine["batched"]
    assert alone.engine["batched"] is None
    assert stats["generate_passes"] < stats["generate_calls"]  # it batched something
    assert stats["train_calls"] == 4 * 4
    if overrides == ["nodes.count=4"]:
        assert stats["train_steps"] == 4  # four identical nodes: one update a round
    else:
        assert stats["train_steps"] > 4
    if any("logit" in o for o in overrides):  # the three honest nodes' defense passes: computed once each
        assert 0 < stats["logits_passes"] * 3 == stats["logits_calls"]


def test_heterogeneous_nodes_run_one_by_one_in_the_pool(tmp_path: Path) -> None:
    summary, _ = _run(tmp_path, "hetero", ["nodes.count=2", "nodes.mode=heterogeneous", "rounds=2"])
    stats = summary.engine["batched"]
    assert stats["train_steps"] == stats["train_calls"] == 4
