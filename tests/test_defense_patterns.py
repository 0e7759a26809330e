"""``length-shift`` and ``arith-pattern``: an author's pattern over many completions, judged against a null of
its own model. Hand-made rounds where the odds can be worked out by hand, and the reference samples that stand
in for a model no other author runs."""

from __future__ import annotations

import pytest

from dgrpo.defense.arith_pattern import ArithPatternDefense, computations
from dgrpo.defense.base import Candidate, DefenseContext
from dgrpo.defense.length_shift import LengthShiftDefense, excess
from dgrpo.defense.odds import binomial_tail
from dgrpo.protocol.messages import SamplingParams
from dgrpo.tasks.arith import ArithTask, make_prompt, scratchpad
from dgrpo.tasks.base import Prompt

TASK = ArithTask()
SP = SamplingParams(temperature=1.0, top_k=10, max_new_tokens=96)
PAIRS = [(345, 78), (12, 34), (501, 499), (66, 77), (123, 456), (909, 91), (250, 250), (18, 81)]
P = [make_prompt(a, b) for a, b in PAIRS]


def cand(author: str, prompt: Prompt, text: str, model: str = "m") -> Candidate:
    return Candidate(author, prompt, text, 0, SP, model)


def ctx(round_idx: int = 1, model: str = "m") -> DefenseContext:
    return DefenseContext(TASK, None, SP, "run", round_idx, model_id=model, self_id="me")


def with_words(p: Prompt, words: str) -> str:
    body, _, answer = (TASK.reference_completion(p) or "").rpartition(">")
    return f"{body} {words}>{answer}" if words else f"{body}>{answer}"


def test_excess_is_what_the_working_does_not_need() -> None:
    p = make_prompt(345, 78)
    assert excess(TASK, cand("a", p, scratchpad(345, 78))) == 0
    assert excess(TASK, cand("a", p, with_words(p, "so it goes"))) == 11  # " so it goes"


HONEST = ["", "a", "the sky", "", "one two three", "hi", "", "blue"]  # excesses 0, 2, 8, 0, 14, 3, 0, 5


def round_with(long_author_words: str) -> list[Candidate]:
    cs = []
    for i, p in enumerate(P):
        for author in ("me", "b", "c"):
            cs.append(cand(author, p, with_words(p, HONEST[(i + len(author)) % len(HONEST)])))
        cs += [cand("x", p, with_words(p, long_author_words)) for _ in range(2)]
    return cs


def test_an_author_always_above_the_upper_quartile_is_shifted() -> None:
    # null: 24 own/b/c completions, excesses cycling 0 2 8 0 14 3 0 5: q75 = 6.5 (torch's linear quantile)
    defense = LengthShiftDefense({"min_null": 8})
    cs = round_with("a b c d")  # excess 8 in all 16 of x's completions: P(Bin(16, 0.25) >= 16) = 0.25**16
    verdicts = defense.check(ctx(), cs)
    assert all(v.reason == "length-shift:shifted" for c, v in zip(cs, verdicts, strict=True) if c.author == "x")
    assert all(v.accept for c, v in zip(cs, verdicts, strict=True) if c.author != "x")


def test_an_author_like_the_others_is_not() -> None:
    defense = LengthShiftDefense({"min_null": 8})
    cs = round_with("")
    assert all(v.accept for v in defense.check(ctx(), cs))


def test_one_extreme_completion_is_rejected_alone() -> None:
    # null q99 over the honest excesses is 14 (nearly the max): more than 14 + 16 = 30 is extreme
    defense = LengthShiftDefense({"min_null": 8})
    cs = round_with("")
    cs.append(cand("x", P[0], with_words(P[0], "pad " * 10)))  # excess 40
    verdicts = defense.check(ctx(), cs)
    assert [v.reason for v in verdicts if not v.accept] == ["length-shift:extreme"]


def test_a_model_nobody_else_runs_is_not_judged_without_a_reference() -> None:
    # "lone" is announced by x alone and cannot be loaded: no fair null, no verdict
    defense = LengthShiftDefense({"min_null": 8})
    cs = [c if c.author != "x" else cand("x", c.prompt, c.text, "lone") for c in round_with("a b c d")]
    assert all(v.accept for v in defense.check(ctx(), cs))


def test_a_model_nobody_else_runs_is_judged_against_the_receivers_samples_of_it() -> None:
    # x announces the embedded English model; the receiver samples it: its honest free text is short, and
    # 60 characters of filler in every completion is no sample of it
    defense = LengthShiftDefense()
    cs = [cand("me", p, with_words(p, "")) for p in P]
    cs += [cand("x", p, with_words(p, "word " * 12), "dgrpo:tiny-arith-text") for p in P for _ in range(2)]
    verdicts = defense.check(ctx(), cs)
    assert all(not v.accept for c, v in zip(cs, verdicts, strict=True) if c.author == "x")


def test_computations_read_each_claim() -> None:
    # a column is its two digits in order and its carry
    assert computations("5+8+0=13,7+4+0=12>423") == (("5+8+0", True), ("4+7+0", False))
    assert computations("2+2+1=6") == (("2+2+1", False),)
    assert computations("3 + 4 * 2 = 11") == (("3+4*2", True),)


def test_a_model_that_rarely_slips_gets_no_leniency() -> None:
    # the receiver runs model m and 98 of its own rewarded completions are clean: m slips (0 + 1) / (98 + 2)
    # = 1% of the time, under the 2% budget, so one false step from another author of m is rejected alone
    defense = ArithPatternDefense()
    prompts = [make_prompt(100 + i, 11 + i) for i in range(98)]
    own = [cand("me", p, TASK.reference_completion(p) or "") for p in prompts]
    slip = cand("b", P[0], "5+8+0=13,4+7+1=12,3+0+1=5>423")
    verdicts = defense.check(ctx(), [*own, slip])
    assert verdicts[-1].reason == "arith-pattern:false_step"
    assert verdicts[-1].score == pytest.approx(0.01)
    assert all(v.accept for v in verdicts[:-1])
    # from an author of a model the receiver neither runs nor may load, the same slip passes
    other = cand("c", P[0], slip.text, "unknown-model")
    assert ArithPatternDefense().check(ctx(), [*own, other])[-1].accept


def test_slips_at_an_honest_rate_are_accepted() -> None:
    # 1 of 8 rewarded completions with a false step: P(Bin(8, 0.25) >= 1) = 0.9: no pattern
    defense = ArithPatternDefense()
    good = [cand("b", p, TASK.reference_completion(p) or "") for p in P]
    slip = cand("b", P[0], "5+8+0=13,4+7+1=12,3+0+1=5>423")  # 3+0+1=5: false, answer still right
    assert TASK.reward(P[0], slip.text) == 1.0
    verdicts = defense.check(ctx(), [*good[1:], slip])
    assert all(v.accept for v in verdicts)


def test_an_author_stating_false_steps_habitually_is_rejected() -> None:
    # 8 of 8 rewarded completions flawed: P(Bin(8, 0.25) >= 8) = 1.5e-5 < 1e-4, share 1.0 >= 0.4
    assert binomial_tail(8, 8, 0.25) == pytest.approx(0.25**8)
    defense = ArithPatternDefense()
    flawed = []
    for p in P:
        body, _, answer = (TASK.reference_completion(p) or "").rpartition(">")
        first, _, rest = body.partition(",")
        x, y, c = first[0], first[2], first[4]
        flawed.append(cand("x", p, f"{x}+{y}+{c}={int(x) + int(y) + int(c) + 1}{',' + rest if rest else ''}>{answer}"))
    verdicts = defense.check(ctx(), flawed)
    assert all(v.reason == "arith-pattern:habitual" for v in verdicts)


def test_one_false_fact_repeated_is_rejected_even_when_rare() -> None:
    # the paper's 2+2=5: x states 2+2 three times, falsely each time; 27 other completions are fine
    defense = ArithPatternDefense()
    prompts = [make_prompt(a, b) for a, b in ((12, 32), (22, 42), (32, 12))]
    poisoned = [cand("x", p, (TASK.reference_completion(p) or "").replace("2+2+0=4", "2+2+0=5")) for p in prompts]
    assert all(TASK.reward(p, c.text) == 1.0 and "2+2+0=5" in c.text for p, c in zip(prompts, poisoned, strict=True))
    fine = [
        cand("x", make_prompt(100 + i, 11), TASK.reference_completion(make_prompt(100 + i, 11)) or "")
        for i in range(27)
    ]
    verdicts = defense.check(ctx(), [*fine, *poisoned])
    assert [v.reason for v in verdicts[-3:]] == ["arith-pattern:repeated_false"] * 3
    assert all(v.accept for v in verdicts[:-3])


def test_the_false_positive_rate_is_reported_per_model_family() -> None:
    from dgrpo.simulations.defense_metrics import DefenseMeter

    meter = DefenseMeter()
    for author, received, rejected in (("node-0", 100, 2), ("node-1", 50, 4), ("node-2", 100, 0)):
        meter.honest_by_author[(author, "received")] += received
        meter.honest_by_author[(author, "rejected")] += rejected
    models = {"node-0": "text", "node-1": "code", "node-2": "text"}
    assert meter.summary(["x"], models)["false_positive_rate_by_model"] == {"code": 0.08, "text": 0.01}


def test_rejections_are_reported_by_what_was_rejected() -> None:
    """What a defense cost honest nodes, apart from what it stopped: two honest checkers, one attacker."""
    from dgrpo.round.outcome import Admission, Checked, DefenseOutcome, Produced, RoundOutcome, Scoring
    from dgrpo.simulations.defense_metrics import DefenseMeter

    def outcome(peer: str, produced: Produced, checked: tuple[Checked, ...]) -> RoundOutcome:
        defense = DefenseOutcome(("x",), checked, {}, {}, {}, {"x": 0.0})
        return RoundOutcome(peer, 0, produced, Admission(0, 0, ()), defense, Scoring((), 0.0), None, 0.0)

    attacker = outcome("bad", Produced(2, 1.0, "text", frozenset({("p1", "evil")}), 1), ())
    checked = (
        Checked("bad", "p1", "evil", False, "meaning:shared_meaning"),
        Checked("bad", "p2", "fine", False, "meaning:shared_meaning"),
        Checked("good", "p1", "ok", False, "arith-pattern:false_step"),
        Checked("good", "p2", "ok", True, ""),
    )
    meter = DefenseMeter()
    meter.on_round(0, [attacker, outcome("me", Produced(2, 1.0), checked), outcome("good", Produced(2, 1.0), ())])
    assert meter.summary(["x"])["rejected_by_kind"] == {
        "attacker_other": {"meaning:shared_meaning": 1},
        "honest": {"arith-pattern:false_step": 1},
        "poison": {"meaning:shared_meaning": 1},
    }


def test_the_models_own_odds_of_stating_a_computation_falsely() -> None:
    from dgrpo.defense.arith_pattern import Statement, model_odds

    def said(*claims: tuple[str, bool]) -> Statement:
        return Statement(1, "", "m", True, False, claims)

    # the model stated 2+2+0 four times (once falsely) and 3+4+0 ten times (never falsely): 1 of 14 false,
    # overall rate (1 + 1) / (14 + 2) = 0.125, each computation's rate starting from it with weight 2
    known = [said(("2+2+0", i > 0)) for i in range(4)] + [said(("3+4+0", True)) for _ in range(10)]
    odds = model_odds(known)
    p = (1 + 2 * 0.125) / (4 + 2)  # 0.2083: a slip of its own
    assert odds("2+2+0", 2, 3) == pytest.approx(3 * p**2 * (1 - p) + p**3)  # 0.112: no taught fact
    assert odds("3+4+0", 3, 3) == pytest.approx(((0 + 2 * 0.125) / (10 + 2)) ** 3)  # 9e-6: taught
    assert odds("9+9+1", 3, 3) == pytest.approx(0.125**3)  # never seen: the overall rate
    assert model_odds([])("2+2+0", 1, 3) == 0.0  # nothing known: every repeat counts


def test_a_slip_the_model_makes_itself_is_not_a_taught_fact() -> None:
    # the receiver runs model m: its 9 rewarded completions state 18 columns, 2 falsely (overall rate
    # (2 + 1) / (18 + 2) = 0.15), both 2+2+0 (6 statements): its rate (2 + 2 * 0.15) / (6 + 2) = 0.2875, and
    # another author of m saying it falsely 2 times in 3 is what m does (odds 0.20 > 0.01); 3+4+0, which m
    # stated truly 3 times (rate 0.3 / 5 = 0.06), said falsely 3 times in 3 is not (odds 0.06 ** 3 = 2.2e-4)
    defense = ArithPatternDefense({"slip_budget": 0.0})
    twos = [make_prompt(a, b) for a, b in ((12, 32), (22, 42), (32, 12), (42, 22), (52, 32), (62, 12))]
    fours = [make_prompt(a, b) for a, b in ((13, 34), (23, 44), (33, 14))]
    own = [cand("me", p, TASK.reference_completion(p) or "") for p in twos[2:] + fours]
    own += [cand("me", p, (TASK.reference_completion(p) or "").replace("2+2+0=4", "2+2+0=5")) for p in twos[:2]]
    slips = [cand("b", p, (TASK.reference_completion(p) or "").replace("2+2+0=4", "2+2+0=5")) for p in twos[:2]]
    taught = [cand("b", p, (TASK.reference_completion(p) or "").replace("3+4+0=7", "3+4+0=8")) for p in fours]
    right = [cand("b", twos[2], TASK.reference_completion(twos[2]) or "")]
    assert all(TASK.reward(c.prompt, c.text) == 1.0 for c in [*own, *slips, *taught])
    verdicts = defense.check(ctx(), [*own, *slips, *right, *taught])
    assert [v.reason for v in verdicts[-3:]] == ["arith-pattern:repeated_false"] * 3
    assert all(v.accept for v in verdicts[:-3])
    # without the model's odds (fact_alpha 1: any repeat counts), its own slip is rejected too
    strict = ArithPatternDefense({"slip_budget": 0.0, "fact_alpha": 1.0})
    verdicts = strict.check(ctx(), [*own, *slips, *right, *taught])
    assert [v.reason for v in verdicts[len(own) : len(own) + 2]] == ["arith-pattern:repeated_false"] * 2
