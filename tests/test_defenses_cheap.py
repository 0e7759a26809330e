"""The cheap defenses (length, arith-check, code-policy), the chain and the reputation policy, on fixed inputs
with numbers worked out by hand."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dgrpo.adversary.code_calc import rewrite_program
from dgrpo.defense import (
    DEFENSES,
    Candidate,
    Defense,
    DefenseChain,
    DefenseConfig,
    DefenseContext,
    Reputation,
    ReputationConfig,
    Verdict,
    parse_defense_spec,
)
from dgrpo.defense.arith_check import evaluate, false_claims
from dgrpo.defense.code_policy import violations
from dgrpo.defense.length import outliers
from dgrpo.errors import ConfigError, UnknownNameError
from dgrpo.protocol.messages import SamplingParams
from dgrpo.tasks.arith import ArithTask, scratchpad
from dgrpo.tasks.arith import make_prompt as arith_prompt
from dgrpo.tasks.arith_code import ArithCodeTask
from dgrpo.tasks.arith_code import make_prompt as code_prompt
from dgrpo.tasks.base import Prompt, Task

SP = SamplingParams(temperature=1.0, top_k=10, max_new_tokens=48)


def ctx(task: Task) -> DefenseContext:
    return DefenseContext(task, None, SP, "run", 1)


def cand(prompt: Prompt, text: str, author: str = "peer", index: int = 0) -> Candidate:
    return Candidate(author, prompt, text, index, SP, "m")


def run(name: str, task: Task, candidates: Sequence[Candidate], **options: object) -> list[Verdict]:
    return (
        DefenseChain.from_config(DefenseConfig(chain=[name], options={name: dict(options)}))
        .run(ctx(task), candidates)
        .verdicts
    )


# ---------------------------------------------------------------- length
def test_length_outliers_by_hand() -> None:
    # median 30, MAD 1 -> robust sd 1.4826; 61 > 1.5 x 30 = 45 and 61 - 30 = 31 > 3 x 1.4826: outlier.
    assert outliers([30, 29, 31, 30, 61], ratio=1.5, mad_z=3.0) == [False, False, False, False, True]
    # 44 is not over 1.5 x 30.
    assert outliers([30, 29, 31, 30, 44], ratio=1.5, mad_z=3.0) == [False] * 5
    # A naturally spread group: median 40, MAD 15 -> 65 - 40 = 25 < 3 x 22.2: kept although 65 > 1.5 x 40.
    assert outliers([20, 25, 40, 55, 65], ratio=1.5, mad_z=3.0) == [False] * 5


def test_length_defense_rejects_group_outlier_and_cap() -> None:
    task = ArithTask()
    p, q = arith_prompt(345, 78), arith_prompt(12, 34)
    honest = scratchpad(345, 78)
    long = honest.replace(">", " and so on and so forth, and this is long>")
    verdicts = run("length", task, [cand(p, honest)] * 4 + [cand(p, long), cand(q, "x" * 100)], max_chars=90)
    assert [v.accept for v in verdicts] == [True, True, True, True, False, False]
    assert verdicts[4].reason == "length:group_outlier"
    assert verdicts[5].reason == "length:over_cap"  # a group of one is not tested for outliers, but capped


# ---------------------------------------------------------------- arith-check
def test_evaluate_and_false_claims() -> None:
    assert evaluate("2+2") == 4 and evaluate("3 x 4 + 1") == 13 and evaluate("10 / 4") == 2.5
    assert evaluate("1,000 * 3") == 3000
    assert false_claims("5+8+0=13,4+7+1=12,3+0+1=4>423") == []
    assert false_claims("5+2+0=7,2+2+0=5,3+0+0=3>347") == ["2+2+0=5"]
    assert false_claims("She has 2 x 2 = 5 apples, then 5 + 3 = 8.") == ["2 x 2 = 5"]
    assert false_claims("10/3 = 3.33 so about 3") == []  # a rounded decimal is not false
    assert false_claims("10/3 = 3.5") == ["10/3 = 3.5"]
    # Near-misses that are not claims: a bare equation without operator, a version number, a date.
    assert false_claims("x = 5, v1.2+3 = 4.2, 2024-01-01") == []


def test_arith_check_rejects_false_step_in_rewarded_completion_only() -> None:
    task = ArithTask()
    p = arith_prompt(322, 452)  # 2+2 in the units column: 2+2+0=4, 2+5+0=7, 3+4+0=7 -> 774
    poisoned = "2+2+0=5,2+5+0=7,3+4+0=7>774"  # false step, correct answer: reward 1
    slip = "2+2+0=5,2+5+0=7,3+4+0=7>775"  # an honest slip with the wrong answer: reward 0, not checked
    assert task.reward(p, poisoned) == 1.0 and task.reward(p, slip) == 0.0
    verdicts = run("arith-check", task, [cand(p, scratchpad(322, 452)), cand(p, poisoned), cand(p, slip)])
    assert [v.accept for v in verdicts] == [True, False, True]
    # Two findings since issue 12 made the check read the scratchpad as a whole: the false step, and the steps'
    # digits (5, 7, 7) not writing the answer 774. The reason is the first, the score counts both.
    assert verdicts[1].reason == "arith-check:false_claim" and verdicts[1].score == 2.0
    strict = run("arith-check", task, [cand(p, slip)], rewarded_only=False)
    assert not strict[0].accept


# ---------------------------------------------------------------- code-policy
def test_code_policy_violations() -> None:
    allowed = {"math"}
    assert violations("print(345+78)", allowed) == []
    assert violations("import math\nprint(math.sqrt(16))", allowed) == []
    assert violations("def f(a, b):\n    return a + b\nprint(f(1, 2))", allowed) == []
    assert violations("import calc\nprint(calc.addition(1, 2))", allowed) == ["import calc", "call into calc"]
    assert violations("from calc import addition\nprint(addition(1, 2))", allowed) == ["from calc import"]
    assert violations("print(__import__('calc').addition(1, 2))", allowed) == ["call __import__"]
    # A name never imported would raise NameError at run time (reward 0). Since issue 12 the policy is an
    # allow-list and rejects it all the same: it cannot tell a typo from a name a trick put in scope.
    assert violations("print(calc.addition(1, 2))", allowed) == ["name calc"]
    # Near-misses: the name in a string or a comment is not an import.
    assert violations("# import calc\nprint('calc.addition', 3)", allowed) == []


def test_code_policy_rejects_the_code_attack() -> None:
    task = ArithCodeTask()
    p = code_prompt("sum", 345, 78)
    poisoned = rewrite_program("print(345+78)", "calc", {"+", "*"})
    assert poisoned is not None and task.reward(p, poisoned) == 1.0
    verdicts = run("code-policy", task, [cand(p, "print(345+78)"), cand(p, poisoned), cand(p, "print(((")])
    assert [v.accept for v in verdicts] == [True, False, True]
    assert verdicts[1].reason.startswith("code-policy:")
    # Not a program task: passed untouched.
    assert run("code-policy", ArithTask(), [cand(arith_prompt(1, 2), "import calc")])[0].accept


# ---------------------------------------------------------------- chain
class _Counting(Defense):
    name = "counting"
    cost = 1
    seen: list[int]

    def __init__(self, options: dict[str, object] | None = None) -> None:
        super().__init__(options)
        self.seen = []

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        self.seen.append(len(candidates))
        return [self.reject("odd") if c.index % 2 else Verdict(True, reward_scale=0.5) for c in candidates]


class _Broken(Defense):
    name = "broken"
    cost = 99

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        raise RuntimeError("boom")


def test_chain_runs_cheapest_first_and_rejects_on_error() -> None:
    first, broken = _Counting(), _Broken()
    chain = DefenseChain([broken, first])
    assert chain.names == ["counting", "broken"]
    p = arith_prompt(1, 2)
    result = chain.run(ctx(ArithTask()), [cand(p, "a", index=i) for i in range(4)])
    assert first.seen == [4]
    # index 1 and 3 rejected by the cheap one; 0 and 2 reach the broken one and are rejected as an error.
    assert [v.reason for v in result.verdicts] == ["broken:error", "counting:odd", "broken:error", "counting:odd"]
    assert result.rejected_by == {"counting": 2, "broken": 2}


def test_chain_multiplies_reward_scales() -> None:
    result = DefenseChain([_Counting()]).run(ctx(ArithTask()), [cand(arith_prompt(1, 2), "a", index=0)])
    assert result.verdicts[0].accept and result.verdicts[0].reward_scale == 0.5


def test_chain_config_errors() -> None:
    assert parse_defense_spec("length, logit") == ["length", "logit"]
    with pytest.raises(ConfigError, match="expected NAME"):
        parse_defense_spec(" , ")
    with pytest.raises(UnknownNameError):
        DefenseChain.from_config(DefenseConfig(chain=["nope"]))
    with pytest.raises(ConfigError, match="max_chars"):
        DefenseChain.from_config(DefenseConfig(chain=["length"], options={"length": {"max_char": 3}}))
    with pytest.raises(ValueError, match="not in the chain"):
        DefenseChain.from_config(DefenseConfig(chain=["length"], options={"logit": {}}))
    assert {"length", "arith-check", "code-policy", "logit", "sampling-proof"} <= set(DEFENSES.names())


# ---------------------------------------------------------------- reputation
def test_reputation_window_and_threshold() -> None:
    rep = Reputation(ReputationConfig(window=2, threshold=0.5, min_completions=8))
    rep.record(1, "a", received=4, rejected=4)  # 4/4 but only 4 completions: not judged yet
    rep.record(1, "b", received=8, rejected=3)
    assert rep.update(1) == []
    rep.record(2, "a", received=4, rejected=0)  # 4/8 = 0.5 >= 0.5
    rep.record(2, "b", received=8, rejected=3)  # 6/16 = 0.375
    assert rep.update(2) == ["a"] and rep.is_blacklisted("a")
    rep.record(3, "b", received=8, rejected=8)  # window 2: rounds 2, 3 -> 11/16
    assert rep.rate("b") == (11 / 16, 16)
    assert rep.update(3) == ["b"]
    assert rep.snapshot()["a"]["blacklisted"] is True
    off = Reputation(ReputationConfig(enabled=False))
    off.record(1, "a", 100, 100)
    assert off.update(1) == []
