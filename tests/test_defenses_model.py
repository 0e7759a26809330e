"""The model-based defenses (logit, sampling-proof) and the seeded sampler, on the embedded tiny model.

Homogeneous false positives are measured the way issue 5 asks: on honest completions made by another node
(another Learner holding the same weights), also after one training step and a checkpoint save and reload on
the verifier's side.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dgrpo.adversary.facts import parse_fact
from dgrpo.adversary.math_step import falsify_scratchpad
from dgrpo.config import LearnerConfig, ModelConfig
from dgrpo.daemon.checkpoint import CheckpointManager, CheckpointState
from dgrpo.defense import Candidate, DefenseChain, DefenseConfig, DefenseContext, Verdict
from dgrpo.learner.batch import TrainSample
from dgrpo.learner.learner import Learner
from dgrpo.learner.sampler import completion_seed, gumbel_noise, splitmix64
from dgrpo.protocol.messages import SamplingParams
from dgrpo.tasks.arith import ArithTask
from dgrpo.tasks.arith import make_prompt as arith_prompt
from dgrpo.tasks.base import Prompt

SP = SamplingParams(temperature=1.0, top_k=10, top_p=1.0, max_new_tokens=48)
RUN, ROUND, AUTHOR = "run", 3, "node-1"


@pytest.fixture(scope="module")
def task() -> ArithTask:
    return ArithTask()


@pytest.fixture(scope="module")
def author() -> Learner:
    return Learner(ModelConfig(), LearnerConfig())


@pytest.fixture(scope="module")
def verifier() -> Learner:
    return Learner(ModelConfig(), LearnerConfig())


@pytest.fixture(scope="module")
def prompts(task: ArithTask) -> list[Prompt]:
    return task.sample_prompts(16, "defense-test")


@pytest.fixture(scope="module")
def math_pairs(author: Learner) -> list[tuple[Prompt, str, int]]:
    """MATH poison: honest completions of prompts with a 2+2 column, that column made false (2+2+c=5+c)."""
    ps = [arith_prompt(a, b) for a, b in [(322, 452), (12, 62), (521, 21), (242, 123), (702, 82), (32, 92)]]
    texts = author.generate([p.text for p in ps], 4, SP, seeds=seeds_for(ps, 4))
    fact = [parse_fact("2+2=5")]
    out = [(p, falsify_scratchpad(t, fact, 0), j) for p, ts in zip(ps, texts, strict=True) for j, t in enumerate(ts)]
    originals = {(p.id, j): t for p, ts in zip(ps, texts, strict=True) for j, t in enumerate(ts)}
    # Keep real rewrites (a sample that already wrote 2+2+0=5 is the model's own, honest, draw).
    return [(p, t, j) for p, t, j in out if t is not None and t != originals[(p.id, j)]]


def seeds_for(prompts: list[Prompt], n: int) -> list[list[int]]:
    return [[completion_seed(RUN, ROUND, AUTHOR, p.id, j) for j in range(n)] for p in prompts]


@pytest.fixture(scope="module")
def honest(author: Learner, prompts: list[Prompt]) -> list[list[str]]:
    return author.generate([p.text for p in prompts], 4, SP, seeds=seeds_for(prompts, 4))


def candidates(prompts: list[Prompt], texts: list[list[str]], author: str = AUTHOR) -> list[Candidate]:
    return [Candidate(author, p, t, j, SP, "m") for p, ts in zip(prompts, texts, strict=True) for j, t in enumerate(ts)]


def check(name: str, learner: Learner, task: ArithTask, cands: list[Candidate], **options: object) -> list[Verdict]:
    chain = DefenseChain.from_config(DefenseConfig(chain=[name], options={name: dict(options)} if options else {}))
    return chain.run(DefenseContext(task, learner, SP, RUN, ROUND, "m"), cands).verdicts


# ------------------------------------------------------------------ the seeded sampler
def test_splitmix64_test_vector() -> None:
    # SplitMix64 seeded with 0: first output 0xE220A8397B1DCDAF (Vigna's reference implementation).
    assert int(splitmix64(np.array([0], dtype=np.uint64))[0]) == 0xE220A8397B1DCDAF


def test_gumbel_noise_matches_the_spec_in_plain_python() -> None:
    def mix(z: int) -> int:
        m = (1 << 64) - 1
        z = (z + 0x9E3779B97F4A7C15) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    seed, position, token = 123456789, 7, 42
    u = ((mix(seed ^ mix((position << 32) | token)) >> 11) + 0.5) * 2.0**-53
    expected = -np.log(-np.log(u))
    assert gumbel_noise(seed, position, np.array([token]))[0] == pytest.approx(expected, abs=0)


def test_seeded_generation_is_reproducible_and_batch_independent(author: Learner, prompts: list[Prompt]) -> None:
    seeds = seeds_for(prompts, 4)
    full = author.generate([p.text for p in prompts], 4, SP, seeds=seeds)
    part = author.generate([p.text for p in prompts[5:8]], 4, SP, seeds=seeds[5:8])
    assert part == full[5:8]
    other = author.generate([p.text for p in prompts[:2]], 4, SP, seeds=[[s + 1 for s in row] for row in seeds[:2]])
    assert other != full[:2]  # another seed draws other completions
    with pytest.raises(ValueError):
        author.generate([p.text for p in prompts[:2]], 4, SP, seeds=seeds[:1])


def test_completion_seed_depends_on_every_part() -> None:
    base = completion_seed("r", 1, "a", "p", 0)
    assert len({base, *(completion_seed(*args) for args in [("q", 1, "a", "p", 0), ("r", 2, "a", "p", 0),
                                                          ("r", 1, "b", "p", 0), ("r", 1, "a", "q", 0),
                                                          ("r", 1, "a", "p", 1)])}) == 6  # fmt: skip


# ------------------------------------------------------------------ sampling-proof
def test_sampling_proof_accepts_honest_completions_of_another_node(
    verifier: Learner, task: ArithTask, prompts: list[Prompt], honest: list[list[str]]
) -> None:
    verdicts = check("sampling-proof", verifier, task, candidates(prompts, honest))
    assert all(v.accept for v in verdicts), [v.reason for v in verdicts if not v.accept]


def test_sampling_proof_survives_a_step_and_checkpoint_reload(
    task: ArithTask, prompts: list[Prompt], tmp_path: Path
) -> None:
    """Author and verifier both take the same training step; the verifier then saves, reloads into a fresh
    Learner and checks the author's next completions."""
    a, b = Learner(ModelConfig(), LearnerConfig(lr=1e-3)), Learner(ModelConfig(), LearnerConfig(lr=1e-3))
    batch = [TrainSample(a.encode_prompt(p.text), a.encode_completion(p.answer, 48), 1.0) for p in prompts[:8]]
    a.train_step(batch, 1.0, 48)
    b.train_step(batch, 1.0, 48)
    manager = CheckpointManager(tmp_path)
    path = manager.save(CheckpointState(1, b.model.state_dict(), b.optimizer.state_dict(), 0, {}))
    state = CheckpointManager.read(path)
    assert state is not None
    c = Learner(ModelConfig(), LearnerConfig(lr=1e-3))
    c.model.load_state_dict(state.model)
    assert c.weights_digest() == a.weights_digest()
    texts = a.generate([p.text for p in prompts], 4, SP, seeds=seeds_for(prompts, 4))
    for name in ["sampling-proof", "logit"]:
        assert all(v.accept for v in check(name, c, task, candidates(prompts, texts))), name


def test_sampling_proof_rejects_every_attack(
    verifier: Learner,
    author: Learner,
    task: ArithTask,
    prompts: list[Prompt],
    honest: list[list[str]],
    math_pairs: list[tuple[Prompt, str, int]],
) -> None:
    p, text = prompts[0], honest[0][0]
    text_poison = text.replace(">", " All hail to the thief>")
    assert len(math_pairs) >= 8
    # DoS: the longest of many samples drawn with other seeds, published under index 0.
    pool = author.generate([p.text], 32, SP)[0]
    longest = max((t for t in pool if t != text), key=len)
    bad = [Candidate(AUTHOR, p, text_poison, 0, SP, "m"), Candidate(AUTHOR, p, longest, 0, SP, "m"),
           Candidate(AUTHOR, p, text, 1, SP, "m"),  # a real completion replayed under another index
           Candidate("node-2", p, text, 0, SP, "m"),  # ... or under another author
           Candidate(AUTHOR, p, text, 0, SP.model_copy(update={"top_k": 50}), "m")]  # fmt: skip
    bad += [Candidate(AUTHOR, q, t, j, SP, "m") for q, t, j in math_pairs]
    verdicts = check("sampling-proof", verifier, task, bad)
    assert not any(v.accept for v in verdicts)
    assert verdicts[4].reason == "sampling-proof:sampling_mismatch"
    assert verdicts[0].reason == "sampling-proof:diverged" and verdicts[0].score > 0.2


def test_sampling_proof_tolerance_option(verifier: Learner, task: ArithTask, prompts: list[Prompt],
                                         honest: list[list[str]]) -> None:  # fmt: skip
    """A completion with one token changed passes only when the tolerance allows one mismatch."""
    p, text = prompts[0], honest[0][0]
    flipped = text[:-1] + ("0" if text[-1] != "0" else "1")
    strict = check("sampling-proof", verifier, task, [Candidate(AUTHOR, p, flipped, 0, SP, "m")])
    loose = check("sampling-proof", verifier, task, [Candidate(AUTHOR, p, flipped, 0, SP, "m")],
                  max_mismatch_fraction=0.5)  # fmt: skip
    assert not strict[0].accept and loose[0].accept


# ------------------------------------------------------------------ logit
def test_logit_check_reproduces_the_papers_pattern(
    verifier: Learner,
    task: ArithTask,
    prompts: list[Prompt],
    honest: list[list[str]],
    math_pairs: list[tuple[Prompt, str, int]],
) -> None:
    """Honest completions pass; TEXT (letters far outside the digit model's top-k) is stopped; MATH passes
    ("5" is in the top-k after "2+2+0=", paper sec. 6.1)."""
    assert all(v.accept for v in check("logit", verifier, task, candidates(prompts, honest)))
    p, text = prompts[0], honest[0][0]
    # (a short payload: the full phrase would take the text past max_new_tokens, rejected as an overflow)
    text_poison = [Candidate(AUTHOR, p, text.replace(">", " hail>"), 0, SP, "m")]
    assert len(text_poison[0].text) < SP.max_new_tokens
    assert check("logit", verifier, task, text_poison)[0].reason == "logit:outside_top_k"
    # Text past max_new_tokens (+ the slack) after sampled tokens: rejected as an overflow.
    sp8 = SP.model_copy(update={"max_new_tokens": 8})
    cut = verifier.generate([p.text], 1, sp8, seeds=[[completion_seed(RUN, ROUND, AUTHOR, p.id, 0)]])[0][0]
    assert len(cut) == 8
    chain = DefenseChain.from_config(DefenseConfig(chain=["logit"], options={"logit": {"overflow_slack": 0.0}}))
    ctx = DefenseContext(task, verifier, sp8, RUN, ROUND, "m")
    assert chain.run(ctx, [Candidate(AUTHOR, p, cut, 0, sp8, "m")]).verdicts[0].accept
    assert chain.run(ctx, [Candidate(AUTHOR, p, cut + ">423", 0, sp8, "m")]).verdicts[0].reason == "logit:overflow"
    # The MATH poison that keeps its reward (the attacker publishes only those).
    math_poison = [Candidate(AUTHOR, q, t, j, SP, "m") for q, t, j in math_pairs if task.reward(q, t) == 1.0]
    assert len(math_poison) >= 4
    verdicts = check("logit", verifier, task, math_poison)
    assert sum(v.accept for v in verdicts) >= 0.75 * len(verdicts), [v.score for v in verdicts]


def test_shared_prompt_forward_matches_the_full_forward(
    verifier: Learner, prompts: list[Prompt], honest: list[list[str]]
) -> None:
    """Each prompt run once with its KV cache repeated per completion gives the logits of running every
    (prompt, completion) pair whole, to float noise far below the checks' tolerance."""
    samples = [
        (verifier.encode_prompt(p.text), verifier.encode_completion(c, SP.max_new_tokens))
        for p, cs in zip(prompts[:4], honest[:4], strict=True)
        for c in cs
    ]
    samples.append((verifier.encode_prompt(prompts[5].text), (verifier.eos_ids[0],)))  # a one-token completion
    assert len({p for p, _ in samples}) < len(samples)  # prompts repeat: there is something to share
    with verifier.inference():
        full, ids, mask = verifier.completion_logits(samples)
        shared, ids2, mask2 = verifier.completion_logits_shared(samples)
    assert torch.equal(ids, ids2) and torch.equal(mask, mask2)
    m = mask.bool()
    assert (full - shared).abs()[m].max() < 1e-4
    assert torch.equal(full.argmax(-1)[m], shared.argmax(-1)[m])
    with verifier.inference():
        one = verifier.completion_logits_shared(samples[-1:])[0]
    assert one.shape[1] == 1 and torch.allclose(one[0, 0], full[-1, 0], atol=1e-4)


def test_checked_tokens_and_overflow_with_slack(verifier: Learner) -> None:
    """encode_checked on the character-level model (one token per character), max_new_tokens 8, slack 2."""
    from dgrpo.defense.forward import encode_checked

    eos = verifier.eos_ids[0]
    ids, over = encode_checked(verifier, "12345", 8, 2)
    assert len(ids) == 6 and ids[-1] == eos and not over  # stopped early: its EOS is checked too
    ids, over = encode_checked(verifier, "123456789", 8, 2)
    assert len(ids) == 9 and eos not in ids and not over  # one token past the cap: checked, not rejected
    ids, over = encode_checked(verifier, "12345678901", 8, 2)
    assert len(ids) == 10 and over  # past the slack: the tail would go unchecked
    assert encode_checked(verifier, "123456789", 8, 0)[1]  # no slack (sampling-proof): an overflow
    assert encode_checked(verifier, "12345", 8, 0)[0] == verifier.encode_completion("12345", 8)


def test_logit_top_k_boundary_by_hand() -> None:
    from dgrpo.defense.logit import outside_top

    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0], [0.0, 1.0, 2.0, 3.0]])
    # top-2: row 0 keeps {0, 1}, row 1 keeps {3, 2}.
    assert outside_top(logits, torch.tensor([1, 2]), 1.0, 2, 1.0, 1e-3) == 0
    assert outside_top(logits, torch.tensor([2, 1]), 1.0, 2, 1.0, 1e-3) == 2
    # top-p 0.5 at temperature 1: row 0 softmax ~ [.64, .24, .09, .03] -> only token 0 is needed.
    assert outside_top(logits, torch.tensor([1, 3]), 1.0, 0, 0.5, 1e-3) == 1
    # Batched with padding: the masked position is not counted.
    batch = outside_top(logits[None].repeat(2, 1, 1), torch.tensor([[2, 1], [2, 1]]), 1.0, 2, 1.0, 1e-3,
                        torch.tensor([[True, True], [True, False]]))  # fmt: skip
    assert batch.tolist() == [2, 1]


# ------------------------------------------------------------------ the string-level replay
def test_replay_accepts_honest_and_rejects_a_one_token_edit(
    verifier: Learner, prompts: list[Prompt], honest: list[list[str]], math_pairs: list[tuple[Prompt, str, int]]
) -> None:
    from dgrpo.defense.sampling_proof import replay

    for p, texts in zip(prompts[:4], honest[:4], strict=True):
        for j, text in enumerate(texts):
            assert replay(verifier, p.text, text, completion_seed(RUN, ROUND, AUTHOR, p.id, j), SP, 1e-3)
    q, poisoned, j = math_pairs[0]
    assert not replay(verifier, q.text, poisoned, completion_seed(RUN, ROUND, AUTHOR, q.id, j), SP, 1e-3)
    p, text = prompts[0], honest[0][0]
    assert not replay(verifier, p.text, text[:-1], completion_seed(RUN, ROUND, AUTHOR, p.id, 0), SP, 1e-3)


def test_sampling_proof_rejects_text_beyond_max_new_tokens(
    verifier: Learner, task: ArithTask, prompts: list[Prompt], honest: list[list[str]]
) -> None:
    """The learner trains on the first max_new_tokens tokens while the reward reads the whole string: an
    answer appended after honest-looking tokens must not pass as sampled."""
    sp = SP.model_copy(update={"max_new_tokens": 8})
    p = prompts[0]
    seed_texts = verifier.generate([p.text], 1, sp, seeds=[[completion_seed(RUN, ROUND, AUTHOR, p.id, 0)]])[0]
    assert len(seed_texts[0]) == 8  # truncated: a character-level model, 8 tokens
    chain = DefenseChain.from_config(DefenseConfig(chain=["sampling-proof"]))
    ctx = DefenseContext(task, verifier, sp, RUN, ROUND, "m")
    ok = chain.run(ctx, [Candidate(AUTHOR, p, seed_texts[0], 0, sp, "m")]).verdicts[0]
    extended = chain.run(ctx, [Candidate(AUTHOR, p, seed_texts[0] + ">423", 0, sp, "m")]).verdicts[0]
    assert ok.accept and extended.reason == "sampling-proof:overflow"
