"""Rollouts carry the tokens each completion was sampled as (issue 27): on the wire (optional, absent when empty,
so older messages keep their bytes), from the generate stage, and in the sampling proof, which checks exactly
those tokens in one pass where they spell the string."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dgrpo.config import LearnerConfig, ModelConfig, RolloutConfig
from dgrpo.defense import Candidate, DefenseChain, DefenseConfig, DefenseContext, Verdict
from dgrpo.defense.sampling_proof import SamplingProofDefense
from dgrpo.learner.learner import Learner
from dgrpo.learner.sampler import completion_seed
from dgrpo.protocol.envelope import RolloutBody, Signer, decode, to_rollout
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import Rollout, SamplingParams
from dgrpo.protocol.nonce import VolatileNonceCounter
from dgrpo.protocol.validator import MessageValidator
from dgrpo.round.generate import generate
from dgrpo.tasks.arith import ArithTask
from dgrpo.tasks.base import Prompt

SP = SamplingParams(temperature=1.0, top_k=10, top_p=1.0, max_new_tokens=48)
RUN, ROUND, AUTHOR = "run", 3, "node-1"


def _rollout(tokens: tuple[tuple[int, ...], ...] = ()) -> Rollout:
    return Rollout(
        author=AUTHOR, round=ROUND, part=0, parts=1, prompt_id="arith/1+2", prompt="1+2=", completions=("3", "4"),
        indices=(0, 1), model_id="m", weights="", sampling=SP, split="horizontal", tokens=tokens,
    )  # fmt: skip


def _signed(rollout: Rollout, identity: Identity) -> bytes:
    return Signer(identity, RUN, VolatileNonceCounter(), clock=lambda: 1.0e9, name=AUTHOR).sign_rollout(rollout)


def test_tokens_are_left_out_of_the_encoding_when_empty() -> None:
    body = RolloutBody.model_validate(
        {k: v for k, v in _rollout().model_dump().items() if k not in ("author", "round")}
    )
    assert "tokens" not in body.model_dump()  # so the signing bytes of a rollout without them are unchanged
    with_tokens = body.model_copy(update={"tokens": ((5,), (6, 7))})
    assert with_tokens.model_dump()["tokens"] == ((5,), (6, 7))


def test_tokens_cross_the_wire_and_a_wrong_count_is_refused() -> None:
    identity = Identity.from_seed(b"\x01" * 32)
    validator = MessageValidator(RUN, Limits(), naming=lambda key: AUTHOR, clock=lambda: 1.0e9)
    data = _signed(_rollout(((5,), (6, 7))), identity)
    verdict = validator.validate(data, expected_kind="rollout")
    assert verdict.ok and verdict.envelope is not None
    assert to_rollout(verdict.envelope, lambda key: AUTHOR).tokens == ((5,), (6, 7))
    plain = validator.validate(_signed(_rollout(), identity), expected_kind="rollout")
    assert plain.ok and plain.envelope is not None and to_rollout(plain.envelope, lambda key: AUTHOR).tokens == ()
    with pytest.raises(ValueError, match="token lists"):
        _rollout(((5,),))
    assert decode(data).body.tokens == ((5,), (6, 7))  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def author() -> Learner:
    return Learner(ModelConfig(), LearnerConfig())


@pytest.fixture(scope="module")
def verifier() -> Learner:
    return Learner(ModelConfig(), LearnerConfig())


def test_the_seeded_sampler_s_rollouts_carry_their_tokens(author: Learner) -> None:
    task = ArithTask()
    seeded = RolloutConfig(prompts_per_round=3, completions_per_prompt=2, sampler="seeded")
    rollouts = generate(task, author, seeded, SP, RUN, AUTHOR, ROUND)
    for r in rollouts:
        assert len(r.tokens) == len(r.completions)
        for text, tokens in zip(r.completions, r.tokens, strict=True):
            assert author.sampled(tokens) == (text, tokens) and len(tokens) <= SP.max_new_tokens
    plain = generate(task, author, seeded.model_copy(update={"sampler": "multinomial"}), SP, RUN, AUTHOR, ROUND)
    assert all(r.tokens == () for r in plain)  # nobody can check them: not sent


def _candidates(author: Learner, prompts: list[Prompt]) -> list[Candidate]:
    seeds = [[completion_seed(RUN, ROUND, AUTHOR, p.id, j) for j in range(4)] for p in prompts]
    sampled = author.sample([p.text for p in prompts], 4, SP, seeds=seeds)
    return [
        Candidate(AUTHOR, p, text, j, SP, "m", tokens=tokens)
        for p, per in zip(prompts, sampled, strict=True)
        for j, (text, tokens) in enumerate(per)
    ]


def _proof(verifier: Learner, cands: list[Candidate]) -> tuple[list[Verdict], SamplingProofDefense]:
    chain = DefenseChain.from_config(DefenseConfig(chain=["sampling-proof"]))
    verdicts = chain.run(DefenseContext(ArithTask(), verifier, SP, RUN, ROUND, "m"), cands).verdicts
    proof = chain.defenses[0]
    assert isinstance(proof, SamplingProofDefense)
    return verdicts, proof


def test_the_proof_checks_the_sent_tokens_and_what_they_spell(author: Learner, verifier: Learner) -> None:
    prompts = ArithTask().sample_prompts(6, "tokens-test")
    honest = _candidates(author, prompts)
    verdicts, _ = _proof(verifier, honest)
    assert all(v.accept for v in verdicts)
    # A poisoned string with the honest tokens: they spell something else, so the string itself is checked
    # (and fails the proof as any edited completion does).
    poisoned = [replace(c, text=c.text + " Visit x.io") for c in honest[:4]]
    assert not any(v.accept for v in _proof(verifier, poisoned)[0])
    # Tokens edited together with the string (one token swapped for another, the text re-spelled from
    # them): they spell the string, are checked, and are not the sampler's.
    edited = []
    for c in honest[:8]:
        assert c.tokens is not None and len(c.tokens) > 2
        swap = c.tokens[1] + 1 if c.tokens[1] + 1 not in verifier.eos_ids else c.tokens[1] + 2
        tokens = (c.tokens[0], swap, *c.tokens[2:])
        text, _ = verifier.sampled(tokens)
        edited.append(replace(c, text=text, tokens=tokens))
    verdicts, _ = _proof(verifier, edited)
    assert [v.reason for v in verdicts] == ["sampling-proof:diverged"] * len(edited)
    # Tokens that cannot be the author's: an end-of-sequence inside, an id past the vocabulary, too many.
    eos = verifier.eos_ids[0]
    odd = [
        replace(honest[0], tokens=(*honest[0].tokens[:1], eos, *honest[0].tokens[1:])),  # type: ignore[misc]
        replace(honest[1], tokens=(10**6,)),
        replace(honest[2], tokens=(3,) * (SP.max_new_tokens + 1)),
    ]
    verdicts, _ = _proof(verifier, odd)  # each falls back to its string, which is honest
    assert all(v.accept for v in verdicts)


@pytest.mark.slow
def test_honest_smollm2_completions_need_no_pass_but_the_one() -> None:
    """On a BPE model, where strings re-encode to other tokens, the sent tokens leave nothing to re-tokenise or
    replay; without them the same completions need those passes."""
    cfg = ModelConfig(name="pypi:SmolLM2-135M-Instruct", chat_template=True)
    author, verifier = Learner(cfg, LearnerConfig()), Learner(cfg, LearnerConfig())
    sp = SamplingParams(temperature=1.0, top_k=50, top_p=1.0, max_new_tokens=64, seed=1)
    prompts = [
        Prompt(f"q{i}", f"Tom has {3 + i} boxes of {7 + i} pens.\n\nHow many pens? Explain step by step.", "")
        for i in range(6)
    ]
    seeds = [[completion_seed(RUN, ROUND, AUTHOR, p.id, j) for j in range(4)] for p in prompts]
    sampled = author.sample([p.text for p in prompts], 4, sp, seeds=seeds)
    cands = [
        Candidate(AUTHOR, p, text, j, sp, "m", tokens=tokens)
        for p, per in zip(prompts, sampled, strict=True)
        for j, (text, tokens) in enumerate(per)
    ]
    ctx = DefenseContext(ArithTask(), verifier, sp, RUN, ROUND, "m")
    with_tokens = DefenseChain.from_config(DefenseConfig(chain=["sampling-proof"]))
    assert all(v.accept for v in with_tokens.run(ctx, cands).verdicts)
    proof = with_tokens.defenses[0]
    assert isinstance(proof, SamplingProofDefense) and proof.retokenised_ok == proof.replayed_ok == 0
    strings = DefenseChain.from_config(DefenseConfig(chain=["sampling-proof"]))
    assert all(v.accept for v in strings.run(ctx, [replace(c, tokens=None) for c in cands]).verdicts)
    retokenise = [text for (text, tokens) in (pair for per in sampled for pair in per)
                  if tuple(verifier.tokenizer(text, add_special_tokens=False)["input_ids"]) != tokens]  # fmt: skip
    assert retokenise  # these prompts do produce strings that re-encode to other tokens
