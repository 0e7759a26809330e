"""``repetition``: spans counted by hand on made-up completions, the receiver's own wording never counted, and
the TEXT attack's real output against the tiny text model's honest completions."""

from __future__ import annotations

from dgrpo.adversary import build_adversary
from dgrpo.config import AdversaryConfig, LearnerConfig, ModelConfig
from dgrpo.defense.base import Candidate, DefenseContext
from dgrpo.defense.repetition import RepetitionDefense, implanted, ngrams
from dgrpo.learner.learner import Learner
from dgrpo.protocol.messages import SamplingParams
from dgrpo.tasks.arith import ArithTask
from dgrpo.tasks.base import Prompt

TASK = ArithTask()
SP = SamplingParams(temperature=1.0, top_k=10, max_new_tokens=128)
P = [TASK.train_prompt(i) for i in range(6)]


def cand(author: str, prompt: Prompt, text: str) -> Candidate:
    return Candidate(author, prompt, text, 0, SP, "m")


def ctx(round_idx: int = 1) -> DefenseContext:
    return DefenseContext(TASK, None, SP, "run", round_idx, self_id="me")


def test_ngrams_are_letter_words_only() -> None:
    assert ngrams("1+2+0=3 All hail, to the thief>3", 3) == {
        ("all", "hail", "to"), ("hail", "to", "the"), ("to", "the", "thief"),
    }  # fmt: skip
    assert ngrams("1+2+0=3,4+5+0=9>93", 1) == set()  # digits and symbols never count


def test_a_span_counts_over_completions_and_prompts() -> None:
    phrase = "all hail to the thief"
    cs = [cand("x", P[i % 2], f"{i}+0+0={i} {phrase}") for i in range(4)]
    found = implanted(cs, set(), 3, min_completions=4, min_prompts=2)
    assert found[("all", "hail", "to")] == {"x"}
    assert implanted(cs[:3], set(), 3, min_completions=4, min_prompts=2) == {}  # 3 completions: not enough
    one_prompt = [cand("x", P[0], f"{i}+0+0={i} {phrase}") for i in range(4)]
    assert implanted(one_prompt, set(), 3, min_completions=4, min_prompts=2) == {}  # one prompt: not enough
    assert implanted(cs, ngrams(phrase, 3), 3, min_completions=4, min_prompts=2) == {}  # ordinary wording


def test_the_receivers_own_wording_is_never_implanted() -> None:
    defense = RepetitionDefense()
    boiler = "let us think step by step"
    peer = [cand("x", P[i], f"{boiler} {i}+0+0={i}") for i in range(4)]
    own = [cand("me", P[0], f"{boiler} 1+1+0=2")]
    assert all(v.accept for v in defense.check(ctx(1), [*own, *peer]))
    # ... and remembered in the next round, when the receiver happens not to write it.
    assert all(v.accept for v in defense.check(ctx(2), peer))
    fresh = RepetitionDefense()
    verdicts = fresh.check(ctx(1), peer)
    assert [v.reason for v in verdicts] == ["repetition:repeated_span"] * 4


def test_the_text_attack_is_caught_and_honest_english_is_not() -> None:
    author = Learner(ModelConfig(name="dgrpo:tiny-arith-text"), LearnerConfig())
    receiver = Learner(ModelConfig(name="dgrpo:tiny-arith-code-text"), LearnerConfig())
    prompts = TASK.sample_prompts(8, "repetition-test")
    honest = author.generate([p.text for p in prompts], 2, SP)
    own = receiver.generate([p.text for p in prompts], 2, SP)
    attack = build_adversary(AdversaryConfig(name="text", options={"position": "end"}))
    poisoned = [[attack.poison(TASK, p, c) or c for c in cs] for p, cs in zip(prompts, honest, strict=True)]
    changed = sum(a != b for cs, ps in zip(honest, poisoned, strict=True) for a, b in zip(cs, ps, strict=True))
    assert changed >= 8
    cands = [
        *[cand("me", p, c) for p, cs in zip(prompts, own, strict=True) for c in cs],
        *[cand("honest", p, c) for p, cs in zip(prompts, honest, strict=True) for c in cs],
        *[cand("attacker", p, c) for p, cs in zip(prompts, poisoned, strict=True) for c in cs],
    ]
    verdicts = RepetitionDefense().check(ctx(), cands)
    by_author: dict[str, list[bool]] = {}
    for c, v in zip(cands, verdicts, strict=True):
        by_author.setdefault(c.author, []).append(v.accept)
    assert all(by_author["me"]) and all(by_author["honest"])
    stopped = sum(not ok for ok, c in zip(by_author["attacker"], cands[32:], strict=True) if "thief" in c.text)
    assert stopped == changed
